"""An aggregator cluster of separate processes: jobs split across nodes, and one node lost mid-job."""

from __future__ import annotations

import time

import numpy as np
import pytest

from confide.local import LocalFederation, run_local
from tests.integration.conftest import make_spec

SYNTHETIC = {"dataset": "synthetic", "samples": 3000, "features": 1500, "test_fraction": 0.2}


def cluster_spec(job_id: str, mode: str, rounds: int = 6):
    return make_spec(
        job_id=job_id,
        rounds=rounds,
        data=SYNTHETIC,
        model={"learning_rate": 0.2, "local_epochs": 1, "batch_size": 64},
        protection={"mode": mode},
        transport={"slice_bytes": 1024},
    )


@pytest.mark.parametrize("mode", ["plain", "paillier"])
def test_job_on_three_nodes_matches_one_node(tmp_path, mode):
    spec = cluster_spec(f"cluster-{mode}", mode, rounds=3)
    single = run_local(spec, tmp_path / "one", progress=False, echo=lambda *_: None)
    spread = run_local(spec, tmp_path / "three", progress=False, echo=lambda *_: None, nodes=3)
    assert [r["round"] for r in spread["rounds"]] == [1, 2, 3]
    assert abs(spread["final_auc"] - single["final_auc"]) <= 0.002
    # Every node served a share: each stored completed rounds of its own.
    for k in range(3):
        assert list((tmp_path / "three" / "aggregator-state" / f"node-{k}").rglob("round-*.bin")), k


def test_node_killed_mid_job_its_share_moves_and_every_round_completes(tmp_path):
    spec = cluster_spec("cluster-loss", "plain", rounds=8)
    federation = LocalFederation(spec, tmp_path)
    federation.prepare()
    try:
        federation.start_cluster(3)
        for party in spec.parties:
            federation.start_party(party)
        deadline = time.monotonic() + 120
        while True:
            report = federation.report_of("hospital-a")
            if report and len(report["rounds"]) >= 2:
                break
            assert time.monotonic() < deadline, "job did not reach round 2"
            time.sleep(0.01)
        assert federation.cluster is not None
        federation.cluster.kill(1)
        killed_at = len(federation.report_of("hospital-a")["rounds"])
        for process in federation.parties.values():
            assert process.wait(timeout=180) == 0
    finally:
        federation.stop()
    assert killed_at < 8, "the node was killed after the job ended"
    reports = {p: federation.report_of(p) for p in spec.parties}
    for party_report in reports.values():
        assert party_report["status"] == "completed"
        assert [r["round"] for r in party_report["rounds"]] == list(range(1, 9))
    weights = [np.asarray(r["rounds"][-1]["weights"]) for r in reports.values()]
    for other in weights[1:]:
        assert np.allclose(other, weights[0], atol=1e-6)
    logs = "".join((tmp_path / "logs" / f"{p}.log").read_text() for p in spec.parties)
    assert "aggregator node 1" in logs and "lost" in logs


def test_losing_node_zero_fails_the_job_clearly(tmp_path):
    spec = cluster_spec("cluster-relay-loss", "plain", rounds=30)
    federation = LocalFederation(spec, tmp_path)
    federation.prepare()
    try:
        federation.start_cluster(2)
        for party in spec.parties:
            federation.start_party(party)
        deadline = time.monotonic() + 120
        while not (federation.report_of("hospital-a") or {}).get("rounds"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert federation.cluster is not None
        federation.cluster.kill(0)
        codes = [process.wait(timeout=180) for process in federation.parties.values()]
    finally:
        federation.stop()
    assert all(code != 0 for code in codes)
    errors = [(federation.report_of(p) or {}).get("error", "") for p in spec.parties]
    assert any("node 0" in e or "aggregator" in e for e in errors), errors
