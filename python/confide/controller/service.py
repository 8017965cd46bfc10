"""The controller's operations over the store; the REST layer (api.py) is a thin shell over these.

Every public method is one database transaction and takes the caller's verified identity
(certificate name and role). Roles:

* ``party``: a data owner running a party agent. Registers, publishes dataset metadata, grants
  and revokes developers' use of its own datasets, receives its configurations and commands.
* ``service``: an aggregator node. Registers its address, receives its configurations.
* ``developer``: submits jobs and tunes, resumes, cancels and reads its own sessions.
* ``admin``: everything a developer may do, on every session; reads the whole audit log.

Access decisions (grants at submission and tuning, session ownership) are written to the audit
log in their own transaction, so a denial is recorded even though the request stores nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, load_only
from sqlalchemy.orm.attributes import set_committed_value

from confide import checkpoints
from confide.controller import sessions as cfg
from confide.controller.store import (
    AuditEvent,
    Dataset,
    DatasetUse,
    Grant,
    JobSession,
    Participant,
    Party,
    SessionEntry,
    Store,
    utcnow,
)
from confide.data.catalog import MAX_PUBLISHED_CATEGORIES as MAX_CATEGORIES
from confide.data.schemas import agree_categories, check_schemas
from confide.errors import (
    ConflictError,
    DataAccessDeniedError,
    InvalidParameterError,
    NotFoundError,
    PermissionDeniedError,
)
from confide.reports import METRIC_KEYS, Failure
from confide.spec import VERTICAL_ALGORITHMS, JobSpec, parse_job

__all__ = ["Caller", "Controller", "certificate_digest"]

log = logging.getLogger("confide.controller")

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MAX_COLUMNS = 10_000
MAX_DATASETS = 1_000
#: Session states. "verifying": a resume waits for every recipient's checkpoint hashes;
#: "awaiting": a dataset's owner has not yet approved the session; "revoked": an owner revoked
#: (or let expire) a grant the session used, so it stopped.
STATES = ("running", "verifying", "awaiting", "completed", "failed", "cancelled", "refused", "revoked")
ACTIVE = ("running", "verifying")
#: Seconds between two sweeps for grants that expired under running sessions.
EXPIRY_SWEEP_S = 2.0
#: A revoked certificate's refusals are audited at most this often (seconds) per certificate
#: (per controller process: with ``--workers N``, at most N times).
REFUSAL_AUDIT_S = 60.0
#: An agent's ``last_seen_at`` is written at most this often (seconds, and at most a third of
#: ``alive_s``) by each controller process. A heartbeat in between writes nothing: with nothing
#: else to report it is one read. The stored time thus trails the last heartbeat by at most this
#: much, so an agent that stops is shown down between ``alive_s`` minus this and ``alive_s``
#: after its last heartbeat, whichever process (worker) received it.
LAST_SEEN_WRITE_S = 5.0
MAX_GRANT_DAYS = 3650
CHECKPOINTS_KEPT = 3
#: Rounds of metrics kept per participant (the newest; a longer job's curve starts later).
MAX_METRIC_ROUNDS = 20_000
#: Rows of metrics one report may carry, and the size of a protection report.
MAX_METRIC_ROWS = 5_000
MAX_PROTECTION_BYTES = 16_384
#: Lines of a party's shared log kept per participant, and their length.
MAX_LOG_LINES = 1_000
MAX_LOG_LINE_CHARS = 1_000


#: Log entries that change configurations; other entries (checkpoint, resume, cancel) never
#: make a tuning stale.
CONFIG_KINDS = ("submit", "tune")


class _HeadMoved(Exception):
    """The log head moved between reading and appending (retried when no configuration changed)."""


@dataclass(frozen=True)
class Caller:
    """A verified identity: certificate common name and role.

    ``account``: the console account acting (a person signed in to the web console, or a script
    with its API token), recorded in every audit event it causes.
    """

    name: str
    role: str
    account: str | None = None


def _check_name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidParameterError(f"{field} must be 1..64 characters of [a-z0-9_-], got {value!r}")
    return value


def _require(caller: Caller, *roles: str) -> None:
    if caller.role not in roles:
        raise PermissionDeniedError(
            f"{caller.name!r} ({caller.role}) may not do this; it needs role {' or '.join(roles)}"
        )


class Controller:
    """Registry, access control, sessions and their logs."""

    def __init__(self, store: Store, *, alive_s: float = 30.0) -> None:
        self.store = store
        #: A party or aggregator not heard from for this long is reported as offline.
        self.alive_s = alive_s
        #: Seconds between two writes of one agent's ``last_seen_at`` (see LAST_SEEN_WRITE_S).
        self.last_seen_write_s = min(LAST_SEEN_WRITE_S, alive_s / 3)
        # Per-process state: each is either a cache of immutable rows or a rate limit, so it stays
        # correct when several controller processes (workers) share one store (docs/controller.md).
        self._digests: dict[tuple[int, int, str], str] = {}
        self._last_sweep = 0.0  # when grants were last checked for expiry (utcnow().timestamp())
        self._sweeping = threading.Lock()
        self._refusals: dict[str, float] = {}  # serial -> when its last refusal was audited (monotonic)
        self._seen_written: dict[str, float] = {}  # name -> when this process last wrote its last_seen_at
        self._clock = time.monotonic  # the write interval's clock (tests move it)
        self._heard: dict[str, datetime] = {}  # name -> its latest heartbeat received by this process

    # ------------------------------------------------------------------ identities and metadata

    def register(
        self,
        caller: Caller,
        *,
        address: str | None,
        datasets: list[dict],
        cert_sha256: str,
        cert_expires_at: datetime | None = None,
        version: str | None = None,
    ) -> dict:
        """Register (or refresh) the caller; a party publishes its datasets' metadata (replacing its list)."""
        _require(caller, "party", "service", "developer", "admin")
        if caller.role != "party" and datasets:
            raise InvalidParameterError("datasets: only parties publish datasets")
        if len(datasets) > MAX_DATASETS:
            raise InvalidParameterError(f"datasets: at most {MAX_DATASETS} per party, got {len(datasets)}")
        checked = [self._check_dataset(i, d) for i, d in enumerate(datasets)]
        names = [d["name"] for d in checked]
        if len(set(names)) != len(names):
            raise InvalidParameterError("datasets: names must be unique per party")
        now = utcnow()
        with self.store.transaction() as db:
            party = db.scalar(select(Party).where(Party.name == caller.name))
            if party is None:
                party = Party(name=caller.name, role=caller.role, registered_at=now, last_seen_at=now, cert_sha256="")
                db.add(party)
            party.role, party.address, party.cert_sha256, party.last_seen_at = caller.role, address, cert_sha256, now
            party.cert_expires_at, party.version = cert_expires_at, version
            db.flush()
            if caller.role == "party":
                existing = {d.name: d for d in db.scalars(select(Dataset).where(Dataset.owner == caller.name))}
                for name in sorted(set(existing) - set(names)):
                    # Withdrawn by its owner: unpublished, and its grants go with it (audited).
                    withdrawn = existing.pop(name)
                    revoked = [g.developer for g in db.scalars(select(Grant).where(Grant.dataset_id == withdrawn.id))]
                    db.execute(delete(Grant).where(Grant.dataset_id == withdrawn.id))
                    db.delete(withdrawn)
                    self._audit(db, caller, "withdraw", f"{caller.name}/{name}", "info", {"grants_removed": revoked})
                for item in checked:
                    row = existing.get(item["name"])
                    if row is None:
                        row = Dataset(owner=caller.name, name=item["name"])
                        db.add(row)
                    row.columns, row.rows = item["columns"], item["rows"]
                    row.description, row.source, row.updated_at = item["description"], item["source"], now
            self._audit(db, caller, "register", caller.name, "info", {"role": caller.role, "datasets": names})
        return {"name": caller.name, "role": caller.role, "datasets": names}

    @staticmethod
    def _check_dataset(index: int, item: Any) -> dict:
        where = f"datasets[{index}]"
        if not isinstance(item, dict):
            raise InvalidParameterError(f"{where} must be a mapping")
        allowed = {"name", "schema", "rows", "description", "source"}
        extra = set(item) - allowed
        if extra:
            raise InvalidParameterError(
                f"{where}: unknown fields {sorted(extra)} (only metadata is accepted: {sorted(allowed)})"
            )
        name = _check_name(item.get("name"), f"{where}.name")
        schema = item.get("schema")
        if not isinstance(schema, list) or not 1 <= len(schema) <= MAX_COLUMNS:
            raise InvalidParameterError(f"{where}.schema must list 1..{MAX_COLUMNS} columns")
        columns = []
        for number, column in enumerate(schema):
            if (
                not isinstance(column, dict)
                or not isinstance(column.get("name"), str)
                or not 1 <= len(column["name"]) <= 128
                or column.get("dtype") not in ("float", "int", "str")
                or set(column) - {"name", "dtype", "missing", "categories"}
                or not isinstance(column.get("missing", False), bool)
            ):
                raise InvalidParameterError(
                    f"{where}.schema[{number}] must be {{name: 1..128 chars, dtype: float|int|str, missing: bool, "
                    f"categories: [str]}}, got {str(column)[:300]}"
                )
            checked = {"name": column["name"], "dtype": column["dtype"], "missing": column.get("missing", False)}
            if "categories" in column:
                categories = column["categories"]
                if (
                    column["dtype"] != "str"
                    or not isinstance(categories, list)
                    or len(categories) > MAX_CATEGORIES
                    or not all(isinstance(c, str) and 1 <= len(c) <= 128 for c in categories)
                ):
                    raise InvalidParameterError(
                        f"{where}.schema[{number}].categories must be a list of at most {MAX_CATEGORIES} strings "
                        "of 1..128 characters, on a str column"
                    )
                checked["categories"] = sorted(set(categories))
            columns.append(checked)
        rows = item.get("rows")
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= 10**12:
            raise InvalidParameterError(f"{where}.rows must be an int in [0, 10^12], got {rows!r}")
        description = item.get("description", "") or ""
        source = item.get("source", "") or ""
        if not isinstance(description, str) or len(description) > 4096:
            raise InvalidParameterError(f"{where}.description must be a string of at most 4096 characters")
        if not isinstance(source, str) or len(source) > 64:
            raise InvalidParameterError(f"{where}.source must be a string of at most 64 characters")
        return {"name": name, "columns": columns, "rows": rows, "description": description, "source": source}

    def parties(self, caller: Caller) -> list[dict]:
        """Registered identities with their liveness."""
        now = utcnow()
        with self.store.transaction() as db:
            rows = list(db.scalars(select(Party).order_by(Party.name)))
        out = []
        for p in rows:
            seen = self._last_seen(p)
            out.append(
                {
                    "name": p.name,
                    "role": p.role,
                    "address": p.address,
                    "last_seen_s": round((now - seen).total_seconds(), 3),
                    "online": now - seen < timedelta(seconds=self.alive_s),
                    "cert_expires_at": _aware(p.cert_expires_at).isoformat() if p.cert_expires_at else None,
                    "version": p.version,
                }
            )
        return out

    def _last_seen(self, party: Party) -> datetime:
        """The stored last-seen time, or this process's own later heartbeat (not yet written)."""
        stored = _aware(party.last_seen_at)
        heard = self._heard.get(party.name)
        return heard if heard is not None and heard > stored else stored

    def datasets(self, caller: Caller) -> list[dict]:
        """Published dataset metadata, with whether the caller may use each."""
        with self.store.transaction() as db:
            granted = {
                g.dataset_id
                for g in db.scalars(select(Grant).where(Grant.developer == caller.name, Grant.revoked_at.is_(None)))
            }
            return [
                {
                    "owner": d.owner,
                    "name": d.name,
                    "schema": d.columns,
                    "rows": d.rows,
                    "description": d.description,
                    "source": d.source,
                    "granted": d.id in granted or d.owner == caller.name,
                }
                for d in db.scalars(select(Dataset).order_by(Dataset.owner, Dataset.name))
            ]

    # ------------------------------------------------------------------ grants and audit

    def grant(
        self,
        caller: Caller,
        *,
        dataset: str,
        developer: str,
        expires_at: str | None = None,
        job_id: str | None = None,
        approval: bool = False,
    ) -> dict:
        """The dataset's owner (the caller) lets ``developer`` use ``dataset`` in jobs.

        ``expires_at`` (ISO 8601 with a time zone): the grant lapses then, and sessions still using
        the dataset stop as on a revocation. ``job_id``: only jobs with this id may use it.
        ``approval``: every session that would use it waits for the owner's ``approve``.
        """
        _require(caller, "party")
        dataset, developer = _check_name(dataset, "dataset"), _check_name(developer, "developer")
        expires = _expiry(expires_at)
        if job_id is not None and (not isinstance(job_id, str) or not 1 <= len(job_id) <= 128):
            raise InvalidParameterError(f"job_id must be a string of 1..128 characters, got {job_id!r}")
        if not isinstance(approval, bool):
            raise InvalidParameterError(f"approval must be true or false, got {approval!r}")
        with self.store.transaction() as db:
            row = self._own_dataset(db, caller, dataset)
            existing = db.scalar(select(Grant).where(Grant.dataset_id == row.id, Grant.developer == developer))
            if existing is None:
                existing = Grant(dataset_id=row.id, developer=developer, granted_by=caller.name, granted_at=utcnow())
                db.add(existing)
            else:
                existing.granted_by, existing.granted_at = caller.name, utcnow()
                existing.revoked_at = existing.revoked_by = None
            existing.expires_at, existing.job_id, existing.approval = expires, job_id, approval
            scope = {"expires_at": expires.isoformat() if expires else None, "job_id": job_id, "approval": approval}
            self._audit(db, caller, "grant", f"{caller.name}/{dataset}", "allow", {"developer": developer, **scope})
        return {"dataset": f"{caller.name}/{dataset}", "developer": developer, "active": True, **scope}

    def revoke(self, caller: Caller, *, dataset: str, developer: str) -> dict:
        """The owner withdraws a grant: every session of ``developer`` using the dataset stops.

        Stopped sessions go to state ``revoked`` (their parties stop at the next round boundary
        and never start the session again), and ``resume``/``tune`` are refused until a new grant.
        """
        _require(caller, "party")
        dataset, developer = _check_name(dataset, "dataset"), _check_name(developer, "developer")
        with self.store.transaction() as db:
            row = self._own_dataset(db, caller, dataset)
            existing = db.scalar(select(Grant).where(Grant.dataset_id == row.id, Grant.developer == developer))
            if existing is None or existing.revoked_at is not None:
                raise NotFoundError(f"no active grant of {caller.name}/{dataset} to {developer!r}")
            existing.revoked_at, existing.revoked_by = utcnow(), caller.name
            self._audit(db, caller, "revoke", f"{caller.name}/{dataset}", "info", {"developer": developer})
            stopped = self._stop_uses(
                db, caller, caller.name, dataset, developer, f"{caller.name} revoked {developer}'s grant"
            )
        return {"dataset": f"{caller.name}/{dataset}", "developer": developer, "active": False, "stopped": stopped}

    def _stop_uses(self, db: Session, caller: Caller, owner: str, dataset: str, developer: str, why: str) -> list:
        """Stop every live session of ``developer`` using ``owner/dataset``; returns their tokens."""
        rows = db.execute(
            select(DatasetUse, JobSession)
            .join(JobSession, DatasetUse.session_id == JobSession.id)
            .where(
                DatasetUse.owner == owner,
                DatasetUse.dataset == dataset,
                DatasetUse.developer == developer,
                JobSession.state.in_((*ACTIVE, "awaiting")),
            )
            .order_by(JobSession.id)
            # Row locks (PostgreSQL): a revocation and an expiry sweep (in another worker, say)
            # stopping one session at once; the second waits, re-reads the state and skips it.
            .with_for_update(of=JobSession)
            .execution_options(populate_existing=True)
        ).all()
        stopped = []
        for _use, session in rows:
            session.state = "revoked"
            session.message = (
                f"stopped: {why} for dataset {owner}/{dataset}; its parties stop at the next round boundary. "
                f"Resume needs a new grant ('confide grant add --dataset {dataset} --developer {developer}', "
                f"run by {owner})"
            )
            self._append_event(
                db,
                session,
                caller,
                "revoked",
                note=session.message,
            )
            detail = {"session": session.token, "job_id": session.job_id, "developer": developer, "why": why}
            self._audit(db, caller, "stop-session", f"{owner}/{dataset}", "deny", detail)
            stopped.append(session.token)
        return stopped

    def approve(self, caller: Caller, token: str) -> dict:
        """The owner approves a session's use of its datasets (grants given with ``approval``)."""
        _require(caller, "party")
        with self.store.transaction() as db:
            session = db.scalar(select(JobSession).where(JobSession.token == token))
            uses = (
                db.scalars(
                    select(DatasetUse).where(DatasetUse.session_id == session.id, DatasetUse.owner == caller.name)
                ).all()
                if session is not None
                else []
            )
            if not uses:
                raise NotFoundError(f"session {token!r} uses none of {caller.name}'s datasets")
            now = utcnow()
            for use in uses:
                if use.approval_needed and use.approved_at is None:
                    use.approved_at = now
                    self._audit(db, caller, "approve", f"{caller.name}/{use.dataset}", "allow", {"session": token})
            pending = self._pending_approvals(db, session)
            if session.state == "awaiting" and not pending:
                session.state = "verifying" if session.resume_round else "running"
                session.message = f"approved by every owner; run {session.run} starts"
            return {"session": token, "state": session.state, "pending": pending}

    def _await_approvals(self, db: Session, session: JobSession) -> None:
        pending = self._pending_approvals(db, session)
        if pending and session.state in ACTIVE:
            session.state = "awaiting"
            session.message = "waiting for the owners' approval of " + ", ".join(pending)

    @staticmethod
    def _pending_approvals(db: Session, session: JobSession) -> list[str]:
        return [
            f"{u.owner}/{u.dataset}"
            for u in db.scalars(select(DatasetUse).where(DatasetUse.session_id == session.id).order_by(DatasetUse.id))
            if u.approval_needed and u.approved_at is None
        ]

    def _record_uses(self, db: Session, session: JobSession, spec: JobSpec, approvals: dict) -> None:
        """One row per dataset the session's specification uses (kept across tunings)."""
        fl_data = spec.fl_data_object()
        pipeline = [{"name": step.name, "op": step.op} for step in fl_data.pipeline]
        existing = {
            (u.owner, u.dataset): u for u in db.scalars(select(DatasetUse).where(DatasetUse.session_id == session.id))
        }
        for party, dataset in sorted(fl_data.datasets().items()):
            use = existing.get((party, dataset))
            if use is None:
                use = DatasetUse(
                    session_id=session.id,
                    owner=party,
                    dataset=dataset,
                    developer=session.owner,
                    since=utcnow(),
                    approval_needed=approvals.get((party, dataset), False),
                )
                db.add(use)
            use.pipeline = pipeline

    def uses(self, caller: Caller) -> list[dict]:
        """Every session that uses (or used) the caller's datasets: who, when, which steps, its state.

        A party sees the uses of its own datasets, an admin every use, a developer its own.
        """
        with self.store.transaction() as db:
            query = select(DatasetUse, JobSession).join(JobSession, DatasetUse.session_id == JobSession.id)
            query = _visible(query, caller, owner=DatasetUse.owner, developer=DatasetUse.developer)
            return [
                {
                    "session": s.token,
                    "job_id": s.job_id,
                    "dataset": f"{u.owner}/{u.dataset}",
                    "developer": u.developer,
                    "since": _aware(u.since).isoformat(),
                    "pipeline": u.pipeline,
                    "state": s.state,
                    "run": s.run,
                    "approval": (
                        ("approved" if u.approved_at is not None else "pending") if u.approval_needed else "not needed"
                    ),
                }
                for u, s in db.execute(query.order_by(DatasetUse.id))
            ]

    def _sweep_if_due(self) -> None:
        """Stop live sessions whose grant lapsed: one transaction, at most every EXPIRY_SWEEP_S, one thread."""
        if utcnow().timestamp() - self._last_sweep < EXPIRY_SWEEP_S or not self._sweeping.acquire(blocking=False):
            return
        try:
            with self.store.transaction() as db:
                self._sweep_expired(db)
        finally:
            self._sweeping.release()

    def _sweep_expired(self, db: Session) -> None:
        """Stop live sessions whose grant lapsed (checked at most every EXPIRY_SWEEP_S)."""
        now = utcnow()
        if now.timestamp() - self._last_sweep < EXPIRY_SWEEP_S:
            return
        # Only grants that lapsed since the previous sweep (all of them after a restart): a
        # session cannot start or resume on a lapsed grant, so older ones have nothing to stop.
        since = datetime.fromtimestamp(max(self._last_sweep - EXPIRY_SWEEP_S, 0.0), tz=timezone.utc)
        self._last_sweep = now.timestamp()
        lapsed = db.execute(
            select(Grant, Dataset)
            .join(Dataset, Grant.dataset_id == Dataset.id)
            .where(Grant.revoked_at.is_(None), Grant.expires_at > since, Grant.expires_at <= now)
        ).all()
        for grant, dataset in lapsed:
            if _aware(grant.expires_at) <= now:
                self._stop_uses(
                    db,
                    Caller("controller", "admin"),
                    dataset.owner,
                    dataset.name,
                    grant.developer,
                    f"the grant of {dataset.owner} to {grant.developer} expired at "
                    f"{_aware(grant.expires_at).isoformat()}",
                )

    def grants(self, caller: Caller) -> list[dict]:
        """Grants the caller gave (party), received (developer), or all of them (admin)."""
        now = utcnow()
        with self.store.transaction() as db:
            query = select(Grant, Dataset).join(Dataset, Grant.dataset_id == Dataset.id)
            query = _visible(query, caller, owner=Dataset.owner, developer=Grant.developer)
            return [
                {
                    "dataset": f"{d.owner}/{d.name}",
                    "developer": g.developer,
                    "granted_by": g.granted_by,
                    "granted_at": _aware(g.granted_at).isoformat(),
                    "active": _grant_active(g, now),
                    "expires_at": _aware(g.expires_at).isoformat() if g.expires_at else None,
                    "job_id": g.job_id,
                    "approval": g.approval,
                }
                for g, d in db.execute(query.order_by(Grant.id))
            ]

    def audit(
        self,
        caller: Caller,
        *,
        after: int = 0,
        limit: int = 200,
        action: str | None = None,
        decision: str | None = None,
        actor: str | None = None,
        target: str | None = None,
        newest_first: bool = False,
    ) -> list[dict]:
        """Audit events after id ``after``: an admin sees all, others those they are actor or target of.

        Filters (applied in the database): ``action`` is a prefix of the action, ``decision``
        and ``actor`` match exactly, ``target`` is a substring of the target. ``newest_first``
        returns the newest ``limit`` events, newest first.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidParameterError(f"limit must be an int in [1, 10000], got {limit!r}")
        for field, value in (("action", action), ("decision", decision), ("actor", actor), ("target", target)):
            if value is not None and (not isinstance(value, str) or len(value) > 255):
                raise InvalidParameterError(f"{field} must be a string of at most 255 characters")
        with self.store.transaction() as db:
            query = select(AuditEvent).where(AuditEvent.id > after)
            if caller.role != "admin":
                query = query.where(
                    (AuditEvent.actor == caller.name) | (AuditEvent.target.like(f"{_like(caller.name)}/%", escape="\\"))
                )
            if action:
                query = query.where(AuditEvent.action.like(f"{_like(action)}%", escape="\\"))
            if decision:
                query = query.where(AuditEvent.decision == decision)
            if actor:
                query = query.where(AuditEvent.actor == actor)
            if target:
                query = query.where(AuditEvent.target.like(f"%{_like(target)}%", escape="\\"))
            order = AuditEvent.id.desc() if newest_first else AuditEvent.id
            return [
                {
                    "id": e.id,
                    "at": _aware(e.at).isoformat(),
                    "actor": e.actor,
                    "action": e.action,
                    "target": e.target,
                    "decision": e.decision,
                    "detail": e.detail,
                }
                for e in db.scalars(query.order_by(order).limit(limit))
            ]

    def _own_dataset(self, db: Session, caller: Caller, dataset: str) -> Dataset:
        row = db.scalar(select(Dataset).where(Dataset.owner == caller.name, Dataset.name == dataset))
        if row is None:
            raise NotFoundError(f"dataset {caller.name}/{dataset} is not published (register it first)")
        return row

    @staticmethod
    def _audit(db: Session, caller: Caller, action: str, target: str, decision: str, detail: dict) -> None:
        if caller.account is not None:
            detail = {**detail, "account": caller.account}
        db.add(
            AuditEvent(
                at=utcnow(), actor=caller.name, action=action, target=target[:255], decision=decision, detail=detail
            )
        )

    def _audit_now(self, caller: Caller, action: str, target: str, decision: str, detail: dict) -> None:
        with self.store.transaction() as db:
            self._audit(db, caller, action, target, decision, detail)

    def certificate_refused(self, caller: Caller, serial: str, where: str) -> None:
        """Audit a request refused for a revoked certificate (``certificate.refused``).

        Once a minute per certificate at most: an agent keeps calling every second, and the log
        should show that it does, not fill up with it.
        """
        now = time.monotonic()
        if now - self._refusals.get(serial, -REFUSAL_AUDIT_S) < REFUSAL_AUDIT_S:
            return
        self._refusals[serial] = now
        log.warning("refused %s (serial %s) at %s: certificate revoked", caller.name, serial, where)
        self._audit_now(
            caller, "certificate.refused", f"{caller.name}/certificate", "denied", {"serial": serial, "path": where}
        )

    # ------------------------------------------------------------------ access checks

    def _check_access(
        self, caller: Caller, spec: JobSpec, action: str, target: str, *, developer: str | None = None
    ) -> tuple[dict, JobSpec]:
        """Every party registered, every dataset published and granted; every decision audited.

        The decision goes to the audit log once for the request and once per dataset (target
        ``owner/dataset``, so each owner sees every attempt to use its data). The pipeline is
        checked against the published schemas (``confide.data.schemas``), after agreeing the
        categories of encode steps that do not list them. Returns which datasets wait for their
        owner's approval (``{(party, dataset): bool}``) and the specification with the agreed
        categories. ``developer``: whose grants count (default the caller; an admin resuming a
        session acts on its owner's grants, and the audit names the admin).
        """
        if spec.fl_data is None:
            raise InvalidParameterError(
                "fl_data: a job submitted to the controller must provision data as FL_Data "
                "(which dataset of which party, label, pipeline)"
            )
        approvals, decisions, problem, fl_data = self._access_decisions(spec, developer or caller.name)
        denied = [d for d in decisions if d["decision"] == "deny"]
        with self.store.transaction() as db:
            self._audit(
                db, caller, action, target, "deny" if problem else "allow", {"job_id": spec.job_id, "checks": decisions}
            )
            for decision in decisions:
                if "dataset" in decision:
                    # The owner's view: every attempt to use its dataset, allowed or not.
                    detail = {"job_id": spec.job_id, "request": target, **decision}
                    self._audit(db, caller, f"use:{action}", decision["dataset"], decision["decision"], detail)
        if problem is not None:
            log.info("%s %s denied: %s", caller.name, action, denied)
            raise problem
        return approvals, _with_agreed(spec, fl_data)

    def _access_decisions(self, spec: JobSpec, grantee: str) -> tuple[dict, list[dict], Exception | None, Any]:
        """Per dataset of ``spec``: allowed or denied for ``grantee``, and why (reads only)."""
        fl_data = spec.fl_data_object()
        decisions: list[dict] = []
        problem: Exception | None = None
        approvals: dict[tuple[str, str], bool] = {}
        schemas: dict[str, list[dict]] = {}
        now = utcnow()
        with self.store.transaction() as db:
            for party, dataset in sorted(fl_data.datasets().items()):
                registered = db.scalar(select(Party).where(Party.name == party))
                if registered is None or registered.role != "party":
                    problem = problem or NotFoundError(f"party {party!r} is not registered with the controller")
                    decisions.append({"party": party, "decision": "deny", "reason": "unknown party"})
                    continue
                row = db.scalar(select(Dataset).where(Dataset.owner == party, Dataset.name == dataset))
                if row is None:
                    problem = problem or NotFoundError(f"dataset {party}/{dataset} is not published by {party!r}")
                    decisions.append({"dataset": f"{party}/{dataset}", "decision": "deny", "reason": "unknown dataset"})
                    continue
                grant = db.scalar(select(Grant).where(Grant.dataset_id == row.id, Grant.developer == grantee))
                if grantee != party and not _grant_active(grant, now, spec.job_id):
                    reason = _why_no_grant(grant, now, spec.job_id)
                    problem = problem or DataAccessDeniedError(
                        f"{grantee!r} has no grant for dataset {party}/{dataset} ({reason}); its owner grants it "
                        f"with 'confide grant add --dataset {dataset} --developer {grantee}'"
                    )
                    decisions.append({"dataset": f"{party}/{dataset}", "decision": "deny", "reason": reason})
                    continue
                approvals[(party, dataset)] = bool(grant is not None and grant.approval and grantee != party)
                schemas[party] = row.columns
                decisions.append({"dataset": f"{party}/{dataset}", "decision": "allow"})
            if problem is None:
                fl_data = agree_categories(fl_data, schemas)
                problems = check_schemas(fl_data, schemas, vertical=spec.vertical_layout())
                if problems:
                    problem = InvalidParameterError(
                        "fl_data does not fit the published schemas:\n  " + "\n  ".join(p.text() for p in problems[:20])
                    )
                    decisions.append({"decision": "deny", "reason": "schema", "problems": [p.text() for p in problems]})
        return approvals, decisions, problem, fl_data

    def preflight(self, caller: Caller, spec_data: Any) -> dict:
        """What a submission of ``spec_data`` would meet, without submitting or auditing anything.

        ``problems``: the specification's invalid fields (each named); ``datasets``: each dataset's
        decision for the caller (``allow`` or ``deny`` with the reason, a missing grant named).
        """
        _require(caller, "developer", "admin")
        try:
            spec = parse_job(spec_data)
        except InvalidParameterError as error:
            problems = str(error).removeprefix("invalid job specification: ").split("; ")
            return {"valid": False, "problems": problems, "datasets": [], "job_id": None}
        if spec.fl_data is None:
            return {
                "valid": False,
                "problems": ["fl_data: a job submitted to the controller must provision data as FL_Data"],
                "datasets": [],
                "job_id": spec.job_id,
            }
        _approvals, decisions, problem, _fl_data = self._access_decisions(spec, caller.name)
        return {
            "valid": problem is None,
            "problems": [str(problem)] if problem is not None else [],
            "datasets": [d for d in decisions if "dataset" in d],
            "job_id": spec.job_id,
        }

    def _aggregators(self, db: Session) -> list[dict]:
        cutoff = utcnow() - timedelta(seconds=self.alive_s)
        nodes = [
            p
            for p in db.scalars(select(Party).where(Party.role == "service").order_by(Party.name))
            if p.address and self._last_seen(p) >= cutoff
        ]
        if not nodes:
            raise NotFoundError(
                "no aggregator is registered and alive; start one with 'confide aggregator --controller URL'"
            )
        return [{"name": p.name, "address": p.address} for p in nodes[:1]]

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
            .values(head_seq=base + 1, updated_at=utcnow())
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
            created_at=utcnow(),
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
        spec = parse_job(spec_data)
        token = secrets.token_hex(16)  # 128 bits; hex, so a token never looks like a command-line flag
        approvals, spec = self._check_access(caller, spec, "submit", f"job/{spec.job_id}")
        with self.store.transaction() as db:
            routing = cfg.routing_policy(self._aggregators(db))
            configs = cfg.build_configs(spec, session=token, routing=routing)
            now = utcnow()
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
                member = _participant(session.id, name, config["role"])
                member.run = 1  # a member of the first run
                db.add(member)
            self._record_uses(db, session, spec, approvals)
            pending = self._pending_approvals(db, session)
            if pending:
                session.state = "awaiting"
                session.message = "waiting for the owners' approval of " + ", ".join(pending)
        return {"session": token, "job_id": spec.job_id, "seq": 1, "state": session.state}

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
                    db.add(_participant(session.id, name, config["role"]))
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
        now = utcnow()
        clock = self._clock()
        touch = clock - self._seen_written.get(caller.name, -math.inf) >= self.last_seen_write_s
        # Without reports a heartbeat writes one row at most (last_seen_at) and reads the rest:
        # autocommit spares it the BEGIN and COMMIT round trips (the most frequent request).
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
        if reports or utcnow().timestamp() - self._last_sweep >= EXPIRY_SWEEP_S:
            return None
        if self._clock() - self._seen_written.get(caller.name, -math.inf) >= self.last_seen_write_s:
            return None
        now = utcnow()
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
        changes = _light_changes(participant, session, report)
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
        participant.updated_at = utcnow()
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
        pending = [n for n, p in recipients.items() if n in leaves and p.verification.get("run") != session.run]
        if pending:
            return
        problems: list[str] = []
        actual = {}
        for name, expected in sorted(leaves.items()):
            if name not in recipients:
                continue
            reported = recipients[name].verification.get("files", [])
            actual[name] = reported
            for problem in checkpoints.compare(expected, reported):
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


#: A heartbeat's write of the caller's last-seen time (its row count says whether it is registered).
_TOUCH = (
    update(Party)
    .where(Party.name == bindparam("who"))
    .values(last_seen_at=bindparam("at"))
    .execution_options(synchronize_session=False)
)

#: Whether the caller takes part in any session (the heartbeat's read without the ORM).
_ANY_PARTICIPATION = select(Participant.id).where(Participant.name == bindparam("who")).limit(1)

#: The caller's participations with their sessions, without the columns a heartbeat never reads
#: (metrics, checkpoints, verification hashes and log lines can be large; the full path loads them).
_PARTICIPATIONS = (
    select(Participant, JobSession)
    .join(JobSession, Participant.session_id == JobSession.id)
    .where(Participant.name == bindparam("who"))
    .order_by(JobSession.id)
    .options(
        load_only(
            Participant.id,
            Participant.session_id,
            Participant.name,
            Participant.role,
            Participant.applied_seq,
            Participant.run,
            Participant.status,
            Participant.round,
            Participant.error,
            Participant.failure,
            Participant.result,
            Participant.protection,
        )
    )
)

#: Statuses a report may set (anything else is ignored).
REPORTED_STATUSES = ("running", "completed", "failed", "stopped", "verified")


def _light_changes(participant: Participant, session: JobSession, report: dict) -> dict | None:
    """What ``report`` changes of ``participant``, if only its round, ``running`` or applied entry.

    None where :meth:`Controller._apply_report` must apply it; the same outcome as that method
    otherwise (an empty dict: nothing to store).
    """
    changes: dict[str, Any] = {}
    applied = report.get("applied_seq")
    if isinstance(applied, int) and participant.applied_seq < applied <= session.head_seq:
        changes["applied_seq"] = applied
    if report.get("run") != session.run or participant.run != session.run:
        return changes  # about an earlier run, or from a non-member: only the applied entry counts
    status = report.get("status")
    if status in REPORTED_STATUSES and status != participant.status:
        if status != "running":
            return None  # completed, failed, stopped, verified: the checks that follow need the lock
        changes["status"] = status
    if session.state == "running" and participant.status in ("completed", "failed"):
        return None  # the finish check runs again until the session settles
    if (
        str(report.get("error") or "")[:4000] != (participant.error or "")
        or _checked_failure(report.get("failure")) != (participant.failure or {})
        or (isinstance(report.get("result"), dict) and report["result"] != participant.result)
        or (isinstance(report.get("protection"), dict) and report["protection"] != participant.protection)
        or report.get("metrics") is not None
        or isinstance(report.get("log_tail"), list)
        or report.get("checkpoints")
        or (session.state == "verifying" and isinstance(report.get("verification"), list))
    ):
        return None
    if isinstance(report.get("round"), int) and report["round"] != participant.round:
        changes["round"] = report["round"]
    if changes.keys() - {"applied_seq"}:
        changes["updated_at"] = utcnow()
    return changes


#: Algorithms whose parties hold columns; their aggregator relays and checkpoints nothing.
VERTICAL = VERTICAL_ALGORITHMS


def _shown_status(participant: Participant, session: JobSession, relay_only: bool) -> str:
    """A participant's status as ``job status`` shows it.

    An aggregator reports ``running`` for every run it was given (it cannot tell when its parties
    are done): once the session has settled its row shows the session's state, and for a vertical
    job, where it only relays the parties' messages, ``relaying`` while the session runs.
    """
    if participant.role != "aggregator" or participant.status != "running" or participant.run != session.run:
        return participant.status
    if session.state not in ACTIVE:
        return session.state
    return "relaying" if relay_only else participant.status


def _participant(session_id: int, name: str, role: str) -> Participant:
    return Participant(
        session_id=session_id,
        name=name,
        role=role,
        applied_seq=0,
        run=0,
        status="pending",
        round=0,
        error="",
        failure={},
        checkpoints={},
        verification={},
        result={},
        updated_at=utcnow(),
    )


def _first_aggregator(configs: dict) -> str:
    for name, config in sorted(configs.items()):
        if config.get("role") == cfg.ROLE_AGGREGATOR:
            return name
    raise InvalidParameterError("the session has no aggregator configuration")


def _describe(settings: dict, fl_data: dict | None, add_parties: dict | None) -> str:
    parts = [f"{k}={v!r}" for k, v in sorted(settings.items())]
    if fl_data is not None:
        parts.append("new fl_data")
    if add_parties:
        parts.append("added " + ", ".join(sorted(add_parties)))
    return "; ".join(parts)


def _evaluation(participants: list[Participant]) -> dict | None:
    """Each completed party's final held-out metrics, and their mean weighted by held-out rows."""
    parties: dict[str, dict[str, float]] = {}
    for p in participants:
        result = p.result or {}
        if p.role != cfg.ROLE_PARTY or p.status != "completed" or not result.get("test_samples"):
            continue
        metrics = {k: result[k] for k in ("test_auc", "test_accuracy") if isinstance(result.get(k), float)}
        if metrics:
            parties[p.name] = {**metrics, "test_samples": result["test_samples"]}
    if not parties:
        return None
    total = sum(m["test_samples"] for m in parties.values())
    aggregate: dict[str, float] = {"test_samples": total, "parties": len(parties)}
    for key in ("test_auc", "test_accuracy"):
        having = [m for m in parties.values() if key in m]
        if having:
            weight = sum(m["test_samples"] for m in having)
            aggregate[key] = sum(m[key] * m["test_samples"] for m in having) / weight
    return {"parties": parties, "aggregate": aggregate}


def _visible(query, caller: Caller, *, owner, developer):
    """Rows a caller may list: a party those of its datasets, a developer its own, an admin all."""
    if caller.role == "party":
        return query.where(owner == caller.name)
    if caller.role != "admin":
        return query.where(developer == caller.name)
    return query


def _with_agreed(spec: JobSpec, fl_data: Any) -> JobSpec:
    """``spec`` with the FL_Data whose encodings were agreed from the published schemas."""
    if fl_data.version != spec.fl_data_object().version:
        # Every party gets the same categories.
        return parse_job({**spec.model_dump(mode="json"), "fl_data": fl_data.to_dict()})
    return spec


def _deltas(previous: dict, configs: dict) -> dict:
    """Per recipient, the delta from its ``previous`` configuration to ``configs`` (changed ones only)."""
    out = {}
    for name in sorted(previous.keys() | configs.keys()):
        change = cfg.delta(previous.get(name), configs.get(name))
        if change:
            out[name] = change
    return out


def _merged_metrics(stored: list, rows: Any, run: int, who: str) -> list:
    """``stored`` with ``rows`` (one per round, numbers only) merged in by round, the newest kept."""
    if not isinstance(rows, list):
        log.warning("%s: metrics must be a list of rounds; not kept", who)
        return stored
    if len(rows) > MAX_METRIC_ROWS:
        log.warning("%s: %d rounds of metrics in one report, the first %d kept", who, len(rows), MAX_METRIC_ROWS)
    by_round = {row["round"]: row for row in stored}
    for row in rows[:MAX_METRIC_ROWS]:
        if not isinstance(row, dict) or isinstance(row.get("round"), bool) or not isinstance(row.get("round"), int):
            continue
        if row["round"] < 0:
            continue
        clean = {"round": row["round"], "run": run}
        for key in METRIC_KEYS:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                clean[key] = value
        by_round[row["round"]] = clean
    return [by_round[number] for number in sorted(by_round)[-MAX_METRIC_ROUNDS:]]


def _like(text: str) -> str:
    """``text`` as a literal inside a LIKE pattern (escape character backslash)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _checked_failure(value: Any) -> dict:
    """A party's failure report as the controller keeps it (typed; anything else is dropped)."""
    if not value:
        return {}
    try:
        return Failure.model_validate(value).model_dump(mode="json", exclude_none=True)
    except ValueError:
        return {}


def _failure_line(participant: Participant) -> str:
    """``hospital-c failed before round 1 (data, step 'scaled'): ...; next step``."""
    failure = participant.failure or {}
    if not failure:
        return f"{participant.name}: {participant.error}"
    when = f"in round {failure['round']}" if failure.get("round") else "before its first round"
    where = failure["stage"] + (f", step {failure['step']!r}" if failure.get("step") else "")
    where += f", dataset {failure['dataset']}" if failure.get("dataset") else ""
    hint = f"; {failure['hint']}" if failure.get("hint") else ""
    return f"{participant.name} failed {when} ({where}): {failure['message']}{hint}"


def _grant_active(grant: Grant | None, now: datetime, job_id: str | None = None) -> bool:
    """A grant is active unless revoked, expired, or scoped to another job."""
    return (
        grant is not None
        and grant.revoked_at is None
        and (grant.expires_at is None or _aware(grant.expires_at) > now)
        and (job_id is None or grant.job_id is None or grant.job_id == job_id)
    )


def _why_no_grant(grant: Grant | None, now: datetime, job_id: str | None) -> str:
    if grant is None:
        return "never granted"
    if grant.revoked_at is not None:
        return f"revoked by {grant.revoked_by} at {_aware(grant.revoked_at).isoformat()}"
    if grant.expires_at is not None and _aware(grant.expires_at) <= now:
        return f"expired at {_aware(grant.expires_at).isoformat()}"
    return f"granted for job {grant.job_id!r} only, not {job_id!r}"


def _expiry(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidParameterError(f"expires_at must be an ISO 8601 date-time string, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidParameterError(
            f"expires_at must be an ISO 8601 date-time such as 2027-01-31T00:00:00+00:00, got {value!r}"
        ) from None
    if parsed.tzinfo is None:
        raise InvalidParameterError(f"expires_at must name its time zone (e.g. +00:00 or Z), got {value!r}")
    now = utcnow()
    if parsed <= now:
        raise InvalidParameterError(f"expires_at must be in the future, got {value!r} (now {now.isoformat()})")
    if parsed > now + timedelta(days=MAX_GRANT_DAYS):
        raise InvalidParameterError(f"expires_at must be within {MAX_GRANT_DAYS} days, got {value!r}")
    return parsed


def _aware(value):
    # SQLite returns naive datetimes for timezone-aware columns; they were stored as UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def certificate_digest(cert_pem: bytes) -> str:
    """SHA-256 of a certificate's PEM (recorded at registration)."""
    return hashlib.sha256(cert_pem).hexdigest()
