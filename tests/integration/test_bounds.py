"""Bounded updates under protection: a party past the bound is caught before its update corrupts the sum.

Real processes over gRPC with mTLS; the lying party is tests/fixtures/lying_party.py (its hooks).
Breast cancer with Homo LR (31 values a party), ``protection.prove_bound: true``: every party
proves each value within ``mask_bound`` with Bulletproofs bound to its protected words, and checks
every peer's proofs and the decoded sum (python/confide/protect/bound.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from confide.errors import JobFailedError
from tests.fixtures.faults import with_faults
from tests.fixtures.federation import run_local
from tests.fixtures.lying_party import environment
from tests.integration.conftest import make_spec

PARTIES = ["hospital-a", "hospital-b", "hospital-c"]
LIAR = PARTIES[-1]


def party_report(workdir: Path, party: str) -> dict:
    return json.loads((workdir / "parties" / f"{party}.report.json").read_text())


def bounded(mode: str, job_id: str, **protection):
    return make_spec(job_id=job_id, rounds=3, protection={"mode": mode, "prove_bound": True, **protection})


@pytest.mark.parametrize("mode", ["secagg", "groupmask", "lattice", "paillier"])
def test_honest_parties_prove_every_update_within_the_bound_and_train_as_without(tmp_path, mode):
    report = run_local(bounded(mode, f"bound-{mode}"), tmp_path / "on", progress=False, echo=lambda *_: None)
    plain = run_local(
        make_spec(job_id=f"unbound-{mode}", rounds=3, protection={"mode": mode}),
        tmp_path / "off",
        progress=False,
        echo=lambda *_: None,
    )
    assert report["protection"]["bound"]["ran"] is True
    assert abs(report["final_auc"] - plain["final_auc"]) < 0.02
    for party in PARTIES:
        for entry in party_report(tmp_path / "on", party)["rounds"]:
            bound = entry["stats"]["bound"]
            assert bound["bound_bits"] >= (15 if mode == "paillier" else 20) and bound["bound_linf"] <= 8.0
            assert bound["bound_prove_s"] > 0 and bound["bound_bytes"] > 31 * 32


@pytest.mark.parametrize(
    "mode,lie,verify",
    [
        ("lattice", "lane_overflow", "off"),
        ("lattice", "lane_overflow", "auto"),
        ("secagg", "past_bound", "off"),
        ("groupmask", "past_bound", "off"),
        ("paillier", "code_overflow", "off"),
        ("threshold", "code_overflow", "auto"),
    ],
)
def test_a_party_that_sends_other_words_than_it_proved_has_the_sum_refused(tmp_path, mode, lie, verify):
    spec = bounded(mode, f"liar-{mode}-{lie}-{verify}", verify=verify)
    with pytest.raises(JobFailedError) as failure:
        run_local(spec, tmp_path, progress=False, echo=lambda *_: None, party_env={LIAR: environment(lie)})
    # with verification on, the tags see it first: they cannot tell a lying party from a lying
    # aggregator (a lying party whose tags match its words is the bound check's case)
    said = "is not the sum of the values the parties proved" if verify == "off" else "not the sum of the"
    assert said in str(failure.value) and "round 2" in str(failure.value), str(failure.value)
    for party in PARTIES[:-1]:
        report = party_report(tmp_path, party)
        # each honest party refused the sum, or was stopped by the launcher once the job had failed
        assert report["status"] == "stopped" or said in report["error"], (party, report.get("error"))
        assert [r["round"] for r in report["rounds"]] == [1], (party, "round 2 was never applied")


def test_a_party_whose_proof_fails_is_named_and_the_round_runs_again_without_it(tmp_path):
    spec = bounded("secagg", "forged-proof")
    report = run_local(
        spec, tmp_path, progress=False, echo=lambda *_: None, party_env={LIAR: environment("forged_proof")}
    )
    honest = party_report(tmp_path, PARTIES[0])["rounds"]
    second = next(r for r in honest if r["round"] == 2)
    excluded = second["stats"]["bound_excluded"]
    assert excluded[0]["parties"] == [LIAR] and "does not verify" in excluded[0]["reason"]
    assert LIAR not in second["participants"] and second["attempts"] == 2
    assert LIAR in report["dropped"]


def test_without_the_proofs_a_lane_overflow_goes_into_the_model(tmp_path):
    """The attack is real: lattice mode without bound proofs (and unverified) takes the carried value."""

    def weights(name: str, env: dict) -> list[float]:
        spec = make_spec(job_id=f"overflow-{name}", rounds=3, protection={"mode": "lattice", "verify": "off"})
        run_local(spec, tmp_path / name, progress=False, echo=lambda *_: None, party_env=env)
        return party_report(tmp_path / name, PARTIES[0])["weights"]

    honest, attacked = weights("honest", {}), weights("attacked", {LIAR: environment("lane_overflow")})
    # 2^20 carried into the second value's lane: 4.0 at the lattice fixed point's 2^-18 for 3 parties
    assert abs(attacked[1] - honest[1]) > 2.0, (honest[:3], attacked[:3])
    assert max(abs(a - h) for a, h in zip(attacked[2:], honest[2:], strict=True)) < 1.0


def test_an_update_past_the_l2_bound_is_named_and_the_round_runs_again_without_it(tmp_path):
    """groupmask, ``l2_bound`` 0.1: honest updates are scaled into the ball and proven; the liar keeps its
    update whole, proves it against a looser bound and relabels the proof; its peers refuse that proof."""
    spec = bounded("groupmask", "past-l2", l2_bound=0.1)
    report = run_local(spec, tmp_path, progress=False, echo=lambda *_: None, party_env={LIAR: environment("past_l2")})
    assert report["protection"]["bound"]["l2"]["ran"] is True and report["protection"]["bound"]["l2"]["bound"] == 0.1
    honest = party_report(tmp_path, PARTIES[0])["rounds"]
    assert [r["round"] for r in honest] == [1, 2, 3]
    for entry in honest:
        assert entry["stats"]["bound"]["bound_l2"] == 0.1 and entry["stats"]["bound_l2_scaled"] is True, entry["stats"]
    second = honest[1]
    excluded = second["stats"]["bound_excluded"]
    assert excluded[0]["parties"] == [LIAR] and "L2 norm is within the bound does not verify" in excluded[0]["reason"]
    assert LIAR not in second["participants"] and second["attempts"] == 2
    assert LIAR in report["dropped"]
    assert report["final_auc"] > 0.97


@pytest.mark.parametrize("mode", ["secagg", "lattice"])
def test_a_recovered_round_checks_the_survivors_sum_against_their_proofs(tmp_path, mode):
    """on_dropout recover: a party dies in round 2 after its key shares went out, before any word.

    The survivors' commitments no longer cancel (their pair blindings with it remain): they swap
    their keys of that attempt with it, and the sum of their commitments must then be that of
    their recovered sum, with no retry. The L2 bound is proven too.
    """
    everyone = ["hospital-a", "hospital-b", "hospital-c", "hospital-d"]
    survivors = ["hospital-a", "hospital-b", "hospital-d"]
    recovery = {"recovery_timeout_s": 5.0} if mode == "secagg" else {"share_timeout_s": 10.0}
    spec = make_spec(
        job_id=f"bound-recover-{mode}",
        parties=everyone,
        rounds=3,
        protection={"mode": mode, "prove_bound": True, "l2_bound": 1.0, "on_dropout": "recover", **recovery},
        transport={"round_timeout_s": 8.0},
    )
    fault = with_faults(exit_round=2, exit_step="released")
    report = run_local(
        spec, tmp_path, progress=False, echo=lambda *_: None, party_env={"hospital-c": fault}, max_restarts=0
    )
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3] and all(r["attempts"] == 1 for r in rounds), "no retry"
    assert rounds[1]["participants"] == survivors
    assert report["final_auc"] > 0.97
    for party in survivors:
        second = party_report(tmp_path, party)["rounds"][1]
        assert second["stats"]["excluded"] == ["hospital-c"]
        assert second["stats"]["bound"]["bound_l2"] == 1.0 and "bound_excluded" not in second["stats"]
