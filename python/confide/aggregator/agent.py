"""The aggregator's agent worker: session configurations applied to the running aggregation core.

With ``confide aggregator --controller URL`` the aggregator registers its address as a service
and follows the controller like a party does (:class:`confide.agent.Agent`). A run
of a session configures the core for the run's job id (its round timeout and dropout grace);
at every checkpoint interval the aggregator writes its own checkpoint,
``<state>/sessions/<token>/checkpoints/round-NNNNNN/aggregator.json``: the run, the round, its
participants and the SHA-256 of the combined slices it delivered, so the session's Merkle root
also binds what the aggregator handed out in that round.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path

from confide import checkpoints as ckpt
from confide.agent import RunState, runtime_job_id
from confide.aggregator.core import AggregatorCore
from confide.v1 import runtime_pb2 as pb

__all__ = ["AggregatorWorker"]

log = logging.getLogger("confide.agent")


class AggregatorWorker:
    """Applies session runs to an :class:`AggregatorCore` and checkpoints completed rounds."""

    def __init__(self, core: AggregatorCore) -> None:
        self.core = core
        self._runs: dict[str, dict] = {}
        self._lock = threading.Lock()
        core.completion_listeners.append(self._completed)

    def start(self, session: str, run: int, config: dict, resume_round: int, directory: Path, joining=()) -> None:
        """Configure the core for run ``run`` of ``session``."""
        job = runtime_job_id(config["job_id"], run)
        self.core.configure_job(
            job, round_timeout_s=config["round_timeout_s"], dropout_grace_s=config["dropout_grace_s"]
        )
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / "current-run"
        adopted = marker.exists() and marker.read_text().strip() == str(run)
        if not adopted:
            # A new run: checkpoints after its resume point belong to an abandoned one. (A restarted
            # aggregator adopting the run it served before keeps that run's checkpoints.)
            ckpt.drop_after(directory / "checkpoints", resume_round)
            marker.write_text(str(run))
        with self._lock:
            self._runs[session] = {
                "run": run,
                "job": job,
                "config": config,
                "directory": directory,
                "round": resume_round,
            }
        log.info("session %s: aggregating run %d as job %s", session, run, job)

    def stop(self, session: str, reason: str | None = None, state: str | None = None) -> None:
        """Forget the session's run (its rounds simply stop arriving); ``reason`` is not needed here."""
        with self._lock:
            self._runs.pop(session, None)

    def state(self, session: str) -> RunState | None:
        """The run and the last round this aggregator completed for it."""
        with self._lock:
            run = self._runs.get(session)
            if run is None:
                return None
            return RunState(run=run["run"], status="running", round=run["round"], error="")

    def _completed(self, header: pb.RoundHeader, done: Mapping[int, bytes]) -> None:
        with self._lock:
            match = [(s, r) for s, r in self._runs.items() if r["job"] == header.job_id]
            if not match:
                return
            session, run = match[0]
            run["round"] = max(run["round"], header.round)
        config = run["config"]
        interval = config.get("checkpoint_interval", 0)
        if not interval or (header.round % interval and header.round != config.get("rounds")):
            return
        digest = hashlib.sha256()
        for index in sorted(done):
            digest.update(index.to_bytes(8, "big"))
            digest.update(hashlib.sha256(done[index]).digest())
        record = {
            "session": session,
            "job_id": header.job_id,
            "run": run["run"],
            "round": header.round,
            "attempt": header.attempt,
            "participants": list(header.participants),
            "slices": len(done),
            "result_sha256": digest.hexdigest(),
        }
        target = run["directory"] / "checkpoints" / ckpt.round_name(header.round)
        if target.exists():
            shutil.rmtree(target)
        ckpt.write_checkpoint(target, {"aggregator.json": json.dumps(record, sort_keys=True).encode()})
        log.info("session %s: checkpoint of round %d written", session, header.round)
