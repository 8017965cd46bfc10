"""Robust strategies against a poisoning party: real processes, one of five parties scaling its update by 100.

The attacker is benchmarks/attack_model.py (a softmax regression whose party multiplies its change
before it leaves). FedAvg follows it; the median, the trimmed mean and Krum at the aggregator
do not, nor do the trimmed mean and Krum inside tee's enclave. benchmarks/robust_bench.py measures the
same at more rounds, with more attacks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from confide.spec import parse_job
from tests.fixtures.federation import run_local

ATTACK_MODEL = Path(__file__).resolve().parents[2] / "benchmarks" / "attack_model.py"
PARTIES = [f"hospital-{c}" for c in "abcde"]


def job(strategy: str, mode: str = "plain") -> dict:
    return {
        "job_id": f"robust-{strategy}-{mode}",
        "rounds": 8,
        "parties": PARTIES,
        "model": {"algorithm": "custom", "entry": f"{ATTACK_MODEL}:build", "options": {"learning_rate": 0.5}},
        "data": {"dataset": "digits", "split": "iid", "seed": 3},
        "strategy": {"name": strategy},
        "protection": {"mode": mode},
        "metrics": ["loss", "accuracy"],
        "seed": 3,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    attacked = {PARTIES[-1]: {"CONFIDE_ATTACK": "scale:100"}}
    out = {}
    for name, strategy, env, mode in [
        ("clean", "fedavg", {}, "plain"),
        ("fedavg", "fedavg", attacked, "plain"),
        ("median", "median", attacked, "plain"),
        ("trimmed_mean", "trimmed_mean", attacked, "plain"),
        ("krum", "krum", attacked, "plain"),
        ("tee-trimmed_mean", "trimmed_mean", attacked, "tee"),
        ("tee-krum", "krum", attacked, "tee"),
    ]:
        spec = parse_job(job(strategy, mode))
        out[name] = run_local(spec, tmp_path_factory.mktemp(name), progress=False, echo=lambda *_: None, party_env=env)
    return out


def test_fedavg_follows_the_attacker(runs):
    assert runs["clean"]["final_accuracy"] > 0.88
    assert runs["fedavg"]["final_accuracy"] < runs["clean"]["final_accuracy"] - 0.2


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum"])
def test_a_robust_rule_keeps_the_model_near_the_clean_run(runs, rule):
    report = runs[rule]
    assert report["final_accuracy"] > runs["clean"]["final_accuracy"] - 0.05, report["final_accuracy"]
    assert report["strategy"]["name"] == rule
    assert report["protection"]["robust_rule"] == rule
    assert "not their sum" in report["aggregator_saw"]
    # The estimate is not a sum: nothing to check it against, and the report says so.
    assert report["protection"]["verification"]["ran"] is False
    assert rule in report["protection"]["verification"]["reason"]


@pytest.mark.parametrize("rule", ["trimmed_mean", "krum"])
def test_the_enclave_applies_the_rule_to_the_sealed_updates_as_plain_does_in_the_clear(runs, rule):
    report, plain = runs[f"tee-{rule}"], runs[rule]
    assert report["protection"]["mode"] == "tee" and report["protection"]["robust_rule"] == rule
    assert f"the enclave returns their {rule.replace('_', ' ')}, not their sum" in report["aggregator_saw"]
    # the same rule on the same updates: Rust in the enclave, numpy at the plain aggregator
    assert report["final_accuracy"] > runs["clean"]["final_accuracy"] - 0.05, report["final_accuracy"]
    assert abs(report["final_accuracy"] - plain["final_accuracy"]) < 0.01
    assert report["protection"]["verification"]["ran"] is False
