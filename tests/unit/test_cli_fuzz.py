"""Every flag of every ``confide`` command, given bad values: a message and a non-zero status, never a traceback.

The commands are found by walking the argument parser, so a command added later is fuzzed too.
Each call runs in-process (fast) from an empty working directory, with no controller reachable.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import signal

import pytest

from confide.cli.main import _parser, main

BAD_VALUES = [
    "",
    "x",
    "-1",
    "0",
    "1e309",
    "nan",
    "missing/dir/file.yaml",  # relative: the working directory is a fresh tmp_path
    "127.0.0.1:8443",
    "https://",
    "hospital-a=",
    "a" * 300,
    "h\u00e9llo w\u00f6rld",
    "{}",
]


def _leaves(parser: argparse.ArgumentParser, prefix: list[str]):
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield prefix, parser
        return
    for name, child in subparsers[0].choices.items():
        yield from _leaves(child, [*prefix, name])


def _commands():
    return [(" ".join(path), parser) for path, parser in _leaves(_parser(), [])]


def _argv(parser: argparse.ArgumentParser, target: argparse.Action | None, value: str) -> list[str]:
    argv: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in ("verbose", "help"):
            continue
        is_target = action is target
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            continue
        if action.option_strings:
            if is_target or action.required:
                text = value if is_target else "missing/required"
                if action.choices and not is_target:
                    text = sorted(action.choices)[0]
                argv += [action.option_strings[0], text]
        else:
            argv.append(value if is_target else "missing/positional")
    return argv


class _Hung(Exception):
    pass


def _call(argv: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()

    def hung(*_):
        raise _Hung(argv)

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse's own usage errors
                code = exit_.code if isinstance(exit_.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, err.getvalue()


COMMANDS = _commands()


def test_every_command_is_found():
    names = [name for name, _ in COMMANDS]
    assert {"certs sign", "model predict", "grant revoke", "job submit", "data uses", "party", "run"} <= set(names)


# The console commands take 7-13 s each here (measured with --durations; argon2id hashing among it).
_CASES = [
    pytest.param(name, parser, id=name, marks=[pytest.mark.slow] if name.startswith("console ") else [])
    for name, parser in COMMANDS
]


@pytest.mark.parametrize("command,parser", _CASES)
def test_bad_values_get_a_message_not_a_traceback(command, parser, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for variable in ("CONFIDE_CONTROLLER", "CONFIDE_CERTS", "CONFIDE_IDENTITY"):
        monkeypatch.delenv(variable, raising=False)
    targets = [
        a
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._StoreTrueAction, argparse._StoreFalseAction))
        and a.dest != "verbose"
    ]
    assert targets or command in (
        "data list",
        "data parties",
        "data uses",
        "grant list",
        "job list",
        "audit",
        "container health",
    )
    failures = 0
    for target in targets or [None]:
        for value in BAD_VALUES:
            argv = [*command.split(), *_argv(parser, target, value)]
            code, stderr = _call(argv)
            assert "Traceback" not in stderr, f"confide {' '.join(argv)}:\n{stderr}"
            # Some values are valid for some flags (a name "x", a port "0"): those may succeed.
            assert code in (0, 1, 2), f"confide {' '.join(argv)} exited {code}:\n{stderr}"
            if code:
                assert stderr.strip(), f"confide {' '.join(argv)} failed silently"
                failures += 1
    assert failures, f"confide {command}: no bad value was refused"
