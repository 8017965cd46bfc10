"""A lying aggregator is caught by every party, in every verified mode, and the node is named.

Real processes over gRPC with mTLS; the aggregator lies through tests/fixtures/lying.py (its
hooks, as tests/fixtures/faults.py is the parties'). Homo LR on 600 synthetic features with
1 KiB slices: three slices a round, so one can be swapped for another.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from confide.errors import JobFailedError
from confide.transport.routing import node_for
from tests.fixtures.federation import run_local
from tests.fixtures.lying import environment
from tests.integration.conftest import make_spec

#: Every lie in secagg; two or three in each other verified mode (the unit tests run every lie in-process).
#: paillier is not "replayed" or "dropped": a paillier block carries its round's codec, and the
#: aggregator's own data plane refuses a last round's block or zeros before any party sees a sum.
CASES = [("secagg", lie) for lie in ("altered", "dropped", "replayed", "replayed_result", "swapped", "equivocated")]
CASES += [
    ("plain", "altered"),
    ("plain", "dropped"),
    ("groupmask", "replayed"),
    ("groupmask", "equivocated"),
    ("tee", "altered"),
    ("tee", "swapped"),
    ("lattice", "altered"),
    ("lattice", "swapped"),
    ("lattice", "dropped"),
    ("lattice", "equivocated"),
    ("paillier", "altered"),
    ("paillier", "replayed_result"),
    ("paillier", "swapped"),
]
PARTIES = ["hospital-a", "hospital-b", "hospital-c"]


def spec_for(mode: str, job_id: str, **protection):
    return make_spec(
        job_id=job_id,
        rounds=3,
        model={"learning_rate": 0.1, "local_epochs": 1},
        data={"dataset": "synthetic", "samples": 600, "features": 600, "seed": 3},
        protection={"mode": mode, **protection},
        transport={"slice_bytes": 1024},
    )


def party_reports(workdir: Path) -> dict[str, dict]:
    return {p: json.loads((workdir / "parties" / f"{p}.report.json").read_text()) for p in PARTIES}


@pytest.mark.parametrize("mode,lie", CASES)
def test_every_party_refuses_a_lying_aggregators_round_and_names_it(tmp_path, monkeypatch, mode, lie):
    for name, value in environment(lie).items():
        monkeypatch.setenv(name, value)
    spec = spec_for(mode, f"lie-{mode}-{lie}")
    with pytest.raises(JobFailedError) as failure:
        run_local(spec, tmp_path, progress=False, echo=lambda *_: None, aggregator_args=["--data-port", "-1"])
    assert "refused" in str(failure.value) and "the aggregator (127.0.0.1:" in str(failure.value)
    for party, report in party_reports(tmp_path).items():
        assert report["status"] == "failed", party
        assert [r["round"] for r in report["rounds"]] == [1], (party, "round 1 was honest and completed")
        assert "refused" in report["error"] and "the aggregator (127.0.0.1:" in report["error"], report["error"]


def test_the_node_that_lied_is_named_in_a_cluster(tmp_path, monkeypatch):
    spec = spec_for("secagg", "lie-cluster")
    liar = node_for(spec.job_id, 1, 2)
    for name, value in environment("altered", slice_index=1, node=liar).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(JobFailedError):
        run_local(spec, tmp_path, progress=False, echo=lambda *_: None, nodes=2, aggregator_args=["--data-port", "-1"])
    for party, report in party_reports(tmp_path).items():
        assert f"aggregator node {liar} (" in report["error"], (party, report["error"])
        assert f"aggregator node {1 - liar} (" not in report["error"]


def test_on_wrong_sum_retry_runs_the_round_again_without_the_lying_node(tmp_path, monkeypatch):
    spec = spec_for("groupmask", "lie-retry", on_wrong_sum="retry")
    liar = node_for(spec.job_id, 1, 2)
    for name, value in environment("altered", slice_index=1, node=liar).items():
        monkeypatch.setenv(name, value)
    report = run_local(
        spec, tmp_path, progress=False, echo=lambda *_: None, nodes=2, aggregator_args=["--data-port", "-1"]
    )
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    second = report["rounds"][1]
    assert second["attempts"] == 2
    assert len(second["refused"]) == 1 and sorted(second["refused"][0]["parties"]) == PARTIES
    assert f"aggregator node {liar} (" in second["refused"][0]["reason"]
    assert not report["rounds"][2]["refused"]


@pytest.mark.parametrize("lie", ["altered", "swapped"])
def test_thresholds_decryptors_refuse_a_slice_that_is_not_the_product_of_the_parties_and_name_the_node(
    tmp_path, monkeypatch, lie
):
    """threshold has no tags: each slice's t decryptors compare it with the product of the parties' own slices."""
    for name, value in environment(lie).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(JobFailedError):
        run_local(
            spec_for("threshold", f"lie-threshold-{lie}"),
            tmp_path,
            progress=False,
            echo=lambda *_: None,
            aggregator_args=["--data-port", "-1"],
        )
    reports = party_reports(tmp_path)
    # slice 1 is decrypted by participants 1 and 2 (t = 2 of 3): both refuse it and name the node
    for party in PARTIES[1:]:
        error = reports[party]["error"]
        assert "combined slice 1 is not" in error and "the aggregator (127.0.0.1:" in error, error
    # participant 0 is not among them: its combiner's notice makes it refuse the round too, naming the node
    # (unless the launcher stopped it first, once a decryptor had failed the job)
    first = reports[PARTIES[0]]
    noticed = "a decryptor of combined slice 1, refused it" in first.get("error", "")
    assert first["status"] == "stopped" or (noticed and "the aggregator (127.0.0.1:" in first["error"]), first
    for party, report in reports.items():
        assert [r["round"] for r in report["rounds"]] == [1], (party, "no party applied round 2")
        assert report["protection"]["verification"]["ran"] is False
        assert "t decryptors" in report["protection"]["verification"]["reason"]
