"""A party's agent: the controller's hands on the party's machine, holding the data catalog.

``confide agent`` registers the party and its datasets' metadata (from the catalog; never
rows), then follows the controller (:class:`confide.controller.agent.Agent`). A run is a
``confide party`` child process working in ``<workdir>/sessions/<token>/run-N/`` and writing
checkpoints to ``<workdir>/sessions/<token>/checkpoints/``. Children die with the agent
(``PR_SET_PDEATHSIG``), so a killed agent never leaves a run behind that the controller does
not know about; the restarted agent reports that run as gone, and the session is resumed from
its last checkpoint.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from confide.controller.agent import RunState
from confide.reports import PartyReport, PartyResult

__all__ = ["PartyWorker"]

log = logging.getLogger("confide.agent")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def runtime_job_id(job_id: str, run: int) -> str:
    """The job id a session's run uses at the aggregator: every run gets fresh rounds and keys."""
    return f"{job_id}.r{run}"


class PartyWorker:
    """Runs a session's rounds as a ``confide party`` child process."""

    def __init__(
        self,
        name: str,
        certs_dir: str | os.PathLike,
        catalog_path: str | os.PathLike | None,
        sessions_root: str | os.PathLike,
        extra_env=None,
    ) -> None:
        self.name = name
        self.sessions_root = Path(sessions_root)
        self.certs_dir = Path(certs_dir)
        self.catalog_path = Path(catalog_path) if catalog_path else None
        self.extra_env = dict(extra_env or {})
        self._processes: dict[str, tuple[int, subprocess.Popen, Path]] = {}
        self._lock = threading.Lock()

    def start(self, session: str, run: int, config: dict, resume_round: int, directory: Path, joining=()) -> None:
        """Start run ``run``: stop any other run of the session first."""
        self.stop(session)
        run_dir = directory / f"run-{run}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(config, sort_keys=True))
        (directory / "current-run").write_text(str(run))
        spec = config["spec"]
        command = [
            sys.executable,
            "-m",
            "confide",
            "party",
            "--config",
            str(run_dir / "config.json"),
            "--party",
            self.name,
            "--aggregator",
            config["routing"]["nodes"][0]["address"],
            "--certs",
            str(self.certs_dir),
            "--workdir",
            str(run_dir),
            "--checkpoints",
            str(directory / "checkpoints"),
            "--runtime-job-id",
            runtime_job_id(spec["job_id"], run),
            "--resume-round",
            str(resume_round),
        ]
        if self.catalog_path is not None:
            command += ["--datasets", str(self.catalog_path)]
        if joining and resume_round:
            command += ["--joining", ",".join(joining)]
        log_file = open(run_dir / "party.log", "ab")  # noqa: SIM115 - owned by the child
        env = {**os.environ, **self.extra_env}
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
        log_file.close()
        with self._lock:
            self._processes[session] = (run, process, run_dir)
        log.info("session %s: run %d started after round %d (pid %d)", session, run, resume_round, process.pid)

    def stop(self, session: str) -> None:
        """Terminate the session's child (SIGTERM, then SIGKILL)."""
        with self._lock:
            entry = self._processes.pop(session, None)
        if entry is None:
            return
        _, process, _ = entry
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop_all(self) -> None:
        """Stop every child (agent shutdown)."""
        for session in list(self._processes):
            self.stop(session)

    def state(self, session: str) -> RunState | None:
        """Run, status, round and error from the child's report (and its exit status)."""
        with self._lock:
            entry = self._processes.get(session)
        if entry is None:
            return self._orphan_state(session)
        run, process, run_dir = entry
        report = _read_report(run_dir / f"{self.name}.report.json")
        code = process.poll()
        status = report.get("status", "starting")
        state = RunState(run=run, status="running", round=_last_round(report), error="")
        if status == "completed":
            state["status"] = "completed"
            state["result"] = _result(report)
        elif status == "failed":
            state["status"], state["error"] = "failed", report.get("error", "failed")
        elif code is not None:
            state["status"], state["error"] = "failed", f"party process exited with code {code} before finishing"
        return state

    def _orphan_state(self, session: str) -> RunState | None:
        # After an agent restart: the run it had started died with it (unless it had finished).
        marker = self.sessions_root / session / "current-run"
        try:
            run = int(marker.read_text())
        except (OSError, ValueError):
            return None
        report = _read_report(self.sessions_root / session / f"run-{run}" / f"{self.name}.report.json")
        state = RunState(run=run, status="failed", round=_last_round(report), error="")
        if report.get("status") == "completed":
            state["status"], state["result"] = "completed", _result(report)
        else:
            state["error"] = f"the party process of run {run} is gone (its agent restarted); resume the session"
        return state


def _read_report(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _last_round(report: dict) -> int:
    rounds = report.get("rounds") or []
    return int(rounds[-1]["round"]) if rounds else int(report.get("resumed_after_round") or 0)


def _result(report: dict) -> dict:
    """The :class:`PartyResult` of a completed report (what the controller stores and serves)."""
    return PartyResult.of(PartyReport.model_validate(report)).model_dump(mode="json")
