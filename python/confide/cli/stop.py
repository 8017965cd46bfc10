"""Pid files for the long-running commands, and ``confide stop`` to end what they name.

``confide controller|aggregator|agent --pid-file PATH`` writes its process id there once it starts
and removes the file when it exits. ``confide stop PATH...`` (a pid file, or a folder whose
``*.pid`` files it reads) asks each process to stop with SIGTERM, the way the services stop
cleanly, waits for it, and removes the file. A pid file whose process is gone, or whose process
is not a ``confide`` command (the number was reused), is only removed: nothing else is signalled.
"""

from __future__ import annotations

import atexit
import os
import signal
import time
from pathlib import Path

from confide.errors import InvalidParameterError, MissingFileError

__all__ = ["add_commands", "add_pid_file_option", "stop", "write_pid_file"]


def add_pid_file_option(parser) -> None:
    """``--pid-file`` on a long-running command."""
    parser.add_argument(
        "--pid-file", default=None, help="write this process's id here while it runs (confide stop reads it)"
    )


def add_commands(commands) -> None:
    """Register ``confide stop`` on the top-level subparsers."""
    parser = commands.add_parser("stop", help="stop the services a local deployment started with --pid-file")
    parser.add_argument("paths", nargs="+", help="pid files, or folders whose *.pid files to read")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for each process to exit")


def write_pid_file(path: str | os.PathLike[str]) -> None:
    """Write this process's id to ``path`` now, and remove the file at exit (if it is still ours)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mine = f"{os.getpid()}\n"
    target.write_text(mine)

    def remove() -> None:
        try:
            if target.read_text() == mine:
                target.unlink()
        except OSError:
            pass

    atexit.register(remove)


def _is_confide(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"confide") or part == b"confide" for part in command)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = Path(f"/proc/{pid}/stat")
    try:
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except (OSError, IndexError):
        return True


def stop(paths: list[str], timeout: float = 20.0) -> list[str]:
    """Stop the processes the pid files at ``paths`` name; returns one line per file."""
    if not timeout > 0:
        raise InvalidParameterError(f"--timeout must be > 0 seconds, got {timeout}")
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files += sorted(path.glob("*.pid"))
        elif path.exists():
            files.append(path)
        else:
            raise MissingFileError(f"{path} does not exist (a pid file written by --pid-file, or a folder of them)")
    lines = []
    for file in files:
        try:
            pid = int(file.read_text().strip())
        except ValueError:
            raise InvalidParameterError(f"{file} does not hold a process id") from None
        if not _alive(pid):
            file.unlink(missing_ok=True)
            lines.append(f"{file}: process {pid} was not running (file removed)")
            continue
        if not _is_confide(pid):
            file.unlink(missing_ok=True)
            lines.append(f"{file}: process {pid} is not a confide command (file removed, nothing signalled)")
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            lines.append(f"{file}: process {pid} still running after {timeout:g} s (SIGTERM sent)")
            continue
        file.unlink(missing_ok=True)
        lines.append(f"{file}: stopped process {pid}")
    return lines
