"""The controller's side on a party or aggregator machine: sync, apply deltas, run what it says.

An agent registers with the controller (publishing a party's dataset metadata), then every
``interval_s`` calls ``/v1/agent/sync`` with one report per session and receives instructions:

* a **delta** against the configuration it last applied (``base_seq``), applied and checked
  against the digest the controller computed; on a mismatch the agent forgets its copy and
  the controller sends the whole configuration next time;
* a **command** for the session's current run: ``run`` (start run N, after round R),
  ``verify`` (report the hashes of round R's checkpoint files), ``stop``, or ``none``.

What a run *is* belongs to a :class:`Worker`: the party worker starts a ``confide party``
process, the aggregator worker configures its aggregation core. The agent also reports each
new checkpoint directory (``<session>/checkpoints/round-NNNNNN``) with its file hashes, from
which the controller builds the Merkle root recorded in the session log.

Configurations live under ``<workdir>/sessions/<token>/config.json`` (atomic replace), so an
agent restarted after a crash continues from what it had applied.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol

from confide import checkpoints as ckpt
from confide import metrics
from confide.agent.client import ControllerClient
from confide.agent.config import apply_delta, config_digest
from confide.errors import (
    CertificateError,
    CertificateRevokedError,
    ConfideError,
    InvalidParameterError,
    TransportUnavailableError,
)

__all__ = ["METRICS_PER_REPORT", "Agent", "RunState", "Worker", "runtime_job_id"]

log = logging.getLogger("confide.agent")


def runtime_job_id(job_id: str, run: int) -> str:
    """The job id a session's run uses at the aggregator: every run gets fresh rounds and keys."""
    return f"{job_id}.r{run}"


#: Rounds of metrics one heartbeat carries at most (the controller takes up to MAX_METRIC_ROWS).
METRICS_PER_REPORT = 1_000


class RunState(dict):
    """What a worker reports about one session's run: run, status, round, error, result."""


class Worker(Protocol):
    """Role-specific part of an agent."""

    def start(
        self, session: str, run: int, config: dict, resume_round: int, directory: Path, joining: list[str]
    ) -> None:
        """Start (or adopt) run ``run`` of ``session`` with ``config``, after ``resume_round``.

        ``joining``: parties of this run that hold no checkpoint (added by tuning).
        """

    def stop(self, session: str, reason: str | None = None, state: str | None = None) -> None:
        """Stop whatever runs for ``session``.

        ``reason`` (the controller's message) asks for a graceful stop; ``state`` is the session's
        state that caused it (``revoked``, ``cancelled``, ``failed``...).
        """

    def state(self, session: str) -> RunState | None:
        """The current run's state (None if nothing was started)."""


class Agent:
    """Sync loop for one identity (party or aggregator)."""

    def __init__(
        self,
        client: ControllerClient,
        worker: Worker,
        workdir: str | os.PathLike,
        *,
        address: str | None = None,
        datasets: list[dict] | None = None,
        interval_s: float = 1.0,
        alive_file: str | os.PathLike | None = None,
    ) -> None:
        self.client = client
        # Touched after every sync the controller answered: a container's health check reads its age.
        self.alive_file = Path(alive_file) if alive_file is not None else None
        self.worker = worker
        self.workdir = Path(workdir)
        self.address = address
        self.datasets = datasets or []
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._registered = False
        # The newest checkpoint round the controller acknowledged, per session; and the mark of
        # the report in flight (a sync that fails leaves them to be sent again, like metrics).
        self._reported_checkpoints: dict[str, int] = {}
        self._checkpoint_marks: dict[str, int] = {}
        self._verification: dict[str, list] = {}
        self._runs: dict[str, int] = {}
        # The last round whose metrics the controller acknowledged, per (session, run); and the
        # marks of the report in flight (acknowledged once its sync succeeds).
        self._metrics_sent: dict[tuple[str, int], int] = {}
        self._metrics_marks: dict[tuple[str, int], int] = {}
        # What the controller last acknowledged of values sent only when they change (the
        # protection report, a shared log tail), per (session, run, key); and those in flight.
        self._unchanged_sent: dict[tuple[str, int, str], Any] = {}
        self._unchanged_marks: dict[tuple[str, int, str], Any] = {}

    # ------------------------------------------------------------------ local state

    def session_dir(self, session: str) -> Path:
        """Where a session's configuration, runs and checkpoints live."""
        return self.workdir / "sessions" / session

    def checkpoint_dir(self, session: str) -> Path:
        """A session's checkpoint directories."""
        return self.session_dir(session) / "checkpoints"

    def _load(self, session: str) -> dict:
        path = self.session_dir(session) / "config.json"
        if not path.exists():
            return {"seq": 0, "config": None}
        return json.loads(path.read_text())

    def _save(self, session: str, seq: int, config: dict | None) -> None:
        directory = self.session_dir(session)
        directory.mkdir(parents=True, exist_ok=True)
        temporary = directory / "config.json.tmp"
        temporary.write_text(json.dumps({"seq": seq, "config": config}, sort_keys=True))
        os.replace(temporary, directory / "config.json")

    def sessions(self) -> list[str]:
        """Sessions this agent holds configurations for."""
        root = self.workdir / "sessions"
        return sorted(p.name for p in root.iterdir() if (p / "config.json").exists()) if root.exists() else []

    # ------------------------------------------------------------------ loop

    def register(self) -> None:
        """Register (again) with the controller."""
        self.client.register(address=self.address, datasets=self.datasets)
        self._registered = True

    def stop(self) -> None:
        """End :meth:`run_forever` after the current step."""
        self._stopped.set()

    def run_forever(self) -> None:
        """Sync until stopped; a controller that is away is retried, never fatal."""
        while not self._stopped.is_set():
            try:
                if not self._registered:
                    self.register()
                self.step()
            except TransportUnavailableError as error:
                log.debug("controller unavailable: %s", error)
                self._registered = False
            except (CertificateError, CertificateRevokedError):
                raise  # retrying with this identity cannot succeed: the operator must act
            except ConfideError as error:
                log.warning("sync failed: %s", error)
                if "not registered" in str(error):
                    self._registered = False
            self._stopped.wait(self.interval_s)

    def step(self) -> dict:
        """One sync: report, receive, act. Returns the controller's answer."""
        reports = self._reports()
        try:
            answer = self.client.sync(reports)
        except ConfideError:
            metrics.HEARTBEATS.labels("agent", "failed").inc()
            raise
        metrics.HEARTBEATS.labels("agent", "sent").inc()
        if self.alive_file is not None:
            self.alive_file.touch()
        for report in reports:
            for row in report.get("metrics") or []:
                _observe_round(row)  # each round's row goes out once: counted once
        self._metrics_sent.update(self._metrics_marks)
        self._unchanged_sent.update(self._unchanged_marks)
        self._reported_checkpoints.update(self._checkpoint_marks)
        for instruction in answer.get("instructions", []):
            try:
                self._follow(instruction)
            except ConfideError as error:
                log.error("session %s: %s", instruction.get("session"), error)
        return answer

    def _reports(self) -> list[dict]:
        reports = []
        self._metrics_marks = {}
        self._unchanged_marks = {}
        self._checkpoint_marks = {}
        for session in self.sessions():
            stored = self._load(session)
            report: dict[str, Any] = {"session": session, "applied_seq": stored["seq"]}
            if session in self._verification:
                # A resume is being verified: report the hashes for the new run, nothing of the old one.
                report["run"] = self._runs.get(session)
                report["status"] = "verified"
                report["verification"] = self._verification[session]
            else:
                state = self.worker.state(session)
                if state is not None:
                    report.update(state)
                    self._only_new_metrics(session, report)
                    for key in ("protection", "log_tail"):
                        self._only_if_changed(session, key, report)
            checkpoints = self._new_checkpoints(session)
            if checkpoints:
                report["checkpoints"] = checkpoints
            reports.append(report)
        return reports

    def _only_new_metrics(self, session: str, report: dict) -> None:
        # Each round's metrics travel once per run (a restarted agent sends them again; the
        # controller keeps one row per round).
        rows = report.pop("metrics", None) or []
        key = (session, report.get("run"))
        sent = self._metrics_sent.get(key, -1)
        # Oldest first, a bounded number per heartbeat (a restarted agent of a long job catches up).
        fresh = [row for row in rows if row["round"] > sent][:METRICS_PER_REPORT]
        if fresh:
            report["metrics"] = fresh
            self._metrics_marks[key] = fresh[-1]["round"]

    def _only_if_changed(self, session: str, key: str, report: dict) -> None:
        if key not in report:
            return
        mark = (session, report.get("run"), key)
        if self._unchanged_sent.get(mark) == report[key]:
            del report[key]
        else:
            self._unchanged_marks[mark] = report[key]

    def _new_checkpoints(self, session: str) -> list[dict]:
        # Every checkpoint written since the last report, oldest first (a fast job writes
        # several between two syncs; each gets its own entry in the session log).
        directory = self.checkpoint_dir(session)
        if not directory.exists():
            return []
        reported = self._reported_checkpoints.get(session, 0)
        found = []
        for path in directory.iterdir():
            number = ckpt.round_of(path)
            if path.is_dir() and number is not None and number > reported:
                found.append((number, path))
        out = [
            {"round": number, "files": ckpt.manifest(path, prefix=f"{path.name}/")} for number, path in sorted(found)
        ]
        if out:
            self._checkpoint_marks[session] = out[-1]["round"]  # acknowledged once the sync succeeds
        return out

    def _follow(self, instruction: dict) -> None:
        session = instruction["session"]
        if not isinstance(session, str) or "/" in session or session in ("", ".", ".."):
            raise InvalidParameterError(f"session token {session!r} is not usable as a directory name")
        stored = self._load(session)
        seq, config = stored["seq"], stored["config"]
        if "delta" in instruction:
            base = instruction.get("base_seq", 0)
            if base != seq:
                config = None if base == 0 else config
                if base != 0:
                    log.warning("session %s: delta against entry %s but entry %s is applied", session, base, seq)
                    self._save(session, 0, None)
                    return
            candidate = apply_delta(config, instruction["delta"])
            if candidate is None or config_digest(candidate) != instruction.get("config_sha256"):
                log.warning("session %s: delta did not reproduce the controller's digest; asking for all", session)
                self._save(session, 0, None)
                return
            config, seq = candidate, instruction["seq"]
            self._save(session, seq, config)
            log.info("session %s: applied entry %d (%d changes)", session, seq, len(instruction["delta"]))
        elif config is not None and config_digest(config) == instruction.get("config_sha256"):
            if seq != instruction["seq"]:
                seq = instruction["seq"]
                self._save(session, seq, config)
        command = instruction.get("command")
        run = instruction.get("run", 0)
        if command == "stop":
            self.worker.stop(
                session, instruction.get("reason") or "stopped by the controller", instruction.get("state")
            )
            return
        if config is None or config_digest(config) != instruction.get("config_sha256"):
            return  # the configuration arrives with the next sync
        resume_round = instruction.get("resume_round", 0)
        if command == "verify":
            self.worker.stop(session)
            self._runs[session] = run
            directory = self.checkpoint_dir(session) / ckpt.round_name(resume_round)
            self._verification[session] = (
                ckpt.manifest(directory, prefix=f"{directory.name}/") if directory.exists() else []
            )
        elif command == "run":
            self._verification.pop(session, None)
            state = self.worker.state(session)
            if state is not None and state.get("run") == run:
                return  # already started (or finished) this run
            self._runs[session] = run
            # The resume point was recorded already; report only checkpoints this run writes.
            self._reported_checkpoints[session] = resume_round
            joining = instruction.get("joining") or []
            self.worker.start(session, run, config, resume_round, self.session_dir(session), joining)


def _observe_round(row: dict) -> None:
    """A session's round, as its party reported it, in this agent's metrics (the party is its child)."""
    metrics.ROUNDS.labels("party", "completed").inc()
    for phase, key in (("round", "seconds"), ("train", "train_s"), ("crypto", "crypto_s")):
        if isinstance(row.get(key), (int, float)):
            metrics.ROUND_SECONDS.labels("party", phase).observe(row[key])
    for direction in ("sent", "received"):
        if isinstance(row.get(f"bytes_{direction}"), (int, float)):
            metrics.BYTES.labels("party", direction).inc(row[f"bytes_{direction}"])
