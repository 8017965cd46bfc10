"""The controller's sessions and their log: submit, tune, resume, cancel, status, metrics.

One concern of :class:`confide.controller.service.Controller` (a mixin: its methods use the
controller's store, clock and caches set in ``Controller.__init__``).
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from confide import checkpoints
from confide.controller import sessions as cfg
from confide.controller.common import (
    ACTIVE,
    CONFIG_KINDS,
    VERTICAL,
    Caller,
    _aware,
    _deltas,
    _describe,
    _evaluation,
    _first_aggregator,
    _HeadMoved,
    _participant,
    _require,
    _shown_status,
    _with_agreed,
)
from confide.controller.store import (
    DatasetUse,
    JobSession,
    Participant,
    SessionEntry,
)
from confide.errors import (
    ConflictError,
    InvalidParameterError,
    NotFoundError,
    PermissionDeniedError,
)
from confide.spec import JobSpec, parse_job


class Lifecycle:
    """Sessions and their log: submit, tune, resume, cancel, status, metrics."""

    # ------------------------------------------------------------------ sessions

    def _session(self, db: Session, caller: Caller, token: str, *, read: bool = False) -> JobSession:
        """The session, if ``caller`` may act on it (``read``: an owner of a dataset it uses may read)."""
        if not isinstance(token, str) or not 1 <= len(token) <= 64:
            raise InvalidParameterError("session token must be a string of 1..64 characters")
        row = db.scalar(select(JobSession).where(JobSession.token == token))
        if row is None:
            raise NotFoundError(f"no session {token!r}")
        if caller.role == "admin" or row.owner == caller.name:
            return row
        if read and caller.role == "party":
            used = db.scalar(
                select(DatasetUse.id).where(DatasetUse.session_id == row.id, DatasetUse.owner == caller.name).limit(1)
            )
            if used is not None:
                return row
        raise PermissionDeniedError(f"session {token!r} belongs to {row.owner!r}, not {caller.name!r}")

    def _head(self, db: Session, session: JobSession) -> SessionEntry:
        return db.scalar(
            select(SessionEntry).where(SessionEntry.session_id == session.id, SessionEntry.seq == session.head_seq)
        )

    def _append(
        self,
        db: Session,
        session: JobSession,
        caller: Caller,
        kind: str,
        *,
        spec: dict,
        configs: dict,
        previous: dict | None,
        checkpoint: dict | None = None,
        note: str = "",
        base_seq: int | None = None,
    ) -> SessionEntry:
        """Append one log entry; a concurrent append to the same session loses with ConflictError."""
        base = session.head_seq if base_seq is None else base_seq
        moved = db.execute(
            update(JobSession)
            .where(JobSession.id == session.id, JobSession.head_seq == base)
            .values(head_seq=base + 1, updated_at=self._now())
            .execution_options(synchronize_session=False)
        )
        if moved.rowcount != 1:
            raise ConflictError(
                f"session {session.token} changed concurrently: its log head is no longer entry {base}; "
                "read 'confide session log' and try again"
            )
        deltas = _deltas(previous or {}, configs)
        entry = SessionEntry(
            session_id=session.id,
            seq=base + 1,
            kind=kind,
            actor=caller.name,
            created_at=self._now(),
            note=note,
            spec=spec,
            configs=configs,
            deltas=deltas,
            checkpoint=checkpoint or {},
        )
        db.add(entry)
        db.flush()
        session.head_seq = base + 1
        return entry

    def _append_event(
        self, db: Session, session: JobSession, caller: Caller, kind: str, *, note: str, checkpoint: dict | None = None
    ) -> SessionEntry:
        """Append an entry that keeps the head's specification and configurations (no delta)."""
        head = self._head(db, session)
        return self._append(
            db,
            session,
            caller,
            kind,
            spec=head.spec,
            configs=head.configs,
            previous=head.configs,
            checkpoint=checkpoint,
            note=note,
        )

    def submit(self, caller: Caller, spec_data: dict) -> dict:
        """Validate, check access, and start a job as a new session; returns its token."""
        _require(caller, "developer", "admin")
        spec = parse_job(self._scoring_request(caller, spec_data))
        token = secrets.token_hex(16)  # 128 bits; hex, so a token never looks like a command-line flag
        approvals, spec = self._check_access(caller, spec, "submit", f"job/{spec.job_id}")
        with self.store.transaction() as db:
            routing = cfg.routing_policy(self._aggregators(db))
            configs = cfg.build_configs(spec, session=token, routing=routing)
            now = self._now()
            session = JobSession(
                token=token,
                job_id=spec.job_id,
                owner=caller.name,
                state="running",
                run=1,
                resume_round=0,
                head_seq=0,
                message="",
                created_at=now,
                updated_at=now,
            )
            db.add(session)
            db.flush()
            self._append(
                db,
                session,
                caller,
                "submit",
                spec=spec.model_dump(mode="json"),
                configs=configs,
                previous=None,
                note="job submitted",
            )
            for name, config in configs.items():
                member = _participant(session.id, name, config["role"], self._now())
                member.run = 1  # a member of the first run
                db.add(member)
            self._record_uses(db, session, spec, approvals)
            pending = self._pending_approvals(db, session)
            if pending:
                session.state = "awaiting"
                session.message = "waiting for the owners' approval of " + ", ".join(pending)
        return {"session": token, "job_id": spec.job_id, "seq": 1, "state": session.state}

    def _scoring_request(self, caller: Caller, spec_data: Any) -> Any:
        """A scoring job (``score.session``) completed from its training session; other jobs as they are.

        The developer names the trained session and each site's dataset of new records; the
        model, the guest, the id column, the label, the pipeline and the protection are the
        session's (its last configuration), so they cannot differ from what trained the parts.
        """
        score = spec_data.get("score") if isinstance(spec_data, dict) else None
        token = score.get("session") if isinstance(score, dict) else None
        if not isinstance(token, str):
            return spec_data  # no scoring job, or one the specification's checks describe
        with self.store.transaction() as db:
            session = self._session(db, caller, token)
            trained, state = dict(self._head(db, session).spec), session.state
        if state != "completed":
            raise InvalidParameterError(
                f"score.session {token}: the session is {state}; its model scores new records once it completed"
            )
        model = parse_job(trained)
        if not model.vertical or model.score is not None:
            what = "scores records" if model.score is not None else f"trained a {model.model.algorithm} model"
            raise InvalidParameterError(
                f"score.session {token}: the session {what}; a scoring job names a session that trained a vertical "
                "model (a horizontal model scores with 'confide model predict')"
            )
        fl_data = spec_data.get("fl_data")
        participants = fl_data.get("participants") if isinstance(fl_data, dict) else None
        if not isinstance(participants, dict) or sorted(participants) != sorted(model.parties):
            given = sorted(participants) if isinstance(participants, dict) else None
            raise InvalidParameterError(
                f"fl_data.participants: a scoring job names each site's dataset of new records, for the sites "
                f"{sorted(model.parties)} of the model (each holds its part); got {given}"
            )
        fixed = sorted(k for k in ("model", "data", "protection", "privacy", "parties") if k in spec_data)
        fixed += [f"fl_data.{k}" for k in ("label", "pipeline") if k in fl_data]
        if fixed:
            raise InvalidParameterError(
                f"score.session: {', '.join(fixed)} come from the training session {token}; leave them out"
            )
        trained_fl_data = model.fl_data_object()
        return {
            **spec_data,
            "model": trained["model"],
            "data": {"guest": model.guest, "id_column": model.data.id_column},
            "protection": trained["protection"],
            "rounds": 1,
            "checkpoint_interval": 0,
            "fl_data": {
                "participants": participants,
                "label": trained_fl_data.label,
                "pipeline": [step.to_dict() for step in trained_fl_data.pipeline if step.op != "join"],
            },
        }

    def tune(
        self,
        caller: Caller,
        token: str,
        *,
        settings: dict[str, Any] | None = None,
        fl_data: dict | None = None,
        add_parties: dict[str, dict] | None = None,
        base_seq: int | None = None,
    ) -> dict:
        """Append a tuning entry: new settings, a new FL_Data and/or added parties.

        The new specification is validated whole and its data access checked again. A running
        job restarts from its last checkpoint with the new configuration (the next run); a
        stopped one uses it when resumed. ``base_seq``: the log head the change was made
        against; if another entry landed since, nothing is stored and ConflictError is raised.
        """
        spec, owner, base_seq = self._tuned(caller, token, settings, fl_data, add_parties, base_seq)
        settings = settings or {}
        approvals, spec = self._check_access(caller, spec, "tune-access", f"session/{token}", developer=owner)
        for _attempt in range(5):
            try:
                return self._append_tuning(
                    caller, token, spec, base_seq, _describe(settings, fl_data, add_parties), approvals
                )
            except _HeadMoved:
                continue  # a checkpoint or state entry landed meanwhile: it changes no configuration
        raise ConflictError(f"session {token} is too busy to tune; try again")

    def _tuned(
        self,
        caller: Caller,
        token: str,
        settings: dict[str, Any] | None,
        fl_data: dict | None,
        add_parties: dict[str, dict] | None,
        base_seq: int | None,
    ) -> tuple[JobSpec, str, int]:
        """The session's specification with a tuning applied (validated whole), its owner, the base entry."""
        _require(caller, "developer", "admin")
        settings = settings or {}
        if not isinstance(settings, dict) or len(settings) > 100:
            raise InvalidParameterError("settings must be a mapping of at most 100 'path=value' entries")
        if not settings and fl_data is None and not add_parties:
            raise InvalidParameterError("a tuning must change something: --set, --fl-data or --add-party")
        for path in settings:
            if path.split(".")[0] in ("job_id", "parties"):
                raise InvalidParameterError(f"{path}: cannot be tuned (the job id names the session; add parties)")
        with self.store.transaction() as db:
            session = self._session(db, caller, token)
            head = self._head(db, session)
            spec_data = dict(head.spec)
            owner = session.owner
            base_seq = session.head_seq if base_seq is None else base_seq
            self._check_unchanged_since(db, session, base_seq)
        for path, value in settings.items():
            spec_data = cfg.set_path(spec_data, path, value)
        if fl_data is not None:
            spec_data["fl_data"] = fl_data
        if add_parties:
            current = spec_data.get("fl_data") or {}
            participants = dict(current.get("participants") or {})
            for name, participant in add_parties.items():
                if name in participants:
                    raise InvalidParameterError(f"add_parties: {name!r} is already a participant")
                participants[name] = participant
            spec_data["fl_data"] = {**current, "participants": participants}
            spec_data.pop("lineage", None)
            if isinstance(spec_data["fl_data"], dict):
                spec_data["fl_data"].pop("lineage", None)
        spec_data.pop("parties", None)
        spec = parse_job(spec_data)
        return spec, owner, base_seq

    def preview_tune(self, caller: Caller, token: str, *, settings: dict[str, Any] | None = None) -> dict:
        """The deltas a tuning would push to each recipient, without storing or auditing anything."""
        spec, owner, base_seq = self._tuned(caller, token, settings, None, None, None)
        # The same access decisions and agreed encodings as the tuning itself (not audited).
        _approvals, _decisions, problem, fl_data = self._access_decisions(spec, owner)
        if problem is not None:
            raise problem
        spec = _with_agreed(spec, fl_data)
        with self.store.transaction() as db:
            session = self._session(db, caller, token)
            head = self._head(db, session)
            configs = cfg.build_configs(
                spec, session=token, routing=head.configs[_first_aggregator(head.configs)]["routing"]
            )
        deltas = _deltas(head.configs, configs)
        return {"session": token, "base_seq": base_seq, "deltas": deltas, "restart": session.state in ACTIVE}

    def _check_unchanged_since(self, db: Session, session: JobSession, base_seq: int) -> None:
        """ConflictError unless every entry after ``base_seq`` leaves the configurations as they were."""
        if isinstance(base_seq, bool) or not isinstance(base_seq, int) or not 0 < base_seq <= session.head_seq:
            raise ConflictError(
                f"session {session.token}: base_seq must be an existing entry (1..{session.head_seq}), got {base_seq!r}"
            )
        newer = db.scalars(
            select(SessionEntry.seq).where(
                SessionEntry.session_id == session.id,
                SessionEntry.seq > base_seq,
                SessionEntry.kind.in_(CONFIG_KINDS),
            )
        ).all()
        if newer:
            raise ConflictError(
                f"session {session.token} changed concurrently: you tuned entry {base_seq}, but entr"
                f"{'ies' if len(newer) > 1 else 'y'} {', '.join(map(str, newer))} changed the configuration since; "
                "nothing was stored (read 'confide session log' and tune again)"
            )

    def _append_tuning(
        self, caller: Caller, token: str, spec: JobSpec, base_seq: int, note: str, approvals: dict
    ) -> dict:
        with self.store.transaction() as db:
            session = self._session(db, caller, token)
            self._check_unchanged_since(db, session, base_seq)
            head = self._head(db, session)
            configs = cfg.build_configs(
                spec, session=token, routing=head.configs[_first_aggregator(head.configs)]["routing"]
            )
            restart = session.state in ACTIVE
            try:
                entry = self._append(
                    db,
                    session,
                    caller,
                    "tune",
                    spec=spec.model_dump(mode="json"),
                    configs=configs,
                    previous=head.configs,
                    note=note,
                    base_seq=session.head_seq,
                )
            except ConflictError:
                raise _HeadMoved from None
            known = {p.name for p in db.scalars(select(Participant).where(Participant.session_id == session.id))}
            for name, config in configs.items():
                if name not in known:
                    db.add(_participant(session.id, name, config["role"], self._now()))
            self._record_uses(db, session, spec, approvals)
            if restart:
                self._restart(db, session, caller, "tuned")
                self._await_approvals(db, session)
            self._audit(db, caller, "tune", f"session/{token}", "allow", {"seq": entry.seq, "deltas": entry.deltas})
            return {"session": token, "seq": entry.seq, "deltas": entry.deltas, "restarted": restart}

    def _latest_checkpoint(self, db: Session, session: JobSession) -> SessionEntry | None:
        return db.scalar(
            select(SessionEntry)
            .where(SessionEntry.session_id == session.id, SessionEntry.kind == "checkpoint")
            .order_by(SessionEntry.seq.desc())
            .limit(1)
        )

    def _restart(self, db: Session, session: JobSession, caller: Caller, why: str) -> None:
        """Next run from the last checkpoint; recipients first prove they hold its files."""
        checkpoint = self._latest_checkpoint(db, session)
        session.run += 1
        session.resume_round = checkpoint.checkpoint["round"] if checkpoint is not None else 0
        session.state = "verifying" if checkpoint is not None else "running"
        session.message = (
            f"{why}: run {session.run} resumes after round {session.resume_round} "
            "once every checkpoint file is verified"
            if checkpoint is not None
            else f"{why}: run {session.run} starts from round 0 (no checkpoint recorded)"
        )
        members = self._head(db, session).configs
        for participant in db.scalars(select(Participant).where(Participant.session_id == session.id)):
            # The run's members are the recipients configured now; nothing reported about an
            # earlier run may count for this one.
            if participant.name in members:
                participant.run = session.run
            participant.verification, participant.checkpoints, participant.result = {}, {}, {}
            participant.status, participant.error, participant.failure = "pending", "", {}

    def resume(self, caller: Caller, token: str) -> dict:
        """Continue a stopped (or orphaned) session from its last checkpoint, after verifying its root.

        Every grant the session uses is checked again first (as at submission): a session whose
        grant was revoked, expired or narrowed does not resume.
        """
        _require(caller, "developer", "admin")
        with self.store.transaction() as db:
            session = self._session(db, caller, token)
            spec = parse_job(self._head(db, session).spec)
            owner = session.owner
        # Access is the session owner's, whoever resumes (an admin resumes on the owner's grants).
        self._check_access(caller, spec, "resume-access", f"session/{token}", developer=owner)
        with self.store.transaction() as db:
            session = self._session(db, caller, token)
            head = self._head(db, session)
            checkpoint = self._latest_checkpoint(db, session)
            trained = checkpoint.checkpoint["round"] if checkpoint is not None else 0
            if session.state == "completed" and trained >= head.spec["rounds"]:
                raise InvalidParameterError(
                    f"session {token} completed all {head.spec['rounds']} rounds; tune 'rounds' to train further"
                )
            if checkpoint is not None:
                recorded = checkpoint.checkpoint
                recomputed = checkpoints.root_of(recorded["leaves"])
                if recomputed != recorded["root"]:
                    raise InvalidParameterError(
                        f"the session log's checkpoint entry {checkpoint.seq} is inconsistent: its leaves give root "
                        f"{recomputed[:16]}..., the entry records {recorded['root'][:16]}..."
                    )
            self._restart(db, session, caller, "resumed")
            self._await_approvals(db, session)
            entry = self._append_event(
                db,
                session,
                caller,
                "resume",
                note=session.message,
                checkpoint=checkpoint.checkpoint if checkpoint is not None else None,
            )
            self._audit(db, caller, "resume", f"session/{token}", "allow", {"run": session.run})
            return {
                "session": token,
                "seq": entry.seq,
                "run": session.run,
                "resume_round": session.resume_round,
                "state": session.state,
            }

    def cancel(self, caller: Caller, token: str) -> dict:
        """Stop a session's processes; it can be resumed later."""
        _require(caller, "developer", "admin")
        with self.store.transaction() as db:
            session = self._session(db, caller, token)
            if session.state not in (*ACTIVE, "awaiting"):
                raise InvalidParameterError(f"session {token} is {session.state}, not running")
            session.state, session.message = "cancelled", f"cancelled by {caller.name}"
            entry = self._append_event(
                db,
                session,
                caller,
                "cancel",
                note="cancel",
            )
            self._audit(db, caller, "cancel", f"session/{token}", "allow", {})
            return {"session": token, "seq": entry.seq, "state": "cancelled"}

    def status(self, caller: Caller, token: str) -> dict:
        """State, run, progress per recipient, the last checkpoint."""
        with self.store.transaction() as db:
            session = self._session(db, caller, token, read=True)
            checkpoint = self._latest_checkpoint(db, session)
            participants = db.scalars(
                select(Participant).where(Participant.session_id == session.id).order_by(Participant.name)
            ).all()
            relay_only = self._head(db, session).spec.get("model", {}).get("algorithm") in VERTICAL
            return {
                "session": token,
                "job_id": session.job_id,
                "owner": session.owner,
                "state": session.state,
                "message": session.message,
                "run": session.run,
                "resume_round": session.resume_round,
                "head_seq": session.head_seq,
                "checkpoint": (
                    {
                        "round": checkpoint.checkpoint["round"],
                        "root": checkpoint.checkpoint["root"],
                        "seq": checkpoint.seq,
                    }
                    if checkpoint is not None
                    else None
                ),
                "participants": [
                    {
                        "name": p.name,
                        "role": p.role,
                        "status": _shown_status(p, session, relay_only),
                        "run": p.run,
                        "round": p.round,
                        "applied_seq": p.applied_seq,
                        "error": p.error,
                        "failure": p.failure or None,
                        "result": p.result,
                    }
                    for p in participants
                ],
                "evaluation": _evaluation(participants),
            }

    def metrics(self, caller: Caller, token: str, *, after: int = -1, logs: bool = True) -> dict:
        """Per-round metrics, the protection each recipient reports running, shared log lines.

        ``after``: only rounds after this one; ``logs``: include the log lines a party shares.
        """
        with self.store.transaction() as db:
            session = self._session(db, caller, token, read=True)
            participants = db.scalars(
                select(Participant).where(Participant.session_id == session.id).order_by(Participant.name)
            ).all()
            requested = (self._head(db, session).spec.get("protection") or {}).get("mode")
            return {
                "session": token,
                "mode_requested": requested,
                "participants": [
                    {
                        "name": p.name,
                        "role": p.role,
                        "protection": p.protection or None,
                        "log": (p.log_tail or []) if logs else [],
                        "metrics": [row for row in (p.metrics or []) if row["round"] > after],
                    }
                    for p in participants
                ],
            }

    def lineage(self, caller: Caller, token: str) -> dict:
        """The FL_Data in force (state and lineage, never rows) and the model it feeds."""
        with self.store.transaction() as db:
            session = self._session(db, caller, token, read=True)
            spec = parse_job(self._head(db, session).spec)
        fl_data = spec.fl_data_object()
        return {
            "session": token,
            "algorithm": spec.model.algorithm,
            "fl_data": fl_data.to_dict() if fl_data is not None else None,
        }

    def sessions(self, caller: Caller) -> list[dict]:
        """The caller's sessions (an admin's: all)."""
        with self.store.transaction() as db:
            query = select(JobSession).order_by(JobSession.id)
            if caller.role == "party":
                used = select(DatasetUse.session_id).where(DatasetUse.owner == caller.name)
                query = query.where(JobSession.id.in_(used))
            elif caller.role != "admin":
                query = query.where(JobSession.owner == caller.name)
            return [
                {"session": s.token, "job_id": s.job_id, "owner": s.owner, "state": s.state, "run": s.run}
                for s in db.scalars(query)
            ]

    def log(self, caller: Caller, token: str) -> list[dict]:
        """The committed log: each entry with its deltas per recipient and any checkpoint root."""
        with self.store.transaction() as db:
            session = self._session(db, caller, token, read=True)
            return [
                {
                    "seq": e.seq,
                    "kind": e.kind,
                    "actor": e.actor,
                    "at": _aware(e.created_at).isoformat(),
                    "note": e.note,
                    "deltas": e.deltas,
                    "checkpoint": (
                        {"round": e.checkpoint["round"], "run": e.checkpoint["run"], "root": e.checkpoint["root"]}
                        if e.checkpoint
                        else None
                    ),
                    "config_digests": {name: cfg.config_digest(c) for name, c in sorted(e.configs.items())},
                }
                for e in db.scalars(
                    select(SessionEntry).where(SessionEntry.session_id == session.id).order_by(SessionEntry.seq)
                )
            ]

    def entry(self, caller: Caller, token: str, seq: int) -> dict:
        """One log entry in full: specification, configurations, routing, deltas, checkpoint."""
        with self.store.transaction() as db:
            session = self._session(db, caller, token)
            e = db.scalar(select(SessionEntry).where(SessionEntry.session_id == session.id, SessionEntry.seq == seq))
            if e is None:
                raise NotFoundError(f"session {token} has no entry {seq} (entries 1..{session.head_seq})")
            return {
                "seq": e.seq,
                "kind": e.kind,
                "spec": e.spec,
                "configs": e.configs,
                "deltas": e.deltas,
                "checkpoint": e.checkpoint,
            }
