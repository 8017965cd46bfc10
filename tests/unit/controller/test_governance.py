"""A data owner's "no" stops use; owners see every use; grants scoped, expiring, approved per job;
failures reach the developer as structured reports; jobs are checked against published schemas."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from confide.errors import DataAccessDeniedError, InvalidParameterError, NotFoundError, PermissionDeniedError

from .conftest import ADMIN, DEV, OTHER_DEV, PARTIES, SCHEMA, dataset, job, party
from .test_sync import Agent, _start

RECIPIENTS = ("aggregator", *PARTIES)


@pytest.fixture
def running(controller, fed):
    fed.setup()
    token = fed.submit()
    agents = {name: Agent(controller, name) for name in RECIPIENTS}
    _start(token, agents)
    return token, agents


def _uses(controller, caller):
    return [(u["session"], u["dataset"], u["developer"], u["state"]) for u in controller.uses(caller)]


def test_revoking_stops_the_session_and_tells_its_parties_why(controller, running):
    token, agents = running
    answer = controller.revoke(party("hospital-b"), dataset="records", developer="dev")
    assert answer["stopped"] == [token]
    status = controller.status(DEV, token)
    assert status["state"] == "revoked"
    assert "hospital-b revoked dev's grant" in status["message"] and "hospital-b/records" in status["message"]
    for name in PARTIES:
        instruction = agents[name].sync(token, run=1, status="running")
        assert instruction["command"] == "stop" and "revoked" in instruction["reason"]
        assert instruction["state"] == "revoked"
    log = controller.log(DEV, token)
    assert log[-1]["kind"] == "revoked" and log[-1]["actor"] == "hospital-b"
    # Resume and tune are refused until a new grant; the refusal is audited.
    with pytest.raises(DataAccessDeniedError, match=r"hospital-b/records \(revoked by hospital-b"):
        controller.resume(DEV, token)
    # An admin resumes on the owner's grants, and the audit names the admin.
    with pytest.raises(DataAccessDeniedError, match="'dev' has no grant for dataset hospital-b/records"):
        controller.resume(ADMIN, token)
    assert [e for e in controller.audit(ADMIN) if e["action"] == "resume-access"][-1]["actor"] == "runner"
    with pytest.raises(DataAccessDeniedError, match="hospital-b/records"):
        controller.tune(DEV, token, settings={"model.learning_rate": 0.05})
    assert controller.status(DEV, token)["state"] == "revoked"
    denied = [e for e in controller.audit(party("hospital-b")) if e["action"] == "use:resume-access"]
    assert [(e["actor"], e["decision"]) for e in denied] == [("dev", "deny"), ("runner", "deny")]
    stopped = [e for e in controller.audit(party("hospital-b")) if e["action"] == "stop-session"]
    assert stopped and stopped[-1]["detail"]["session"] == token
    # Granting again allows the resume.
    controller.grant(party("hospital-b"), dataset="records", developer="dev")
    assert controller.resume(DEV, token)["state"] == "running"


def test_revoking_one_developer_leaves_anothers_session_running(controller, fed, running):
    token, _ = running
    for name in PARTIES:
        fed.grant(name, developer=OTHER_DEV.name)
    other = fed.submit(caller=OTHER_DEV)
    assert controller.revoke(party("hospital-a"), dataset="records", developer="eve")["stopped"] == [other]
    assert controller.status(DEV, token)["state"] == "running"
    assert controller.status(OTHER_DEV, other)["state"] == "revoked"


def test_owners_see_every_use_of_their_data_and_may_read_those_sessions(controller, fed, running):
    token, _ = running
    assert _uses(controller, party("hospital-a")) == [(token, "hospital-a/records", "dev", "running")]
    [use] = controller.uses(party("hospital-a"))
    assert use["job_id"] == "job-1" and use["approval"] == "not needed" and use["pipeline"] == []
    # `job list` for a party lists the sessions using its data; status and log are readable.
    assert [s["session"] for s in controller.sessions(party("hospital-a"))] == [token]
    assert controller.status(party("hospital-a"), token)["owner"] == "dev"
    assert controller.log(party("hospital-a"), token)[0]["kind"] == "submit"
    with pytest.raises(PermissionDeniedError):
        controller.cancel(party("hospital-a"), token)  # reading is not acting
    # A party whose data the session does not use sees nothing of it.
    fed.register_party("clinic-z")
    assert controller.uses(party("clinic-z")) == [] and controller.sessions(party("clinic-z")) == []
    with pytest.raises(PermissionDeniedError):
        controller.status(party("clinic-z"), token)
    # The owner's audit view shows the developer's submission of a job on its dataset.
    uses = [e for e in controller.audit(party("hospital-a")) if e["action"] == "use:submit"]
    assert uses and uses[-1]["actor"] == "dev" and uses[-1]["target"] == "hospital-a/records"


def test_a_grant_scoped_to_one_job(controller, fed):
    fed.setup(grant=False)
    for name in PARTIES:
        controller.grant(party(name), dataset="records", developer="dev", job_id="job-1")
    assert fed.submit()  # job-1
    with pytest.raises(DataAccessDeniedError, match="granted for job 'job-1' only, not 'job-2'"):
        fed.submit(job(job_id="job-2"))


def test_an_expired_grant_stops_the_session_at_the_next_sync(controller, fed, running, monkeypatch):
    token, agents = running
    soon = (datetime.now(timezone.utc) + timedelta(seconds=30)).isoformat()
    controller.grant(party("hospital-a"), dataset="records", developer="dev", expires_at=soon)
    assert controller.grants(party("hospital-a"))[0]["expires_at"] is not None
    later = datetime.now(timezone.utc) + timedelta(minutes=5)
    monkeypatch.setattr(controller, "_now", lambda: later)
    controller._last_sweep = 0.0
    instruction = agents["hospital-a"].sync(token, run=1, status="running")
    assert instruction["command"] == "stop" and "expired" in instruction["reason"]
    assert controller.status(DEV, token)["state"] == "revoked"
    assert controller.grants(party("hospital-a"))[0]["active"] is False
    with pytest.raises(DataAccessDeniedError, match="expired at"):
        controller.resume(DEV, token)


@pytest.mark.parametrize(
    "value,match",
    [
        ("2020-01-01T00:00:00+00:00", "in the future"),
        ("2030-01-01T00:00:00", "time zone"),
        ("next tuesday", "ISO 8601"),
        ("2999-01-01T00:00:00+00:00", "within 3650 days"),
    ],
)
def test_bad_expiry_is_refused_naming_the_field(controller, fed, value, match):
    fed.setup(grant=False)
    with pytest.raises(InvalidParameterError, match=f"expires_at.*{match}"):
        controller.grant(party("hospital-a"), dataset="records", developer="dev", expires_at=value)
    assert controller.grants(party("hospital-a")) == []


def test_approval_per_job_holds_the_session_until_the_owner_approves(controller, fed):
    fed.setup(grant=False)
    controller.grant(party("hospital-a"), dataset="records", developer="dev", approval=True)
    fed.grant("hospital-b")
    token = fed.submit()
    status = controller.status(DEV, token)
    assert status["state"] == "awaiting" and "hospital-a/records" in status["message"]
    agent = Agent(controller, "hospital-a")
    assert agent.sync()["command"] == "stop"  # nothing runs before the approval
    assert controller.uses(party("hospital-a"))[0]["approval"] == "pending"
    with pytest.raises(NotFoundError, match="uses none of clinic-z's datasets"):
        controller.approve(party("clinic-z"), token)
    # hospital-b's grant asks for no approval: its approval changes nothing.
    assert controller.approve(party("hospital-b"), token)["pending"] == ["hospital-a/records"]
    assert controller.status(DEV, token)["state"] == "awaiting"
    answer = controller.approve(party("hospital-a"), token)
    assert answer["state"] == "running" and answer["pending"] == []
    assert controller.uses(party("hospital-a"))[0]["approval"] == "approved"


def test_a_party_failure_reaches_the_developer_with_its_next_step(controller, running):
    token, agents = running
    failure = {
        "stage": "data",
        "error": "DataProblemError",
        "message": "party 'hospital-b', after the pipeline (empty pipeline): feature column 'sex' is text",
        "dataset": "records",
        "columns": ["sex"],
        "round": 0,
        "hint": "add an encode step for it, or drop it",
    }
    agents["hospital-b"].sync(token, run=1, status="failed", error="DataProblemError: ...", failure=failure)
    status = controller.status(DEV, token)
    assert status["state"] == "failed"
    assert "hospital-b failed before its first round (data, dataset records)" in status["message"]
    assert "add an encode step for it, or drop it" in status["message"]
    [b] = [p for p in status["participants"] if p["name"] == "hospital-b"]
    assert b["failure"]["columns"] == ["sex"]
    last = controller.log(DEV, token)[-1]  # the session log tells it too
    assert last["kind"] == "failed" and "column 'sex' is text" in last["note"]
    # A malformed failure report is dropped, not stored.
    agents["hospital-a"].sync(token, run=1, status="running", failure={"stage": "bogus", "values": [1, 2]})
    [a] = [p for p in controller.status(DEV, token)["participants"] if p["name"] == "hospital-a"]
    assert a["failure"] is None


SCHEMA_WITH_TEXT = [
    {"name": "age", "dtype": "float", "missing": True},
    {"name": "sex", "dtype": "str", "missing": False, "categories": ["F", "M"]},
    {"name": "diagnosis", "dtype": "int"},
]


def _published(fed, schema_b=None):
    fed.register_aggregator()
    fed.register_party("hospital-a", [dataset(schema=SCHEMA_WITH_TEXT)])
    fed.register_party("hospital-b", [dataset(schema=schema_b or SCHEMA_WITH_TEXT)])
    for name in PARTIES:
        fed.grant(name)


def test_submit_checks_the_pipeline_against_published_schemas(controller, fed):
    _published(fed)
    with pytest.raises(InvalidParameterError) as raised:
        fed.submit()
    message = str(raised.value)
    assert "column 'sex' is text; add an encode step for it, or drop it" in message
    assert "column 'age' has missing values and no step imputes them" in message
    typo = job()
    typo["fl_data"]["pipeline"] = [{"name": "s", "op": "scale", "params": {"method": "standard", "columns": ["agee"]}}]
    with pytest.raises(InvalidParameterError, match="step 's': column 'agee' is not in the dataset"):
        fed.submit(typo)
    assert controller.sessions(ADMIN) == []  # nothing started
    denied = [e for e in controller.audit(ADMIN) if e["action"] == "submit"][-1]
    assert denied["decision"] == "deny" and any(c.get("reason") == "schema" for c in denied["detail"]["checks"])
    # The owner sees the refused submissions as denied uses of its data, with its own problems.
    uses = [e for e in controller.audit(party("hospital-a")) if e["action"] == "use:submit"]
    assert len(uses) == 2 and {e["decision"] for e in uses} == {"deny"}
    assert uses[0]["detail"]["grant"] == "allow" and uses[0]["detail"]["reason"] == "schema"
    assert any("column 'sex' is text" in text for text in uses[0]["detail"]["problems"])
    assert all(text.startswith("hospital-a/records") for text in uses[0]["detail"]["problems"])
    assert controller.uses(party("hospital-a")) == []  # nothing ran


def test_encode_categories_are_agreed_from_the_published_schemas(controller, fed):
    schema_b = [dict(c) for c in SCHEMA_WITH_TEXT]
    schema_b[1] = {"name": "sex", "dtype": "str", "missing": False, "categories": ["F", "X"]}
    _published(fed, schema_b)
    spec = job()
    spec["fl_data"]["pipeline"] = [
        {"name": "sex", "op": "encode", "params": {"columns": ["sex"]}},
        {"name": "fill", "op": "impute", "params": {"strategy": "median"}},
    ]
    token = fed.submit(spec)
    stored = controller.entry(DEV, token, 1)["spec"]["fl_data"]
    steps = stored["lineage"][-1]["state"]["pipeline"] if "state" in stored["lineage"][-1] else None
    pipeline = steps or stored["state"]["pipeline"]
    encode = next(s for s in pipeline if s["name"] == "sex")
    assert encode["params"]["categories"] == {"sex": ["F", "M", "X"]}  # the sorted union


def test_schema_check_passes_an_unchanged_job_on_plain_schemas(controller, fed):
    fed.setup()
    assert fed.submit()
    assert SCHEMA[0]["name"] == "age"


def test_federated_evaluation_weights_each_partys_held_out_metrics(controller, running):
    token, agents = running
    results = {"hospital-a": (0.80, 0.75, 100), "hospital-b": (0.70, 0.65, 300)}
    for name, (auc, accuracy, rows) in results.items():
        result = {"rounds": 10, "test_auc": auc, "test_accuracy": accuracy, "test_samples": rows}
        agents[name].sync(token, run=1, status="completed", result=result)
    status = controller.status(DEV, token)
    evaluation = status["evaluation"]
    assert evaluation["parties"]["hospital-b"] == {"test_auc": 0.70, "test_accuracy": 0.65, "test_samples": 300}
    assert evaluation["aggregate"]["test_auc"] == pytest.approx((0.8 * 100 + 0.7 * 300) / 400)
    assert evaluation["aggregate"]["test_samples"] == 400 and evaluation["aggregate"]["parties"] == 2
