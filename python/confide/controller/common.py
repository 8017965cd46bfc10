"""What the controller's operations share: the caller, the limits and states, the helpers.

:mod:`confide.controller.service` composes the :class:`~confide.controller.service.Controller`
from one class per concern (:mod:`~confide.controller.registry`, :mod:`~confide.controller.access`,
:mod:`~confide.controller.lifecycle`, :mod:`~confide.controller.agents`); this module holds what
more than one of them uses. Stored times come from the controller's own clock (``Controller._now``),
which the helpers that stamp rows take as an argument.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import load_only

from confide.controller import sessions as cfg
from confide.controller.store import (
    Grant,
    JobSession,
    Participant,
    Party,
    utcnow,
)
from confide.errors import (
    InvalidParameterError,
    PermissionDeniedError,
)
from confide.reports import METRIC_KEYS, Failure
from confide.spec import VERTICAL_ALGORITHMS, JobSpec, parse_job

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


def _light_changes(
    participant: Participant, session: JobSession, report: dict, now: datetime | None = None
) -> dict | None:
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
        changes["updated_at"] = now or utcnow()
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


def _participant(session_id: int, name: str, role: str, now: datetime) -> Participant:
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
        updated_at=now,
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


def _expiry(value: Any, now: datetime) -> datetime | None:
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
