"""The controller's the agents' side: heartbeats, reports applied, instructions computed.

One concern of :class:`confide.controller.service.Controller` (a mixin: its methods use the
controller's store, clock and caches set in ``Controller.__init__``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from confide import checkpoints
from confide.controller import sessions as cfg
from confide.controller.common import (
    _ANY_PARTICIPATION,
    _PARTICIPATIONS,
    _TOUCH,
    ACTIVE,
    CHECKPOINTS_KEPT,
    EXPIRY_SWEEP_S,
    MAX_LOG_LINE_CHARS,
    MAX_LOG_LINES,
    MAX_PROTECTION_BYTES,
    REPORTED_STATUSES,
    VERTICAL,
    Caller,
    _checked_failure,
    _failure_line,
    _light_changes,
    _merged_metrics,
    _require,
    log,
)
from confide.controller.store import (
    JobSession,
    Participant,
    SessionEntry,
)
from confide.errors import (
    InvalidParameterError,
    NotFoundError,
    PermissionDeniedError,
)


class AgentSync:
    """The agents' side: heartbeats, reports applied, instructions computed."""

    # ------------------------------------------------------------------ agents (parties and aggregators)

    def sync(self, caller: Caller, reports: list[dict]) -> dict:
        """Heartbeat + reports from an agent; returns its instructions (deltas and commands).

        Each report: ``{"session", "run", "applied_seq", "status", "round", "error", "result",
        "verification": [files] | None, "checkpoint": {"round", "files"} | None}``.

        The hot path of the controller (every agent, every second): a heartbeat that reports
        nothing new reads the caller's participations in one query and writes nothing (its
        ``last_seen_at`` at most every ``last_seen_write_s``), without reports in autocommit mode
        (no BEGIN/COMMIT; :meth:`sync_read_only` where nothing is due); a report that only moves
        the round is one guarded UPDATE; anything else (a status change, a checkpoint, metrics,
        ...) takes the session's row lock and the full path.
        """
        _require(caller, "party", "service")
        if not isinstance(reports, list) or len(reports) > 1000:
            raise InvalidParameterError("reports must be a list of at most 1000 session reports")
        self._sweep_if_due()
        now = self._now()
        clock = self._clock()
        touch = clock - self._seen_written.get(caller.name, -math.inf) >= self.last_seen_write_s
        # Without reports a heartbeat writes one row at most (last_seen_at) and reads the rest:
        # autocommit spares it the BEGIN and COMMIT round trips (the most frequent request).
        self._track_completed(committed=False)  # what a failed sync of this thread queued is void
        with self.store.autocommit() if not reports else self.store.transaction() as db:
            if touch and db.execute(_TOUCH, {"who": caller.name, "at": now}).rowcount != 1:
                raise NotFoundError(f"{caller.name!r} is not registered; register before syncing")
            rows = db.execute(_PARTICIPATIONS, {"who": caller.name}).all()
            current = {session.token: (participant, session) for participant, session in rows}
            for index, report in enumerate(reports):
                if not isinstance(report, dict) or not isinstance(report.get("session"), str):
                    raise InvalidParameterError(f"reports[{index}] must be a mapping with a 'session' token")
                known = current.get(report["session"])
                if known is None or not self._apply_light(db, *known, report):
                    self._apply_report(db, caller, index, report)
            instructions = self._instructions(db, rows)
        self._track_completed()  # sessions this sync completed, now committed
        # Only once committed: a heartbeat that failed stored nothing, so the next one writes.
        if touch:
            self._seen_written[caller.name] = clock
        self._heard[caller.name] = now
        return {"instructions": instructions}

    def sync_read_only(self, caller: Caller, reports: list[dict]) -> dict | None:
        """:meth:`sync`'s answer where the heartbeat writes nothing, on the store's reserved reader; else None.

        A heartbeat writes nothing when it has no reports, its ``last_seen_at`` is not due and no
        grant-expiry sweep is due: then it is one read, which the API runs on the event loop
        instead of a worker thread (the hop cost ~0.11 ms of CPU, besides the GIL hand-offs
        between the loop and the threads). Never waits for the connection pool: None (the caller runs :meth:`sync` in a
        thread) where the reserved connection is busy or failed.
        """
        _require(caller, "party", "service")
        if reports or self._now().timestamp() - self._last_sweep >= EXPIRY_SWEEP_S:
            return None
        if self._clock() - self._seen_written.get(caller.name, -math.inf) >= self.last_seen_write_s:
            return None
        now = self._now()
        try:
            with self.store.reader() as connection:
                if connection is None:
                    return None
                # Most agents take part in no session at a given time: a one-column Core query
                # costs a fraction of the ORM query of their participations (SQLAlchemy's ORM
                # spent ~0.25 ms of CPU on one that returned no rows).
                if connection.execute(_ANY_PARTICIPATION, {"who": caller.name}).first() is None:
                    instructions = []
                else:
                    with Session(bind=connection, expire_on_commit=False) as db:
                        rows = db.execute(_PARTICIPATIONS, {"who": caller.name}).all()
                        instructions = self._instructions(db, rows)
        except DBAPIError as error:
            # A read changes nothing, so sync() may do it again (on a pooled connection, pinged
            # after idling); the reserved connection is replaced on the next heartbeat.
            log.info("heartbeat read on the reserved connection failed (%s); retried in a thread", type(error).__name__)
            return None
        self._heard[caller.name] = now
        return {"instructions": instructions}

    def _instructions(self, db: Session, rows) -> list[dict]:
        instructions = []
        for participant, session in rows:
            instruction = self._instruction(db, participant, session)
            if instruction is not None:
                instructions.append(instruction)
        return instructions

    def _apply_light(self, db: Session, participant: Participant, session: JobSession, report: dict) -> bool:
        """Apply a report that changes nothing but the round, status ``running`` or the applied entry.

        Returns False where the report needs :meth:`_apply_report` (the session's row lock and
        the checks that follow a status change, a checkpoint, metrics, a verification...), and
        where the participant's row changed since it was read (a resume, say): that path re-reads.
        """
        changes = _light_changes(participant, session, report, self._now())
        if changes is None:
            return False
        if not changes:
            return True
        moved = db.execute(
            update(Participant)
            .where(
                Participant.id == participant.id,
                Participant.run == participant.run,
                Participant.status == participant.status,
                # Two heartbeats of one agent racing must not move the applied entry backwards.
                Participant.applied_seq == participant.applied_seq,
            )
            .values(**changes)
            .execution_options(synchronize_session=False)
        )
        if moved.rowcount != 1:
            return False
        for key, value in changes.items():
            set_committed_value(participant, key, value)
        return True

    def _apply_report(self, db: Session, caller: Caller, index: int, report: Any) -> None:
        if not isinstance(report, dict) or not isinstance(report.get("session"), str):
            raise InvalidParameterError(f"reports[{index}] must be a mapping with a 'session' token")
        # Row lock (PostgreSQL): reports about one session are applied one at a time, so the last
        # two recipients reporting a checkpoint at once cannot each miss the other's report.
        # (SQLite already admits one writer at a time.) populate_existing: the rows this heartbeat
        # read before the lock are read again under it.
        session = db.scalar(
            select(JobSession)
            .where(JobSession.token == report["session"])
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        if session is None:
            return  # a session this controller never had (or lost): ignore, the agent will stop it
        participant = db.scalar(
            select(Participant)
            .where(Participant.session_id == session.id, Participant.name == caller.name)
            .execution_options(populate_existing=True)
        )
        if participant is None:
            raise PermissionDeniedError(f"{caller.name!r} is not a participant of session {report['session']}")
        applied = report.get("applied_seq")
        if isinstance(applied, int) and 0 <= applied <= session.head_seq:
            participant.applied_seq = max(participant.applied_seq, applied)
        run = report.get("run")
        if run != session.run or participant.run != session.run:
            return  # about an earlier run, or from a recipient that is not a member of this one
        status = report.get("status")
        if status in REPORTED_STATUSES:
            participant.status = status
        if isinstance(report.get("round"), int):
            participant.round = report["round"]
        participant.error = str(report.get("error") or "")[:4000]
        participant.failure = _checked_failure(report.get("failure"))
        if isinstance(report.get("result"), dict):
            participant.result = report["result"]
        # What the console shows (metrics, protection report, shared log lines): a malformed or
        # oversized value is dropped with a warning, never failing the heartbeat it came with.
        if report.get("metrics") is not None:
            participant.metrics = _merged_metrics(participant.metrics or [], report["metrics"], run, caller.name)
        protection = report.get("protection")
        if isinstance(protection, dict) and protection != participant.protection:
            if len(json.dumps(protection)) <= MAX_PROTECTION_BYTES:
                participant.protection = protection
            else:
                log.warning("%s: a protection report over %d bytes, not kept", caller.name, MAX_PROTECTION_BYTES)
        tail = report.get("log_tail")
        if isinstance(tail, list):
            participant.log_tail = [str(line)[:MAX_LOG_LINE_CHARS] for line in tail[-MAX_LOG_LINES:]]
        participant.updated_at = self._now()
        if session.state == "verifying" and isinstance(report.get("verification"), list):
            participant.verification = {"run": run, "files": report["verification"]}
            self._maybe_verified(db, session)
        reported = report.get("checkpoints") or []
        if not isinstance(reported, list) or len(reported) > 10_000:
            raise InvalidParameterError(f"reports[{index}].checkpoints must be a list of at most 10000 checkpoints")
        for checkpoint in reported:
            # A fast job completes before a slower recipient's last checkpoints arrive: still recorded.
            if session.state not in ("running", "completed") or not isinstance(checkpoint, dict):
                continue
            if not isinstance(checkpoint.get("round"), int) or not isinstance(checkpoint.get("files"), list):
                raise InvalidParameterError(f"reports[{index}].checkpoints entries need an int round and a file list")
            stored = dict(participant.checkpoints)
            stored[str(checkpoint["round"])] = checkpoint["files"]
            for old in sorted(stored, key=int)[:-CHECKPOINTS_KEPT]:
                del stored[old]
            participant.checkpoints = stored
            self._maybe_checkpoint(db, session, checkpoint["round"])
        if session.state == "running":
            self._maybe_finished(db, session, caller)

    def _recipients(self, db: Session, session: JobSession) -> dict[str, Participant]:
        """The members of the session's current run (a party added by tuning joins at the next run)."""
        rows = db.scalars(
            select(Participant).where(Participant.session_id == session.id, Participant.run == session.run)
        )
        return {p.name: p for p in rows}

    def _maybe_checkpoint(self, db: Session, session: JobSession, round_number: int) -> None:
        recipients = self._recipients(db, session)
        if self._head(db, session).spec.get("model", {}).get("algorithm") in VERTICAL:
            # A vertical job's aggregator only relays: its parties hold the whole state.
            recipients = {name: p for name, p in recipients.items() if p.role == "party"}
        key = str(round_number)
        if not all(key in p.checkpoints for p in recipients.values()):
            return
        latest = self._latest_checkpoint(db, session)
        if (
            latest is not None
            and latest.checkpoint.get("run") == session.run
            and latest.checkpoint["round"] >= round_number
        ):
            return
        leaves = {name: p.checkpoints[key] for name, p in sorted(recipients.items())}
        record = {"round": round_number, "run": session.run, "root": checkpoints.root_of(leaves), "leaves": leaves}
        self._append_event(
            db,
            session,
            Caller("controller", "admin"),
            "checkpoint",
            note=f"checkpoint after round {round_number}: {sum(len(v) for v in leaves.values())} files",
            checkpoint=record,
        )

    def _maybe_verified(self, db: Session, session: JobSession) -> None:
        recipients = self._recipients(db, session)
        checkpoint = self._latest_checkpoint(db, session)
        if checkpoint is None:
            return
        leaves = checkpoint.checkpoint["leaves"]
        holders = sorted(name for name in leaves if name in recipients)
        if any(recipients[name].verification.get("run") != session.run for name in holders):
            return  # every owner of checkpoint files still in this run proves them first
        problems: list[str] = []
        # An owner no longer a recipient (removed by tuning) resumes nothing: its recorded files
        # stand for themselves in the root, and only the others' reports are checked.
        actual = {name: files for name, files in leaves.items() if name not in recipients}
        if not holders:
            problems.append(f"no recipient of run {session.run} holds a file of it (its owners: {', '.join(leaves)})")
        for name in holders:
            reported = recipients[name].verification.get("files", [])
            actual[name] = reported
            for problem in checkpoints.compare(leaves[name], reported):
                problems.append(f"{name}/{problem['name']}: {problem['problem']}")
        root = checkpoints.root_of(actual)
        if not problems and root != checkpoint.checkpoint["root"]:
            problems.append(
                f"Merkle root {root[:16]}... differs from the recorded {checkpoint.checkpoint['root'][:16]}..."
            )
        controller = Caller("controller", "admin")
        if problems:
            session.state = "refused"
            session.message = (
                f"resume refused: checkpoint of round {checkpoint.checkpoint['round']} does not match its recorded "
                f"Merkle root {checkpoint.checkpoint['root'][:16]}...: " + "; ".join(problems[:20])
            )
            self._audit(db, controller, "verify", f"session/{session.token}", "deny", {"problems": problems[:100]})
        else:
            session.state = "running"
            session.message = (
                f"run {session.run}: checkpoint of round {checkpoint.checkpoint['round']} verified "
                f"(root {checkpoint.checkpoint['root'][:16]}...)"
            )
            self._audit(db, controller, "verify", f"session/{session.token}", "allow", {"root": root})

    def _maybe_finished(self, db: Session, session: JobSession, caller: Caller) -> None:
        recipients = self._recipients(db, session)
        parties = [p for p in recipients.values() if p.role == "party"]
        failed = [p for p in parties if p.run == session.run and p.status == "failed"]
        if failed:
            session.state = "failed"
            session.message = "; ".join(_failure_line(p) for p in failed)[:4000]
            # In the log too, so 'confide session log' tells the whole story of the session.
            self._append_event(
                db,
                session,
                Caller("controller", "admin"),
                "failed",
                note=session.message,
            )
        elif parties and all(p.run == session.run and p.status == "completed" for p in parties):
            spec = self._head(db, session).spec
            last_round = spec["rounds"]
            if spec.get("model", {}).get("algorithm") in VERTICAL:
                # Early stopping (SecureBoost) may end a vertical job before its last round.
                last_round = min(last_round, max(p.round for p in parties)) or last_round
            latest = self._latest_checkpoint(db, session)
            final = latest is not None and latest.checkpoint["run"] == session.run
            if spec.get("checkpoint_interval") and not (final and latest.checkpoint["round"] == last_round):
                return  # completed once the last round's checkpoint is recorded (every recipient reported it)
            session.state = "completed"
            session.message = f"run {session.run} completed" + (
                f"; checkpoint of round {last_round} recorded" if spec.get("checkpoint_interval") else ""
            )
            if spec.get("tracking"):
                self._tracking_due(session.token)

    def _digest(self, db: Session, session: JobSession, name: str) -> str | None:
        """Digest of ``name``'s configuration at the session's head entry (cached; entries never change)."""
        key = (session.id, session.head_seq, name)
        digest = self._digests.get(key)
        if digest is None:
            config = self._head(db, session).configs.get(name)
            if config is None:
                return None
            digest = cfg.config_digest(config)
            if len(self._digests) >= 100_000:
                self._digests.clear()
            self._digests[key] = digest
        return digest

    def _instruction(self, db: Session, participant: Participant, session: JobSession) -> dict | None:
        if session.state not in ACTIVE and participant.applied_seq == session.head_seq:
            # Settled: nothing to push, nothing to start. Cheap, so an agent with many finished
            # sessions (the aggregator) does not pay for their logs on every heartbeat.
            command = "none" if session.state == "completed" else "stop"
            settled = {
                "session": session.token,
                "job_id": session.job_id,
                "seq": session.head_seq,
                "run": session.run,
                "command": command,
            }
            if command == "stop":
                settled["reason"], settled["state"] = session.message, session.state
            return settled
        if (
            session.state == "running"
            and participant.applied_seq == session.head_seq
            and participant.run == session.run
            and participant.status in ("running", "completed")
        ):
            # Steady state of a running session: the recipient has the configuration and has
            # started this run, so it only needs to hear "keep running" (agents ignore a run
            # command for a run they started). Entries are immutable, so the digest is cached.
            digest = self._digest(db, session, participant.name)
            if digest is not None:
                return {
                    "session": session.token,
                    "job_id": session.job_id,
                    "seq": session.head_seq,
                    "run": session.run,
                    "command": "run",
                    "resume_round": session.resume_round,
                    "config_sha256": digest,
                }
        head = self._head(db, session)
        config = head.configs.get(participant.name)
        instruction: dict[str, Any] = {"session": session.token, "job_id": session.job_id, "seq": head.seq}
        if config is None:
            instruction["command"] = "stop"
            instruction["run"] = session.run
            instruction["reason"] = "no longer a recipient of this session"
            return instruction
        digest = cfg.config_digest(config)
        if participant.applied_seq != head.seq:
            applied = None
            if participant.applied_seq > 0:
                entry = db.scalar(
                    select(SessionEntry).where(
                        SessionEntry.session_id == session.id, SessionEntry.seq == participant.applied_seq
                    )
                )
                applied = entry.configs.get(participant.name) if entry is not None else None
            ops = cfg.delta(applied, config)
            if ops:
                instruction["delta"] = ops
                instruction["base_seq"] = participant.applied_seq
            else:
                participant.applied_seq = head.seq  # nothing changed for this recipient: no push
        instruction["config_sha256"] = digest
        instruction["run"] = session.run
        waiting = [
            p.name
            for p in self._recipients(db, session).values()
            if p.role == cfg.ROLE_AGGREGATOR and p.status == "pending"
        ]
        if participant.run != session.run and session.state in ACTIVE:
            instruction["command"] = "none"  # added by tuning: joins at the session's next run
        elif session.state == "running" and participant.role == cfg.ROLE_PARTY and waiting:
            # Parties start a run only once every aggregator node runs it (routes, timeouts, checkpoints).
            instruction["command"] = "none"
        elif session.state == "running":
            instruction["command"] = "run"
            instruction["resume_round"] = session.resume_round
            checkpoint = self._latest_checkpoint(db, session) if session.resume_round else None
            if checkpoint is not None and checkpoint.checkpoint["round"] == session.resume_round:
                leaves = checkpoint.checkpoint["leaves"]
                instruction["resume_files"] = leaves.get(participant.name)
                # Parties added since the checkpoint hold none of it: they join through one
                # protected bootstrap aggregation of the checkpointed model (docs/controller.md).
                instruction["joining"] = sorted(
                    name
                    for name, config in self._head(db, session).configs.items()
                    if config.get("role") == cfg.ROLE_PARTY and name not in leaves
                )
        elif session.state == "verifying":
            checkpoint = self._latest_checkpoint(db, session)
            instruction["command"] = "verify"
            instruction["resume_round"] = session.resume_round
            instruction["resume_files"] = checkpoint.checkpoint["leaves"].get(participant.name) if checkpoint else None
        elif session.state in ("cancelled", "refused", "failed", "revoked", "awaiting"):
            instruction["command"] = "stop"
            instruction["reason"], instruction["state"] = session.message, session.state
        else:
            instruction["command"] = "none"
        return instruction
