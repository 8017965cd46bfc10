"""The controller's grants, approvals, dataset uses, the audit log and the access checks at submission.

One concern of :class:`confide.controller.service.Controller` (a mixin: its methods use the
controller's store, clock and caches set in ``Controller.__init__``).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from confide import metrics
from confide.controller.common import (
    ACTIVE,
    EXPIRY_SWEEP_S,
    REFUSAL_AUDIT_S,
    Caller,
    _aware,
    _check_name,
    _expiry,
    _grant_active,
    _like,
    _require,
    _visible,
    _why_no_grant,
    _with_agreed,
    log,
)
from confide.controller.store import (
    AuditEvent,
    Dataset,
    DatasetUse,
    Grant,
    JobSession,
    Party,
)
from confide.data.schemas import agree_categories, check_schemas
from confide.errors import (
    DataAccessDeniedError,
    InvalidParameterError,
    NotFoundError,
)
from confide.spec import JobSpec, parse_job


class Access:
    """Grants, approvals, dataset uses, the audit log and the access checks at submission."""

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
        expires = _expiry(expires_at, self._now())
        if job_id is not None and (not isinstance(job_id, str) or not 1 <= len(job_id) <= 128):
            raise InvalidParameterError(f"job_id must be a string of 1..128 characters, got {job_id!r}")
        if not isinstance(approval, bool):
            raise InvalidParameterError(f"approval must be true or false, got {approval!r}")
        with self.store.transaction() as db:
            row = self._own_dataset(db, caller, dataset)
            existing = db.scalar(select(Grant).where(Grant.dataset_id == row.id, Grant.developer == developer))
            if existing is None:
                existing = Grant(dataset_id=row.id, developer=developer, granted_by=caller.name, granted_at=self._now())
                db.add(existing)
            else:
                existing.granted_by, existing.granted_at = caller.name, self._now()
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
            existing.revoked_at, existing.revoked_by = self._now(), caller.name
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
            now = self._now()
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
                    since=self._now(),
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
        if self._now().timestamp() - self._last_sweep < EXPIRY_SWEEP_S or not self._sweeping.acquire(blocking=False):
            return
        try:
            with self.store.transaction() as db:
                self._sweep_expired(db)
        finally:
            self._sweeping.release()

    def _sweep_expired(self, db: Session) -> None:
        """Stop live sessions whose grant lapsed (checked at most every EXPIRY_SWEEP_S)."""
        now = self._now()
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
        now = self._now()
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

    def _audit(self, db: Session, caller: Caller, action: str, target: str, decision: str, detail: dict) -> None:
        if caller.account is not None:
            detail = {**detail, "account": caller.account}
        db.add(
            AuditEvent(
                at=self._now(), actor=caller.name, action=action, target=target[:255], decision=decision, detail=detail
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
                    # The owner's view: every attempt to use its dataset, with the request's final
                    # decision: a granted dataset of a refused request was not used (a deny, why).
                    detail = {"job_id": spec.job_id, "request": target, **decision}
                    if problem is not None and decision["decision"] == "allow":
                        detail = {**detail, **_refused_use(decision["dataset"], decisions)}
                    self._audit(db, caller, f"use:{action}", decision["dataset"], detail["decision"], detail)
                    metrics.GRANT_DECISIONS.labels(detail["decision"]).inc()
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
        now = self._now()
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
                problems = check_schemas(
                    fl_data, schemas, vertical=spec.vertical_layout(), scoring=spec.score is not None
                )
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
            spec = parse_job(self._scoring_request(caller, spec_data))
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
        cutoff = self._now() - timedelta(seconds=self.alive_s)
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


def _refused_use(dataset: str, decisions: list[dict]) -> dict:
    """The audit detail of a granted dataset whose request was refused: denied, and why."""
    schema = next((d for d in decisions if d.get("reason") == "schema"), None)
    if schema is not None:
        own = [text for text in schema["problems"] if text.startswith(f"{dataset}:") or text.startswith(f"{dataset},")]
        return {
            "decision": "deny",
            "grant": "allow",
            "reason": "schema" if own else "schema (another dataset of the request)",
            "problems": own,
        }
    others = [d.get("dataset") or d.get("party") for d in decisions if d["decision"] == "deny"]
    return {
        "decision": "deny",
        "grant": "allow",
        "reason": f"the request was refused: {', '.join(map(str, others))} denied",
    }
