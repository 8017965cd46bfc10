"""The party's own check of its stop file: why it stops decides how its report says it."""

from __future__ import annotations

import json

import pytest

from confide.errors import DataAccessRevokedError, RunStoppedError
from confide.party.runner import _check_stop, failure_of, report_failure


def test_no_stop_file_means_go_on(tmp_path):
    _check_stop(None)
    _check_stop(tmp_path / "stop.json")


def test_a_revocation_is_an_access_failure_with_the_owners_reason(tmp_path):
    path = tmp_path / "stop.json"
    path.write_text(json.dumps({"reason": "stopped: hospital-b revoked alice's grant", "state": "revoked"}))
    with pytest.raises(DataAccessRevokedError, match="hospital-b revoked") as raised:
        _check_stop(path)
    failure = failure_of(raised.value, stage="round", dataset="patients", round_number=4)
    assert failure.stage == "access" and failure.round == 4 and failure.dataset == "patients"


@pytest.mark.parametrize("state", ["cancelled", "failed", None])
def test_other_stops_are_not_called_revocations(tmp_path, state):
    path = tmp_path / "stop.json"
    path.write_text(json.dumps({"reason": "cancelled by alice", "state": state}))
    with pytest.raises(RunStoppedError, match="cancelled by alice"):
        _check_stop(path)


def test_an_unreadable_stop_file_still_stops(tmp_path):
    path = tmp_path / "stop.json"
    path.write_text("{not json")
    with pytest.raises(RunStoppedError, match="the controller stopped this session"):
        _check_stop(path)


def test_a_stop_before_the_first_round_is_reported_as_stopped(tmp_path):
    path = tmp_path / "stop.json"
    path.write_text(json.dumps({"reason": "cancelled by alice", "state": "cancelled"}))
    with pytest.raises(RunStoppedError) as raised:
        _check_stop(path)
    report_failure(tmp_path, "job", "hospital-a", raised.value, stage="data", dataset="patients")
    report = json.loads((tmp_path / "hospital-a.report.json").read_text())
    assert report["status"] == "stopped" and report["failure"]["error"] == "RunStoppedError"
