"""The one launcher of ``confide`` processes on this machine (federations, deployments, clusters).

Every local setup starts the same kind of child: ``python -m confide <command> ...`` with its
output in ``<logs>/<name>.log``, waits until it has written its port file (the child binds port
0 and reports the port it got), and stops it with SIGTERM, then SIGKILL. A child that exits
before its port file appears fails the start with the tail of its log, so the reason reaches
whoever started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from confide.errors import ConfideError, ServerStartError

__all__ = ["Processes"]


class Processes:
    """Named child processes with their logs under ``logs``.

    ``new_session``: each child leads its own process group, so :meth:`kill_all` also reaches
    what it started (agents start party processes).
    """

    def __init__(
        self, logs: str | os.PathLike, *, env: dict[str, str] | None = None, new_session: bool = False
    ) -> None:
        self.logs = Path(logs)
        self.env = env if env is not None else {}
        self.new_session = new_session
        self.children: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``confide <args>`` as ``name`` (appending to its log); ``env`` adds variables."""
        self.logs.mkdir(parents=True, exist_ok=True)
        # One metrics listener a process: the launcher's CONFIDE_METRICS is its own, never its children's.
        inherited = {k: v for k, v in os.environ.items() if k != "CONFIDE_METRICS"}
        environment = {**inherited, "PYTHONUNBUFFERED": "1", **self.env, **(env or {})}
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "confide", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=self.new_session,
            )
        self.children[name] = process
        return process

    def wait_port(self, name: str, port_file: Path, timeout_s: float = 60.0) -> int:
        """The port ``name`` wrote to ``port_file``; fails with its log if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        process = self.children[name]
        while not port_file.exists() or not port_file.read_text().strip():
            if process.poll() is not None:
                raise ServerStartError(f"{name} exited with code {process.returncode}:\n{self.tail(name)}")
            if time.monotonic() > deadline:
                raise ConfideError(f"{name} did not start within {timeout_s:g} s:\n{self.tail(name)}")
            time.sleep(0.05)
        return int(port_file.read_text().strip())

    def tail(self, name: str, lines: int = 15) -> str:
        """The last lines of ``name``'s log."""
        path = self.logs / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def exited(self) -> dict[str, int]:
        """Children that have exited, with their codes."""
        return {name: p.returncode for name, p in self.children.items() if p.poll() is not None}

    def kill(self, name: str) -> None:
        """SIGKILL one child at once (fault injection: a crashed machine says no goodbye)."""
        process = self.children.get(name)
        if process is not None and process.poll() is None:
            self._signal(process, signal.SIGKILL)
            process.wait()

    def kill_all(self) -> None:
        """SIGKILL every child (and its group, with ``new_session``)."""
        for process in self.children.values():
            if process.poll() is None:
                self._signal(process, signal.SIGKILL)
        for process in self.children.values():
            process.wait()

    def stop(self, names: list[str] | None = None, grace_s: float = 10.0) -> None:
        """SIGTERM the children (all, or ``names``), then SIGKILL what is still running after ``grace_s``."""
        chosen = [p for n, p in self.children.items() if names is None or n in names]
        for process in chosen:
            if process.poll() is None:
                self._signal(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in chosen:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(process, signal.SIGKILL)
                process.wait()

    def _signal(self, process: subprocess.Popen, sig: int) -> None:
        try:
            if self.new_session:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
        except ProcessLookupError:
            pass
