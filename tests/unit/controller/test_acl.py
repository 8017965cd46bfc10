"""Access control: grants decide which developer may use which dataset; every decision is audited."""

from __future__ import annotations

import pytest

from confide.controller.service import Controller
from confide.errors import (
    DataAccessDeniedError,
    InvalidParameterError,
    NotFoundError,
    PermissionDeniedError,
)

from .conftest import ADMIN, AGG, DEV, OTHER_DEV, PARTIES, dataset, job, party


def _last(controller, action):
    return [e for e in controller.audit(ADMIN) if e["action"] == action][-1]


def test_submit_without_grant_is_denied_and_audited(controller, fed):
    fed.setup(grant=False)
    with pytest.raises(DataAccessDeniedError) as raised:
        fed.submit()
    message = str(raised.value)
    assert "hospital-a/records" in message and "'dev'" in message
    event = _last(controller, "submit")
    assert event["decision"] == "deny" and event["actor"] == "dev" and event["target"] == "job/job-1"
    assert {c["decision"] for c in event["detail"]["checks"]} == {"deny"}
    assert controller.sessions(ADMIN) == []  # the denial is all that is stored


def test_grant_allows_and_revoke_denies_again(controller, fed):
    fed.setup(grant=False)
    for name in PARTIES:
        assert fed.grant(name) == {
            "dataset": f"{name}/records",
            "developer": "dev",
            "active": True,
            "expires_at": None,
            "job_id": None,
            "approval": False,
        }
    token = fed.submit()
    assert _last(controller, "submit")["decision"] == "allow"
    assert [s["session"] for s in controller.sessions(DEV)] == [token]

    assert controller.revoke(party("hospital-b"), dataset="records", developer="dev")["active"] is False
    with pytest.raises(DataAccessDeniedError, match="hospital-b/records"):
        fed.submit()
    head = controller.status(DEV, token)["head_seq"]
    with pytest.raises(DataAccessDeniedError, match="hospital-b/records"):
        controller.tune(DEV, token, settings={"model.learning_rate": 0.05})
    assert controller.status(DEV, token)["head_seq"] == head
    assert _last(controller, "tune-access")["decision"] == "deny"
    # Granting again restores access.
    fed.grant("hospital-b")
    assert controller.tune(DEV, token, settings={"model.learning_rate": 0.05})["seq"] == head + 1


def test_revoking_what_was_never_granted(controller, fed):
    fed.register_party("hospital-a")
    with pytest.raises(NotFoundError, match="no active grant"):
        controller.revoke(party("hospital-a"), dataset="records", developer="dev")


def test_unknown_party(controller, fed):
    fed.setup()
    with pytest.raises(NotFoundError, match="hospital-z"):
        fed.submit(job(("hospital-a", "hospital-z")))
    assert _last(controller, "submit")["decision"] == "deny"


def test_unknown_dataset(controller, fed):
    fed.setup()
    with pytest.raises(NotFoundError, match="hospital-a/missing"):
        fed.submit(job(dataset_name="missing"))


def test_missing_label_column(controller, fed):
    fed.setup()
    with pytest.raises(InvalidParameterError, match=r"fl_data\.label: column .outcome."):
        fed.submit(job(label="outcome"))
    assert controller.sessions(ADMIN) == []


def test_job_without_fl_data_is_refused(controller, fed):
    fed.setup()
    with pytest.raises(InvalidParameterError, match="fl_data"):
        fed.submit({"job_id": "job-1", "parties": list(PARTIES)})


def test_submit_needs_an_alive_aggregator(store, fed):
    for name in PARTIES:
        fed.register_party(name)
        fed.grant(name)
    with pytest.raises(NotFoundError, match="no aggregator"):
        fed.submit()
    fed.register_aggregator()
    with pytest.raises(NotFoundError, match="no aggregator"):
        Controller(store, alive_s=0.0).submit(DEV, job())  # registered, but not heard from recently
    assert fed.submit()


def test_party_grants_only_its_own_datasets(controller, fed):
    fed.register_party("hospital-a")
    fed.register_party("hospital-b", [dataset("b-only")])
    with pytest.raises(NotFoundError, match="hospital-a/b-only"):
        controller.grant(party("hospital-a"), dataset="b-only", developer="dev")
    assert controller.grants(DEV) == []
    with pytest.raises(NotFoundError):
        controller.revoke(party("hospital-a"), dataset="b-only", developer="dev")


@pytest.mark.parametrize("caller", [DEV, ADMIN, AGG])
def test_only_parties_grant(controller, fed, caller):
    fed.register_party("hospital-a")
    with pytest.raises(PermissionDeniedError, match="party"):
        controller.grant(caller, dataset="records", developer="dev")
    with pytest.raises(PermissionDeniedError):
        controller.revoke(caller, dataset="records", developer="dev")
    assert controller.grants(ADMIN) == []


def test_parties_may_not_submit(controller, fed):
    fed.setup()
    with pytest.raises(PermissionDeniedError):
        controller.submit(party("hospital-a"), job())


def test_grant_names_are_checked(controller, fed):
    fed.register_party("hospital-a")
    with pytest.raises(InvalidParameterError, match="developer"):
        controller.grant(party("hospital-a"), dataset="records", developer="Not Valid")


def test_grants_and_audit_views(controller, fed):
    fed.setup()
    fed.grant("hospital-a", developer="eve")
    assert {g["developer"] for g in controller.grants(party("hospital-a"))} == {"dev", "eve"}
    assert [g["dataset"] for g in controller.grants(party("hospital-b"))] == ["hospital-b/records"]
    assert {g["dataset"] for g in controller.grants(DEV)} == {"hospital-a/records", "hospital-b/records"}
    assert [g["dataset"] for g in controller.grants(OTHER_DEV)] == ["hospital-a/records"]
    assert len(controller.grants(ADMIN)) == 3
    # A party sees the decisions about its own datasets; a developer its own actions only.
    assert {e["target"] for e in controller.audit(party("hospital-b"))} >= {"hospital-b/records"}
    assert all(e["actor"] == "dev" for e in controller.audit(DEV))
    everything = controller.audit(ADMIN)
    assert [e["id"] for e in everything] == sorted(e["id"] for e in everything)
    assert controller.audit(ADMIN, after=everything[-2]["id"]) == everything[-1:]
    with pytest.raises(InvalidParameterError, match="limit"):
        controller.audit(ADMIN, limit=0)


def test_each_dataset_decision_is_counted_for_prometheus(controller, fed):
    from prometheus_client import REGISTRY

    def count(decision: str) -> float:
        return REGISTRY.get_sample_value("confide_grant_decisions_total", {"decision": decision}) or 0.0

    denied, allowed = count("deny"), count("allow")
    fed.setup(grant=False)
    with pytest.raises(DataAccessDeniedError):
        fed.submit()
    assert count("deny") - denied == len(PARTIES) and count("allow") == allowed
    for name in PARTIES:
        fed.grant(name)
    fed.submit()
    assert count("allow") - allowed == len(PARTIES)
