"""A party's agent: the controller's hands on the party's machine, holding the data catalog.

``confide agent`` registers the party and its datasets' metadata (from the catalog; never
rows), then follows the controller (:class:`confide.agent.Agent`). A run is a
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

from confide.agent import RunState, runtime_job_id
from confide.reports import PartyReport, PartyResult, VerticalPartyReport, round_metrics
from confide.spec import VERTICAL_ALGORITHMS

__all__ = ["PartyWorker"]

log = logging.getLogger("confide.agent")
_PR_SET_PDEATHSIG = 1
#: Per session: the controller's reason to stop, which the party checks at every round boundary.
STOP_FILE = "stop.json"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class PartyWorker:
    """Runs a session's rounds as a ``confide party`` child process."""

    def __init__(
        self,
        name: str,
        certs_dir: str | os.PathLike,
        catalog_path: str | os.PathLike | None,
        sessions_root: str | os.PathLike,
        extra_env=None,
        share_log_lines: int = 0,
        share_metrics_with_tracking: bool = False,
    ) -> None:
        self.name = name
        #: The last lines of each run's party.log shared with the controller (0: none; the
        #: party's choice, ``confide agent --share-log-lines``).
        self.share_log_lines = share_log_lines
        #: This party consents to its own per-round metrics going to a job's MLflow server.
        self.share_metrics_with_tracking = share_metrics_with_tracking
        self.sessions_root = Path(sessions_root)
        self.certs_dir = Path(certs_dir)
        self.catalog_path = Path(catalog_path) if catalog_path else None
        self.extra_env = dict(extra_env or {})
        self._processes: dict[str, tuple[int, subprocess.Popen, Path]] = {}
        #: Sessions told to stop, with the controller's reason (their child may still finish a round).
        self._stopping: dict[str, str] = {}
        self._lock = threading.Lock()
        #: Seconds a party told to stop may take to reach its round boundary before it is terminated.
        self.stop_grace_s = float(os.environ.get("CONFIDE_STOP_GRACE_S", "10"))

    def start(self, session: str, run: int, config: dict, resume_round: int, directory: Path, joining=()) -> None:
        """Start run ``run``: stop any other run of the session first."""
        self.stop(session)
        with self._lock:
            self._stopping.pop(session, None)
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
        trained = (spec.get("score") or {}).get("session")
        if trained:  # a scoring job: this site's part of the model is in the training session's folder
            command += ["--model-from", str(directory.parent / trained)]
        # The controller told us to run, having checked every grant again: a stop left by an
        # earlier revocation no longer applies to this run.
        stop_file = directory / STOP_FILE
        stop_file.unlink(missing_ok=True)
        command += ["--stop-file", str(stop_file)]
        log_file = open(run_dir / "party.log", "ab")  # noqa: SIM115 - owned by the child
        # The agent's CONFIDE_METRICS is its own listener: a session's process would collide with it.
        env = {**{k: v for k, v in os.environ.items() if k != "CONFIDE_METRICS"}, **self.extra_env}
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
        log_file.close()
        with self._lock:
            self._processes[session] = (run, process, run_dir)
        log.info("session %s: run %d started after round %d (pid %d)", session, run, resume_round, process.pid)

    def stop(self, session: str, reason: str | None = None, state: str | None = None) -> None:
        """Stop the session's child.

        Without a reason (a new run replaces it, or the agent shuts down): SIGTERM, then SIGKILL.
        With the controller's ``reason`` (and the session ``state`` behind it: revoked, cancelled,
        failed elsewhere): both go to the run's stop file, which the party checks at every round
        boundary, so it ends after the round in flight and trains no further one; a party still
        running after ``stop_grace_s`` (blocked on peers that stopped) is terminated.
        """
        with self._lock:
            entry = self._processes.get(session)
            if entry is None or reason is None:
                self._processes.pop(session, None)
        if entry is None:
            return
        run, process, run_dir = entry
        if reason is None:
            _terminate(process)
            return
        with self._lock:
            if session in self._stopping:
                return
            self._stopping[session] = reason
        stop_file = run_dir.parent / STOP_FILE
        temporary = stop_file.with_suffix(".tmp")
        temporary.write_text(json.dumps({"reason": reason[:2000], "run": run, "state": state}))
        os.replace(temporary, stop_file)

        def finish() -> None:
            try:
                process.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                _terminate(process)

        threading.Thread(target=finish, name=f"confide-stop-{session[:8]}", daemon=True).start()

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
        state = _state_of(run, report, code, self._stopping.get(session))
        if self.share_log_lines:
            state["log_tail"] = log_tail(run_dir / "party.log", self.share_log_lines)
        if self.share_metrics_with_tracking and isinstance(state.get("result"), dict):
            state["result"]["metrics_to_tracking"] = True  # the party's consent, with its final result
        return state

    def _orphan_state(self, session: str) -> RunState | None:
        # After an agent restart: the run it had started died with it (unless it had finished).
        marker = self.sessions_root / session / "current-run"
        try:
            run = int(marker.read_text())
        except (OSError, ValueError):
            return None
        report = _read_report(self.sessions_root / session / f"run-{run}" / f"{self.name}.report.json")
        if report.get("status") in ("completed", "failed", "stopped"):
            return _state_of(run, report, 0, None)  # it finished before the agent restarted
        state = RunState(run=run, status="failed", round=_last_round(report), error="")
        state["error"] = (
            f"the party process of run {run} ended with its agent (the agent restarted mid-run); resume the session"
        )
        return state


def _terminate(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _state_of(run: int, report: dict, code: int | None, stopping: str | None) -> RunState:
    """What the agent tells the controller about a run, from the party's report and exit status."""
    status = report.get("status", "starting")
    state = RunState(run=run, status="running", round=_last_round(report), error="")
    state["metrics"] = round_metrics(report)
    if isinstance(report.get("protection"), dict):
        state["protection"] = report["protection"]
    if report.get("failure"):
        state["failure"] = report["failure"]
    if status == "completed":
        try:
            state["status"], state["result"] = "completed", _result(report)
        except ValueError as error:  # pydantic's ValidationError: a report this version cannot read
            state["status"] = "failed"
            state["error"] = f"the party's report does not match the report schema: {str(error)[:500]}"
    elif status in ("failed", "stopped"):
        state["status"], state["error"] = status, report.get("error", status)
    elif code is not None and stopping is not None:
        state["status"], state["error"] = (
            "stopped",
            stopping if stopping.startswith("stopped") else f"stopped: {stopping}",
        )
    elif code is not None:
        state["status"], state["error"] = (
            "failed",
            (f"the party process exited with code {code} without a report; see party.log of the run at the party"),
        )
    return state


#: Bytes read from the end of a log for its tail, and the longest line shared.
LOG_TAIL_BYTES = 256 * 1024
LOG_LINE_CHARS = 500


def log_tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of ``path`` (each cut at :data:`LOG_LINE_CHARS`), or []."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line[:LOG_LINE_CHARS] for line in text.splitlines()[-lines:]]


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
    if report.get("algorithm") in VERTICAL_ALGORITHMS:
        return PartyResult.of_vertical(VerticalPartyReport.model_validate(report)).model_dump(mode="json")
    return PartyResult.of(PartyReport.model_validate(report)).model_dump(mode="json")
