"""Completed sessions recorded in MLflow, where their job names a tracking server (docs/tracking.md).

The controller is the developer's side of a session: when a session whose specification has a
``tracking`` section completes, the controller process that saw it complete gathers the record
(:func:`confide.tracking.session_record`: the specification, the parties' per-round figures
combined, the federated evaluation, the protection that ran, the lineage from the session log)
and sends it from a background thread, so no agent's heartbeat waits for MLflow. A server that
cannot be reached never changes the session: a warning names it in the controller's log and in
the session log (a ``tracking`` entry), and the record waits in the controller's
``tracking_dir`` for ``confide tracking replay`` (or is dropped, as the job says).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from sqlalchemy import select

from confide.controller.common import Caller, _evaluation
from confide.controller.store import DatasetUse, JobSession, Participant
from confide.spec import parse_job

__all__ = ["SessionTracking"]

log = logging.getLogger("confide.controller")


class SessionTracking:
    """The controller's part that records completed sessions in MLflow."""

    #: Where records wait for a server that was not reached (set by the server; None: the
    #: working directory's ``tracking-pending``).
    tracking_dir: Path | None = None

    def _tracking_due(self, token: str) -> None:
        """Record ``token`` once the transaction that completed it (in this thread) has committed."""
        self._tracking_queue.__dict__.setdefault("tokens", []).append(token)

    def _track_completed(self, committed: bool = True) -> None:
        """Start recording every session this thread's committed transaction completed (a thread each)."""
        tokens = self._tracking_queue.__dict__.pop("tokens", [])
        for token in tokens if committed else ():
            threading.Thread(
                target=self._track_session, args=(token,), name=f"tracking-{token[:8]}", daemon=True
            ).start()

    def _track_session(self, token: str) -> dict | None:
        """Gather and send the record of a completed session; returns what was done (never raises)."""
        from confide import tracking

        try:
            with self.store.transaction() as db:
                session = db.scalar(select(JobSession).where(JobSession.token == token))
                spec = parse_job(self._head(db, session).spec)
                participants = list(
                    db.scalars(
                        select(Participant).where(Participant.session_id == session.id, Participant.role == "party")
                    )
                )
                uses = db.scalars(select(DatasetUse).where(DatasetUse.session_id == session.id).order_by(DatasetUse.id))
                grants = [
                    f"{u.owner}/{u.dataset} to {u.developer}"
                    + (" (approved for this job)" if u.approved_at is not None else "")
                    for u in uses
                ]
                latest = self._latest_checkpoint(db, session)
                root = latest.checkpoint.get("root") if latest is not None else None
                run = session.run
                rows = [
                    {"name": p.name, "metrics": p.metrics, "result": p.result, "protection": p.protection}
                    for p in participants
                    if p.run == run
                ]
                evaluation = _evaluation(participants)
            record = tracking.session_record(
                spec,
                session=token,
                run=run,
                participants=rows,
                grants=grants,
                checkpoint_root=root,
                evaluation=evaluation,
            )
            notes: list[str] = []
            folder = self.tracking_dir or Path("tracking-pending")
            outcome: dict = {}
            if spec.tracking.tensorboard:
                outcome.update(tracking.tensorboard_files(record, folder.parent / "tensorboard", echo=notes.append))
            if spec.tracking.mlflow_uri is not None:
                pending = folder / f"{token}.{tracking.PENDING}"
                outcome.update(tracking.deliver(record, spec.tracking, pending, echo=notes.append))
        except Exception as error:  # noqa: BLE001 - recording never changes a session
            log.warning("session %s: not recorded in MLflow: %s: %s", token, type(error).__name__, error)
            return None
        for note in notes:
            (log.warning if note.startswith("warning") else log.info)("session %s: %s", token, note)
        try:
            with self.store.transaction() as db:
                session = db.scalar(select(JobSession).where(JobSession.token == token).with_for_update())
                self._append_event(db, session, Caller("controller", "admin"), "tracking", note="; ".join(notes))
        except Exception as error:  # noqa: BLE001 - the record was sent; only its log line is missing
            log.warning("session %s: tracking entry not logged: %s", token, error)
        return outcome
