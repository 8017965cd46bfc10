"""The heartbeat's hot path: last-seen writes at most every interval, liveness from the store, light reports."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm.attributes import set_committed_value

from confide.controller import service
from confide.controller import store as store_module
from confide.controller.service import _PARTICIPATIONS, Controller, _light_changes
from confide.controller.store import JobSession, Participant, Party, utcnow
from confide.errors import NotFoundError

from .conftest import AGG, DEV, PARTIES, party


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _stored_last_seen(store, name: str):
    with store.transaction() as db:
        value = db.scalar(select(Party.last_seen_at).where(Party.name == name))
    return service._aware(value)


def _set_last_seen(store, name: str, when) -> None:
    with store.transaction() as db:
        db.execute(update(Party).where(Party.name == name).values(last_seen_at=when))


def _row(rows: list[dict], name: str) -> dict:
    return next(r for r in rows if r["name"] == name)


@pytest.fixture
def workers(store, fed):
    """Two controllers over one store, as two worker processes hold them, each with its own clock."""
    fed.setup()
    first, second = fed.c, Controller(store)
    first._clock, second._clock = Clock(), Clock()
    return first, second


def test_write_interval_is_at_most_a_third_of_alive(store):
    assert Controller(store, alive_s=30).last_seen_write_s == service.LAST_SEEN_WRITE_S
    assert Controller(store, alive_s=3).last_seen_write_s == pytest.approx(1.0)


def test_a_heartbeat_writes_last_seen_at_most_once_per_interval(store, workers):
    first, _ = workers
    name = PARTIES[0]
    long_ago = utcnow() - timedelta(seconds=20)
    _set_last_seen(store, name, long_ago)
    first.sync(party(name), [])
    assert _stored_last_seen(store, name) > long_ago + timedelta(seconds=19)  # the first heartbeat writes

    _set_last_seen(store, name, long_ago)
    first._clock.now += first.last_seen_write_s / 2
    first.sync(party(name), [])
    assert _stored_last_seen(store, name) == long_ago  # within the interval: nothing written
    # ... but this process counts it.
    assert _row(first.parties(AGG), name)["last_seen_s"] < 10

    first._clock.now += first.last_seen_write_s
    first.sync(party(name), [])
    assert _stored_last_seen(store, name) > long_ago + timedelta(seconds=19)


def test_another_worker_reads_liveness_from_the_store(store, workers):
    first, second = workers
    name = PARTIES[0]
    first.sync(party(name), [])
    seen = _row(second.parties(AGG), name)
    assert seen["online"] is True
    assert seen["last_seen_s"] < first.last_seen_write_s + 5


def test_an_agent_that_stops_heartbeating_is_shown_down_by_every_worker(store, workers, monkeypatch):
    first, second = workers
    name = PARTIES[0]
    first.sync(party(name), [])
    first._clock.now += 1
    first.sync(party(name), [])  # within the interval: held in memory only
    later = utcnow() + timedelta(seconds=first.alive_s + 1)
    for controller in workers:
        monkeypatch.setattr(controller, "_now", lambda: later)
    for controller in (first, second):
        row = _row(controller.parties(AGG), name)
        assert row["online"] is False
        assert row["last_seen_s"] > first.alive_s


def test_an_agent_still_heartbeating_stays_up_between_writes(store, workers, monkeypatch):
    first, second = workers
    name = PARTIES[0]
    start = utcnow()
    first.sync(party(name), [])
    # Heartbeats every second for longer than alive_s: the stored time never trails by more than the interval.
    for second_number in range(1, int(first.alive_s) + 10):
        now = start + timedelta(seconds=second_number)
        for controller in workers:
            monkeypatch.setattr(controller, "_now", lambda now=now: now)
        first._clock.now += 1
        first.sync(party(name), [])
        assert _row(second.parties(AGG), name)["online"] is True


def test_a_stopped_aggregator_is_not_offered_to_a_new_job(store, workers, fed, monkeypatch):
    first, _ = workers
    first.sync(AGG, [])
    later = utcnow() + timedelta(seconds=first.alive_s + 1)
    for controller in workers:
        monkeypatch.setattr(controller, "_now", lambda: later)
    with pytest.raises(NotFoundError, match="aggregator is registered and alive"):
        fed.submit()


def test_an_unregistered_agent_is_refused_on_every_heartbeat(controller):
    for _ in range(2):
        with pytest.raises(NotFoundError, match="not registered"):
            controller.sync(party("stranger"), [])


def test_a_failed_heartbeat_leaves_the_next_one_to_write(store, workers):
    first, _ = workers
    name = PARTIES[0]
    long_ago = utcnow() - timedelta(seconds=20)
    _set_last_seen(store, name, long_ago)
    with pytest.raises(Exception, match="session"):
        first.sync(party(name), ["not a report"])
    assert _stored_last_seen(store, name) == long_ago  # rolled back
    first.sync(party(name), [])
    assert _stored_last_seen(store, name) > long_ago + timedelta(seconds=19)


# ---------------------------------------------------------------------------------------------- light reports


def _running(controller, fed):
    token = fed.submit()
    answer = {}
    for caller in (AGG, AGG, *(party(p) for p in PARTIES)):
        [instruction] = controller.sync(caller, [])["instructions"]
        answer[caller.name] = instruction
        controller.sync(
            caller,
            [{"session": token, "applied_seq": instruction["seq"], "run": 1, "status": "running", "round": 0}],
        )
    return token, answer[PARTIES[0]]["seq"]


def _participant(store, token_name: str):
    with store.transaction() as db:
        return db.scalar(select(Participant).where(Participant.name == token_name))


def test_a_round_report_is_stored_without_the_full_path(store, workers, fed, monkeypatch):
    first, _ = workers
    token, seq = _running(first, fed)
    called = []
    monkeypatch.setattr(first, "_apply_report", lambda *args: called.append(args))
    report = {"session": token, "applied_seq": seq, "run": 1, "status": "running", "round": 4}
    first.sync(party(PARTIES[0]), [report])
    assert called == []
    assert _participant(store, PARTIES[0]).round == 4
    first.sync(party(PARTIES[0]), [report])  # nothing new: nothing written, still the light path
    assert called == []


def test_a_failure_report_takes_the_full_path_and_fails_the_session(store, workers, fed):
    first, _ = workers
    token, seq = _running(first, fed)
    report = {"session": token, "applied_seq": seq, "run": 1, "status": "failed", "round": 2, "error": "disk full"}
    first.sync(party(PARTIES[1]), [report])
    status = first.status(DEV, token)
    assert status["state"] == "failed"
    assert f"{PARTIES[1]}: disk full" in status["message"]


def test_a_row_changed_since_it_was_read_falls_back_to_the_full_path(store, workers, fed):
    first, _ = workers
    token, seq = _running(first, fed)
    with store.transaction() as db:
        participant, session = next(
            (p, s) for p, s in db.execute(_PARTICIPATIONS, {"who": PARTIES[0]}).all() if s.token == token
        )
        set_committed_value(participant, "status", "pending")  # as read before a resume reset the row
        report = {"session": token, "applied_seq": seq, "run": 1, "status": "running", "round": 7}
        assert first._apply_light(db, participant, session, report) is False
    assert _participant(store, PARTIES[0]).round == 0  # nothing written by the light path


@pytest.mark.parametrize(
    ("extra", "light"),
    [
        ({}, True),
        ({"round": 3}, True),
        ({"status": "completed"}, False),
        ({"status": "failed", "error": "boom"}, False),
        ({"error": "boom"}, False),
        ({"metrics": [{"round": 1, "loss": 0.5}]}, False),
        ({"checkpoints": [{"round": 2, "files": []}]}, False),
        ({"log_tail": ["a line"]}, False),
        ({"result": {"auc": 0.9}}, False),
        ({"protection": {"mode": "secagg"}}, False),
    ],
)
def test_light_changes(extra, light):
    participant = Participant(
        applied_seq=1, run=1, status="running", round=0, error="", failure={}, result={}, protection={}
    )
    session = JobSession(run=1, head_seq=1, state="running")
    changes = _light_changes(participant, session, {"session": "t", "applied_seq": 1, "run": 1, **extra})
    assert (changes is not None) is light
    if "round" in extra:
        assert changes["round"] == extra["round"]
        assert "updated_at" in changes


def test_a_report_about_an_earlier_run_only_moves_the_applied_entry():
    participant = Participant(applied_seq=1, run=2, status="pending", round=0, error="", failure={}, result={})
    session = JobSession(run=2, head_seq=3, state="running")
    changes = _light_changes(participant, session, {"session": "t", "applied_seq": 3, "run": 1, "status": "failed"})
    assert changes == {"applied_seq": 3}


# ---------------------------------------------------------------------------------------------- read-only heartbeats


def test_a_heartbeat_that_writes_nothing_is_answered_by_the_read_only_path(store, workers, fed):
    first, _ = workers
    caller = party(PARTIES[0])
    first.sync(caller, [])  # writes last_seen_at (and sweeps): the next ones within the interval write nothing
    first._last_sweep = utcnow().timestamp()
    assert first.sync_read_only(caller, []) == first.sync(caller, []) == {"instructions": []}
    token, _ = _running(first, fed)
    first._last_sweep = utcnow().timestamp()
    answer = first.sync_read_only(caller, [])
    assert answer == first.sync(caller, [])
    assert [instruction["session"] for instruction in answer["instructions"]] == [token]
    # What may write goes to sync(): reports, a due last-seen write, a due expiry sweep.
    assert first.sync_read_only(caller, [{"session": token}]) is None
    first._clock.now += first.last_seen_write_s
    assert first.sync_read_only(caller, []) is None
    first.sync(caller, [])
    first._last_sweep = 0.0
    assert first.sync_read_only(caller, []) is None


def test_an_unregistered_agent_gets_no_read_only_answer(controller):
    assert controller.sync_read_only(party("stranger"), []) is None  # sync() refuses it


def test_the_read_only_path_never_waits_and_replaces_a_failed_connection(store, workers, monkeypatch):
    first, _ = workers
    caller = party(PARTIES[0])
    first.sync(caller, [])
    first._last_sweep = utcnow().timestamp()
    assert first.sync_read_only(caller, []) == {"instructions": []}
    with store._reader_lock:  # another thread reads: no waiting, sync() in a thread answers
        assert first.sync_read_only(caller, []) is None
    broken = store._reader

    def fail(*_args, **_kwargs):
        raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(broken, "execute", fail)
    assert first.sync_read_only(caller, []) is None
    assert store._reader is None
    assert first.sync_read_only(caller, []) == {"instructions": []}  # on a new connection
    assert store._reader is not broken


def test_a_pooled_connection_that_idled_is_pinged_and_replaced_when_its_server_went_away(store, monkeypatch):
    if store.dialect != "postgresql":
        pytest.skip("SQLite has no server to lose")
    monkeypatch.setattr(store_module, "PING_IDLE_S", 0.0)
    with store.engine.connect() as connection, store.engine.connect():  # two pooled connections
        backend = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    with store.engine.connect() as admin:  # the other one (the pool hands them out in turn)
        assert admin.exec_driver_sql("SELECT pg_backend_pid()").scalar() != backend
        admin.exec_driver_sql(f"SELECT pg_terminate_backend({backend})")
        admin.commit()
    for _ in range(3):  # the dead one fails its ping on checkout and is replaced: no request fails
        with store.transaction() as db:
            assert db.execute(select(func.pg_backend_pid())).scalar() != backend
