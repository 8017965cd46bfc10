"""Jobs as sessions: a committed log of per-recipient configurations and the deltas between them."""

from __future__ import annotations

import threading

import pytest

from confide.controller import sessions as cfg
from confide.errors import (
    ConflictError,
    DataAccessDeniedError,
    InvalidParameterError,
    NotFoundError,
    PermissionDeniedError,
)

from .conftest import ADMIN, DEV, OTHER_DEV, PARTIES

LR_PATH = ["spec", "model", "learning_rate"]


@pytest.fixture
def token(fed) -> str:
    fed.setup()
    return fed.submit()


def _entries(controller, token):
    return controller.log(DEV, token)


def test_submit_creates_entry_one_for_every_recipient(controller, token):
    [first] = _entries(controller, token)
    assert first["seq"] == 1 and first["kind"] == "submit" and first["actor"] == "dev"
    entry = controller.entry(DEV, token, 1)
    assert set(entry["configs"]) == {*PARTIES, "aggregator"}
    for name in PARTIES:
        config = entry["configs"][name]
        assert config["role"] == "party" and config["session"] == token
        assert config["dataset"] == "records"
        assert config["routing"]["nodes"] == [{"name": "aggregator", "address": "127.0.0.1:7000"}]
    assert entry["configs"]["aggregator"]["role"] == "aggregator"
    assert entry["configs"]["aggregator"]["parties"] == list(PARTIES)
    # The first delta of every recipient is its whole configuration.
    for name, config in entry["configs"].items():
        assert entry["deltas"][name] == [{"op": "set", "path": [], "value": config}]
        assert first["config_digests"][name] == cfg.config_digest(config)
    status = controller.status(DEV, token)
    assert status["state"] == "running" and status["run"] == 1 and status["head_seq"] == 1
    assert [p["name"] for p in status["participants"]] == sorted([*PARTIES, "aggregator"])


def test_tuning_the_model_changes_only_the_parties(controller, token):
    answer = controller.tune(DEV, token, settings={"model.learning_rate": 0.05})
    assert answer["seq"] == 2
    entry = controller.entry(DEV, token, 2)
    assert entry["deltas"] == {name: [{"op": "set", "path": LR_PATH, "value": 0.05}] for name in PARTIES}
    assert "aggregator" not in entry["deltas"]
    assert entry["spec"]["model"]["learning_rate"] == 0.05
    assert [e["kind"] for e in _entries(controller, token)] == ["submit", "tune"]
    before = controller.entry(DEV, token, 1)["configs"]
    for name, config in entry["configs"].items():
        assert cfg.apply_delta(before[name], entry["deltas"].get(name, [])) == config


def test_tuning_a_timeout_reaches_the_aggregator(controller, token):
    controller.tune(DEV, token, settings={"transport.round_timeout_s": 30.0})
    deltas = controller.entry(DEV, token, 2)["deltas"]
    assert deltas["aggregator"] == [{"op": "set", "path": ["round_timeout_s"], "value": 30.0}]
    for name in PARTIES:
        assert deltas[name] == [{"op": "set", "path": ["spec", "transport", "round_timeout_s"], "value": 30.0}]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"model.learning_rate": -1}, "model.learning_rate"),
        ({"model.momentum": 0.9}, "model.momentum"),
        ({"rounds": "ten"}, "rounds"),
        ({"protection.mode": "rot13"}, "protection.mode"),
        ({"job_id": "other"}, "job_id"),
        ({"parties": ["x", "y"]}, "parties"),
        ({"model..x": 1}, "model..x"),
    ],
)
def test_bad_tuning_is_refused_naming_the_field_and_stores_nothing(controller, token, settings, field):
    with pytest.raises(InvalidParameterError, match=field.replace(".", r"\.")):
        controller.tune(DEV, token, settings=settings)
    assert controller.status(DEV, token)["head_seq"] == 1
    assert len(_entries(controller, token)) == 1


def test_empty_tuning_is_refused(controller, token):
    with pytest.raises(InvalidParameterError, match="must change something"):
        controller.tune(DEV, token, settings={})


def test_stale_base_seq_conflicts_and_stores_nothing(controller, token):
    controller.tune(DEV, token, settings={"model.learning_rate": 0.05}, base_seq=1)
    audit_before = len(controller.audit(ADMIN, limit=10_000))
    with pytest.raises(ConflictError, match="entry 1"):
        controller.tune(DEV, token, settings={"model.learning_rate": 0.07}, base_seq=1)
    assert controller.status(DEV, token)["head_seq"] == 2
    assert controller.entry(DEV, token, 2)["spec"]["model"]["learning_rate"] == 0.05
    assert len(controller.audit(ADMIN, limit=10_000)) == audit_before


def test_concurrent_tunings_exactly_one_wins(controller, token):
    threads_count = 6
    barrier = threading.Barrier(threads_count)
    outcomes: list = [None] * threads_count

    def tune(index: int) -> None:
        barrier.wait(timeout=30)
        try:
            outcomes[index] = controller.tune(
                DEV, token, settings={"model.learning_rate": 0.01 * (index + 1)}, base_seq=1
            )
        except Exception as error:  # noqa: BLE001 - collected and checked below
            outcomes[index] = error

    threads = [threading.Thread(target=tune, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    wins = [o for o in outcomes if isinstance(o, dict)]
    losses = [o for o in outcomes if not isinstance(o, dict)]
    assert len(wins) == 1, outcomes
    assert all(isinstance(o, ConflictError) for o in losses), losses
    entries = _entries(controller, token)
    assert [e["seq"] for e in entries] == [1, 2]
    assert controller.status(DEV, token)["head_seq"] == 2
    winner_lr = controller.entry(DEV, token, 2)["spec"]["model"]["learning_rate"]
    assert wins[0]["deltas"]["hospital-a"] == [{"op": "set", "path": LR_PATH, "value": winner_lr}]


def test_another_developer_may_not_touch_the_session(controller, token):
    with pytest.raises(PermissionDeniedError, match="belongs to 'dev'"):
        controller.tune(OTHER_DEV, token, settings={"model.learning_rate": 0.05})
    for read in (controller.status, controller.log, controller.resume, controller.cancel):
        with pytest.raises(PermissionDeniedError):
            read(OTHER_DEV, token)
    assert controller.sessions(OTHER_DEV) == []
    assert controller.status(DEV, token)["head_seq"] == 1
    assert controller.status(ADMIN, token)["owner"] == "dev"  # an admin sees every session


def test_unknown_session_and_entry(controller, token):
    with pytest.raises(NotFoundError, match="no session"):
        controller.status(DEV, "nope")
    with pytest.raises(NotFoundError, match="no entry 9"):
        controller.entry(DEV, token, 9)


def test_add_party_needs_registration_and_grant_and_gets_a_full_config(controller, fed, token):
    with pytest.raises(NotFoundError, match="hospital-c"):
        controller.tune(DEV, token, add_parties={"hospital-c": {"dataset": "records"}})
    fed.register_party("hospital-c")
    with pytest.raises(DataAccessDeniedError, match="hospital-c/records"):
        controller.tune(DEV, token, add_parties={"hospital-c": {"dataset": "records"}})
    assert controller.status(DEV, token)["head_seq"] == 1
    fed.grant("hospital-c")
    with pytest.raises(InvalidParameterError, match="already a participant"):
        controller.tune(DEV, token, add_parties={"hospital-a": {"dataset": "records"}})

    answer = controller.tune(DEV, token, add_parties={"hospital-c": {"dataset": "records"}})
    entry = controller.entry(DEV, token, answer["seq"])
    new = entry["configs"]["hospital-c"]
    assert entry["deltas"]["hospital-c"] == [{"op": "set", "path": [], "value": new}]
    assert new["role"] == "party" and new["dataset"] == "records"
    assert new["routing"] == entry["configs"]["hospital-a"]["routing"]  # same routes as the others
    assert entry["spec"]["parties"] == ["hospital-a", "hospital-b", "hospital-c"]
    assert {"op": "set", "path": ["parties"], "value": ["hospital-a", "hospital-b", "hospital-c"]} in entry["deltas"][
        "aggregator"
    ]
    assert "hospital-c" in [p["name"] for p in controller.status(DEV, token)["participants"]]


def test_cancel_and_resume_without_checkpoint(controller, token):
    assert controller.cancel(DEV, token) == {"session": token, "seq": 2, "state": "cancelled"}
    with pytest.raises(InvalidParameterError, match="not running"):
        controller.cancel(DEV, token)
    answer = controller.resume(DEV, token)
    assert answer["state"] == "running" and answer["run"] == 2 and answer["resume_round"] == 0
    assert [e["kind"] for e in _entries(controller, token)] == ["submit", "cancel", "resume"]
    assert all(e["deltas"] == {} for e in _entries(controller, token)[1:])


def test_tuning_a_running_session_restarts_it(controller, token):
    answer = controller.tune(DEV, token, settings={"rounds": 20})
    assert answer["restarted"] is True
    status = controller.status(DEV, token)
    assert status["run"] == 2 and status["state"] == "running"


def test_an_aggregators_row_follows_the_session_it_serves():
    from types import SimpleNamespace

    from confide.controller.service import _shown_status

    aggregator = SimpleNamespace(role="aggregator", status="running", run=2)
    party = SimpleNamespace(role="party", status="running", run=2)
    running, done = SimpleNamespace(state="running", run=2), SimpleNamespace(state="completed", run=2)
    assert _shown_status(aggregator, running, relay_only=True) == "relaying"  # a vertical job: it relays
    assert _shown_status(aggregator, running, relay_only=False) == "running"
    assert _shown_status(aggregator, done, relay_only=False) == "completed"
    assert _shown_status(aggregator, SimpleNamespace(state="failed", run=2), relay_only=True) == "failed"
    assert _shown_status(party, done, relay_only=True) == "running"  # a party speaks for itself
    assert _shown_status(SimpleNamespace(role="aggregator", status="running", run=1), done, True) == "running"
