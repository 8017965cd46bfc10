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

The operations are split by concern, one module each, composed here: registry (identities and
dataset metadata), access (grants, approvals, uses, audit, access checks), lifecycle (sessions and
their log), agents (heartbeats, reports, instructions); common holds what they share.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

from sqlalchemy import func, select

from confide.controller.access import Access
from confide.controller.agents import AgentSync
from confide.controller.common import (  # noqa: F401 - re-exported: the API, console and tests import them here
    _PARTICIPATIONS,
    ACTIVE,
    LAST_SEEN_WRITE_S,
    Caller,
    _aware,
    _light_changes,
    _shown_status,
    certificate_digest,
)
from confide.controller.lifecycle import Lifecycle
from confide.controller.registry import Registry
from confide.controller.store import JobSession, Participant, Store, utcnow
from confide.controller.tracked import SessionTracking

__all__ = ["Caller", "Controller", "certificate_digest"]


class Controller(Registry, Access, Lifecycle, AgentSync, SessionTracking):
    """Registry, access control, sessions and their logs."""

    def __init__(self, store: Store, *, alive_s: float = 30.0, tracking_dir=None) -> None:
        self.store = store
        #: Where MLflow records of completed sessions wait for a server that was not reached.
        self.tracking_dir = tracking_dir
        # Per thread: the sessions its open transaction completed (recorded once it commits).
        self._tracking_queue = threading.local()
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
        self._now = utcnow  # the clock of stored times and expiry (tests move it)

    def queue_depths(self) -> dict[str, float]:
        """What waits here, read at each metrics scrape (``confide_controller_queue``).

        ``sessions_<state>`` for the states a session waits in (running, verifying, awaiting), and
        ``configs_unapplied``: recipients of an active session that have not applied its newest
        configuration yet (an agent or aggregator node behind, or away).
        """
        waiting = ("running", "verifying", "awaiting")
        depths = {f"sessions_{state}": 0.0 for state in waiting}
        with self.store.transaction() as db:
            counted = db.execute(
                select(JobSession.state, func.count()).where(JobSession.state.in_(waiting)).group_by(JobSession.state)
            )
            for state, count in counted:
                depths[f"sessions_{state}"] = float(count)
            behind = db.scalar(
                select(func.count())
                .select_from(Participant)
                .join(JobSession, Participant.session_id == JobSession.id)
                .where(JobSession.state.in_(ACTIVE), Participant.applied_seq < JobSession.head_seq)
            )
        depths["configs_unapplied"] = float(behind or 0)
        return depths
