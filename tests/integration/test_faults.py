"""Faults on loopback: a party dying mid-round, the aggregator restarting mid-job.

These tests run without the launcher's restarts (``max_restarts=0``), so a dead party stays a
dropout; tests/integration/test_supervision.py covers the restarts and the rejoin.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from confide.errors import JobFailedError
from confide.local import LocalFederation, build_report
from tests.fixtures.faults import with_faults
from tests.fixtures.federation import run_local
from tests.integration.conftest import make_spec

FAULT = with_faults(exit_round=4)


@pytest.mark.parametrize("mode", ["secagg", "paillier", "lattice"])
def test_party_killed_mid_round_round_is_retried_without_it(tmp_path, mode):
    spec = make_spec(job_id=f"dropout-{mode}", rounds=8, protection={"mode": mode, "on_dropout": "retry"})
    report = run_local(
        spec, tmp_path, progress=False, echo=lambda *_: None, party_env={"hospital-c": FAULT}, max_restarts=0
    )
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 9))
    assert rounds[2]["participants"] == ["hospital-a", "hospital-b", "hospital-c"]
    assert rounds[3]["attempts"] == 2, "round 4 is aborted once, then retried by the survivors"
    assert all(r["participants"] == ["hospital-a", "hospital-b"] for r in rounds[3:])
    assert "hospital-c" in report["dropped"]
    assert report["final_auc"] > 0.98


def test_party_killed_with_on_dropout_fail_fails_the_job_clearly(tmp_path):
    spec = make_spec(job_id="dropout-fail", rounds=6, protection={"mode": "groupmask", "on_dropout": "fail"})
    with pytest.raises(JobFailedError) as failure:
        run_local(spec, tmp_path, progress=False, echo=lambda *_: None, party_env={"hospital-c": FAULT}, max_restarts=0)
    message = str(failure.value)
    assert "hospital-c" in message and "on_dropout is 'fail'" in message


def test_too_few_parties_left_fails_the_job(tmp_path):
    spec = make_spec(job_id="dropout-min", rounds=6, protection={"mode": "plain", "min_parties": 3})
    with pytest.raises(JobFailedError, match="min_parties is 3"):
        run_local(spec, tmp_path, progress=False, echo=lambda *_: None, party_env={"hospital-c": FAULT}, max_restarts=0)


@pytest.mark.parametrize("mode", ["paillier", "secagg", "lattice"])
def test_aggregator_restarted_mid_job_loses_no_round(tmp_path, mode):
    # Sized to the test: killed at round 5, the job must still have rounds left to lose.
    spec = make_spec(job_id=f"restart-{mode}", rounds=12, protection={"mode": mode})
    federation = LocalFederation(spec, tmp_path)
    federation.prepare()
    try:
        port = federation.start_aggregator()
        for party in spec.parties:
            federation.start_party(party)
        deadline = time.monotonic() + 120
        while True:
            report = federation.report_of("hospital-a")
            if report and len(report["rounds"]) >= 5:
                break
            assert time.monotonic() < deadline, "job did not reach round 5"
            time.sleep(0.01)
        federation.aggregator.send_signal(signal.SIGKILL)
        federation.aggregator.wait()
        killed_at = len(federation.report_of("hospital-a")["rounds"])
        time.sleep(1.0)
        federation.start_aggregator(port)
        for process in federation.parties.values():
            assert process.wait(timeout=120) == 0
    finally:
        federation.stop()
    reports = {p: federation.report_of(p) for p in spec.parties}
    assert killed_at < 12, "the aggregator was killed before the job ended"
    for party_report in reports.values():
        assert party_report["status"] == "completed"
        assert [r["round"] for r in party_report["rounds"]] == list(range(1, spec.rounds + 1))
    assert sum(r["reconnects"] for r in reports.values()) >= 3
    weights = [tuple(r["weights"]) for r in reports.values()]
    assert len(set(weights)) == 1, "every party ends with the same global model"
    report = build_report(spec, reports, 0.0, {}, baseline=False)
    assert report["final_auc"] > 0.98


@pytest.mark.parametrize("step", ["opened", "released", "summed"])
def test_secagg_recovers_a_dropout_at_each_step_without_retrying(tmp_path, step):
    """on_dropout recover: a party killed at any step of round 4 costs no retry of that round.

    opened: its header went out, nothing else; released: its Shamir shares went out, no slice;
    summed: its words are in the sum (one slice here), it dies before unmasking. In the first two it is
    excluded (its masks removed, its words never in the sum); in the third its words stay in
    the round-4 sum and the survivors rebuild its self mask from their shares. The next round
    starts without it (the first two) or excludes it when it never shows up (the third).
    """
    # Four parties: with one colluder tolerated (t = 2 of 3 neighbours), 3 of 4 must confirm an exclusion.
    everyone = ["hospital-a", "hospital-b", "hospital-c", "hospital-d"]
    survivors = ["hospital-a", "hospital-b", "hospital-d"]
    spec = make_spec(
        job_id=f"recover-{step}",
        parties=everyone,
        rounds=7,
        # A party that dies after the sum sends no verification tags: with verification on its round is
        # retried (test_verified_secagg_retries_a_round_whose_sum_lost_a_party below); off, it is recovered.
        protection={"mode": "secagg", "on_dropout": "recover", "recovery_timeout_s": 5.0, **_unverified(step)},
        transport={"round_timeout_s": 8.0},
    )
    fault = with_faults(exit_round=4, exit_step=step)
    report = run_local(
        spec, tmp_path, progress=False, echo=lambda *_: None, party_env={"hospital-c": fault}, max_restarts=0
    )
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 8))
    assert all(r["attempts"] == 1 for r in rounds), "no round was retried"
    assert rounds[2]["participants"] == everyone
    if step == "summed":
        assert rounds[3]["participants"] == everyone, "its words are in round 4's sum"
    else:
        assert rounds[3]["participants"] == survivors
    assert all(r["participants"] == survivors for r in rounds[4:])
    assert "hospital-c" in report["dropped"]
    assert report["final_auc"] > 0.98
    a, b, d = (json.loads((tmp_path / "parties" / f"{p}.report.json").read_text()) for p in survivors)
    assert a["rounds"][-1]["weights"] == b["rounds"][-1]["weights"] == d["rounds"][-1]["weights"], "same model"
    assert a["protection"]["aggregator_sees"].startswith("nothing")
    excluded_at = [r["round"] for r in a["rounds"] if r["stats"].get("excluded")]
    assert excluded_at == ([5] if step == "summed" else [4])
    rebuilt = a["rounds"][3]["stats"]["rebuilt_from_shares"]
    assert rebuilt == (1 if step == "summed" else 0), "only a party that died after uploading needs its shares"


def _unverified(step: str) -> dict:
    """protection.verify off where the dropout comes after the sum (its tags never come)."""
    return {"verify": "off"} if step == "summed" else {}


def test_verified_secagg_retries_a_round_whose_sum_lost_a_party(tmp_path):
    """With the sums verified, a party that dies after its words are summed costs one retry.

    Its tags (sent once the sum is in) never come, so no survivor can check the sum it is part of:
    the round runs again without it, and that sum is checked. Round 4 is the only one retried.
    """
    everyone = ["hospital-a", "hospital-b", "hospital-c", "hospital-d"]
    survivors = ["hospital-a", "hospital-b", "hospital-d"]
    spec = make_spec(
        job_id="recover-verified",
        parties=everyone,
        rounds=6,
        protection={"mode": "secagg", "on_dropout": "recover", "recovery_timeout_s": 5.0, "share_timeout_s": 3.0},
        transport={"round_timeout_s": 8.0},
    )
    fault = with_faults(exit_round=4, exit_step="summed")
    report = run_local(
        spec, tmp_path, progress=False, echo=lambda *_: None, party_env={"hospital-c": fault}, max_restarts=0
    )
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 7))
    assert [r["attempts"] for r in rounds] == [1, 1, 1, 2, 1, 1]
    assert rounds[3]["participants"] == survivors and all(r["participants"] == survivors for r in rounds[4:])
    assert report["protection"]["verification"]["ran"] is True
    assert all(r["verify_s"] > 0 and not r["refused"] for r in rounds)
    assert report["final_auc"] > 0.98


@pytest.mark.parametrize("step", ["released", "summed"])
def test_lattice_completes_a_round_after_a_dropout_without_retrying(tmp_path, step):
    """on_dropout recover in lattice: the survivors' key sum decrypts the survivors' sum (no retry).

    released: its key shares went out before training, no word did: excluded, the survivors sum
    only their own shares, after confirming to each other the same exclusion. summed: its words
    are in the sum and it dies before decrypting: nothing to do, any t - 1 summed shares of the
    others rebuild the key sum of all four; the next round excludes it when it never shows up.
    """
    everyone = ["hospital-a", "hospital-b", "hospital-c", "hospital-d"]
    survivors = ["hospital-a", "hospital-b", "hospital-d"]
    spec = make_spec(
        job_id=f"lattice-recover-{step}",
        parties=everyone,
        rounds=6,
        protection={"mode": "lattice", "on_dropout": "recover", "share_timeout_s": 10.0, **_unverified(step)},
        transport={"round_timeout_s": 8.0},
    )
    fault = with_faults(exit_round=4, exit_step=step)
    report = run_local(
        spec, tmp_path, progress=False, echo=lambda *_: None, party_env={"hospital-c": fault}, max_restarts=0
    )
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 7))
    assert all(r["attempts"] == 1 for r in rounds), "no round was retried"
    assert rounds[3]["participants"] == (everyone if step == "summed" else survivors)
    assert all(r["participants"] == survivors for r in rounds[4:])
    assert report["final_auc"] > 0.98
    a, b, d = (json.loads((tmp_path / "parties" / f"{p}.report.json").read_text()) for p in survivors)
    assert a["rounds"][-1]["weights"] == b["rounds"][-1]["weights"] == d["rounds"][-1]["weights"], "same model"
    excluded_at = [r["round"] for r in a["rounds"] if r["stats"].get("excluded")]
    assert excluded_at == ([5] if step == "summed" else [4])
    assert a["protection"]["mode"] == "lattice" and a["protection"]["parties"] == 3
