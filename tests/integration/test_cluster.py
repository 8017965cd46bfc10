"""An aggregator cluster of separate processes: jobs split across nodes, and one node lost mid-job."""

from __future__ import annotations

import time

import numpy as np
import pytest

from confide.errors import MessageTimeoutError
from confide.local import LocalFederation
from confide.local.cluster import Cluster
from confide.transport.certs import Identity, init_federation
from confide.transport.client import AGGREGATOR, CONTROL_ROUND, AggregatorClient
from confide.transport.routing import node_for
from confide.v1 import runtime_pb2 as pb
from tests.fixtures import waiting
from tests.fixtures.faults import with_faults
from tests.fixtures.federation import run_local
from tests.fixtures.waiting import wait_for_text
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
        wait_for_round(federation, 2)
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


def wait_for_round(federation: LocalFederation, round_number: int, timeout_s: float = 120.0) -> None:
    waiting.wait_for_round(federation.workdir / "parties" / "hospital-a.report.json", round_number, timeout_s)


def check_completed_alike(federation: LocalFederation, spec) -> None:
    reports = {p: federation.report_of(p) for p in spec.parties}
    for party_report in reports.values():
        assert party_report["status"] == "completed", party_report.get("error")
        assert [r["round"] for r in party_report["rounds"]] == list(range(1, spec.rounds + 1))
    weights = [np.asarray(r["rounds"][-1]["weights"]) for r in reports.values()]
    for other in weights[1:]:
        assert np.allclose(other, weights[0], atol=1e-6)


def test_losing_node_zero_moves_the_relay_and_every_round_completes(tmp_path):
    # groupmask without a public bound: the parties exchange their largest value through the relay
    # every round, so envelopes are in flight whenever the relay node dies.
    spec = make_spec(
        job_id="cluster-relay-loss",
        rounds=10,
        data=SYNTHETIC,
        model={"learning_rate": 0.2, "local_epochs": 1, "batch_size": 64},
        protection={"mode": "groupmask", "mask_bound": None},
        transport={"slice_bytes": 1024, "round_timeout_s": 60.0},
    )
    federation = LocalFederation(spec, tmp_path)
    federation.prepare()
    try:
        federation.start_cluster(3)
        for party in spec.parties:
            federation.start_party(party)
        wait_for_round(federation, 2)
        assert federation.cluster is not None
        federation.cluster.kill(0)
        killed = time.monotonic()
        killed_at = len(federation.report_of("hospital-a")["rounds"])
        codes = [process.wait(timeout=180) for process in federation.parties.values()]
        after_kill = time.monotonic() - killed
    finally:
        federation.stop()
    assert codes == [0, 0, 0], [(federation.report_of(p) or {}).get("error") for p in spec.parties]
    assert killed_at < spec.rounds, "node 0 was killed after the job ended"
    check_completed_alike(federation, spec)
    # No round waited for the aggregator's round timeout (60 s).
    assert after_kill < 30, after_kill
    logs = "".join((tmp_path / "logs" / f"{p}.log").read_text() for p in spec.parties)
    assert "aggregator node 0" in logs and "the relay moves from aggregator node 0 to node 1" in logs


def test_restarted_node_is_readmitted_at_a_round_boundary(tmp_path):
    spec = cluster_spec("cluster-readmit", "plain", rounds=16)
    federation = LocalFederation(spec, tmp_path)
    federation.prepare()
    try:
        federation.start_cluster(3)
        for party in spec.parties:
            # A pause after every round leaves time to restart the node mid-job.
            federation.start_party(party, env=with_faults(round_delay_s=0.3))
        wait_for_round(federation, 2)
        assert federation.cluster is not None
        federation.cluster.kill(0)  # the relay too: it moves to node 1 and back
        killed_at = len(federation.report_of("hospital-a")["rounds"])
        for party in spec.parties:
            wait_for_text(tmp_path / "logs" / f"{party}.log", "aggregator node 0")
        federation.cluster.restart(0)
        restarted_at = len(federation.report_of("hospital-a")["rounds"])
        for process in federation.parties.values():
            assert process.wait(timeout=180) == 0
    finally:
        federation.stop()
    assert restarted_at < spec.rounds - 2, "the node came back too late to serve a round"
    check_completed_alike(federation, spec)
    logs = {p: (tmp_path / "logs" / f"{p}.log").read_text() for p in spec.parties}
    admitted = set()
    for party, text in logs.items():
        assert "aggregator node 0" in text and "is back: it serves its share again from round" in text, party
        admitted |= {line.rsplit(" ", 1)[-1] for line in text.splitlines() if "is back: it serves" in line}
    assert len(admitted) == 1, f"the parties re-admitted node 0 at different rounds: {admitted}"
    # The restarted node served (and stored) its share of the rounds after its return.
    stored = [
        int(path.name.split("-")[1]) for path in (tmp_path / "aggregator-state" / "node-0").rglob("round-*-s0.bin")
    ]
    assert max(stored) == spec.rounds, (killed_at, restarted_at, sorted(stored))


# -- the failover paths one at a time: real node processes, parties as clients in this process ----------

CLIENT_PARTIES = ["party-a", "party-b", "party-c"]
SLICE_LENGTH, NUM_SLICES = 64, 24


@pytest.fixture
def cluster(tmp_path):
    init_federation(tmp_path / "certs", parties=CLIENT_PARTIES)
    # A round timeout far beyond every wait below: a round that needs it fails the test.
    nodes = Cluster(2, tmp_path / "certs", tmp_path / "cluster", extra_args=["--round-timeout", "120"])
    nodes.start()
    clients: list[AggregatorClient] = []

    def connect(party: str, target: str | None = None) -> AggregatorClient:
        client = AggregatorClient(
            target or nodes.target, Identity.load(tmp_path / "certs", party), "job-f", message_timeout_s=15
        )
        client.connect()
        clients.append(client)
        return client

    yield nodes, connect
    for client in clients:
        client.close()
    nodes.stop()


def round_header(party: str, round_number: int = 1) -> pb.RoundHeader:
    return pb.RoundHeader(
        job_id="job-f",
        round=round_number,
        attempt=0,
        party_id=party,
        participants=CLIENT_PARTIES[:2],
        kind=pb.AGGREGATION_KIND_FLOAT32_SUM,
        num_slices=NUM_SLICES,
        slice_length=SLICE_LENGTH,
        vector_length=NUM_SLICES * SLICE_LENGTH,
        routing=pb.RESULT_ROUTING_ALL,
        mode="plain",
    )


def vector_slices(vector: np.ndarray, indices) -> list[pb.Slice]:
    return [
        pb.Slice(
            index=i,
            n_valid=SLICE_LENGTH,
            payload=vector[i * SLICE_LENGTH : (i + 1) * SLICE_LENGTH].astype("<f4").tobytes(),
        )
        for i in indices
    ]


def combined(client: AggregatorClient, round_number: int, timeout: float) -> np.ndarray:
    parts = [client.wait(("job-f", round_number, f"agg/0/{i}", AGGREGATOR), timeout).payload for i in range(NUM_SLICES)]
    return np.frombuffer(b"".join(parts), dtype="<f4")


def wait_lost(client: AggregatorClient, node: int, timeout: float = 10.0) -> float:
    began = time.monotonic()
    while node not in client.lost_nodes:
        assert time.monotonic() - began < timeout, f"node {node} not found lost within {timeout:g} s"
        time.sleep(0.02)
    return time.monotonic() - began


def test_an_envelope_the_lost_relay_held_reaches_its_recipient_through_the_next_node(cluster):
    nodes, connect = cluster
    sender = connect("party-a")
    sender.send(1, "bound/0", b"in flight", ["party-c"])  # held by node 0 only: party-c is not subscribed yet
    nodes.kill(0)
    assert wait_lost(sender, 0) < 3.0  # at once: it refuses a new stream, no grace to wait out
    # party-c listens on node 1 only: the envelope can come from nowhere but the sender's re-send.
    recipient = connect("party-c", nodes.addresses[1])
    assert recipient.recv(1, "bound/0", "party-a", timeout=10) == b"in flight"
    sender.send(1, "bound/1", b"after", ["party-c"])  # new envelopes go to the new relay
    assert recipient.recv(1, "bound/1", "party-a", timeout=10) == b"after"


def test_a_node_lost_after_delivering_part_of_a_share_leaves_no_party_waiting(cluster):
    nodes, connect = cluster
    first, second = connect("party-a"), connect("party-b")
    rng = np.random.default_rng(3)
    vectors = {p: rng.standard_normal(NUM_SLICES * SLICE_LENGTH).astype(np.float32) for p in ("party-a", "party-b")}
    on_node_1 = [i for i in range(NUM_SLICES) if node_for("job-f", i, 2) == 1]
    first.push(round_header("party-a"), vector_slices(vectors["party-a"], range(NUM_SLICES)))
    # party-b sends half of node 1's share: node 1 completes and delivers those indices only.
    sent = [i for i in range(NUM_SLICES) if i not in on_node_1[len(on_node_1) // 2 :]]
    second.push(round_header("party-b"), vector_slices(vectors["party-b"], sent))
    first.wait(("job-f", 1, f"agg/0/{on_node_1[0]}", AGGREGATOR), 10)
    assert ("job-f", 1, f"agg/0/{on_node_1[-1]}", AGGREGATOR) not in first.pool
    nodes.kill(1)
    began = time.monotonic()
    # party-b uploads its attempt again (as its round loop does); party-a, whose push ended long ago,
    # must re-push its share of node 1 by itself, or node 0 waits for it until the round timeout.
    second.push(round_header("party-b"), vector_slices(vectors["party-b"], range(NUM_SLICES)))
    expected = vectors["party-a"].astype(np.float64) + vectors["party-b"]
    for client in (first, second):
        assert np.allclose(combined(client, 1, timeout=15), expected, atol=1e-5)
    assert time.monotonic() - began < 15
    assert 1 in first.lost_nodes and 1 in second.lost_nodes


def test_a_restarted_node_is_readmitted_by_every_party_at_the_same_round(cluster):
    nodes, connect = cluster
    first, second = connect("party-a"), connect("party-b")
    vector = np.ones(NUM_SLICES * SLICE_LENGTH, dtype=np.float32)

    def run_round(round_number: int) -> None:
        for client, party in ((first, "party-a"), (second, "party-b")):
            client.push(round_header(party, round_number), vector_slices(vector, range(NUM_SLICES)))
        for client in (first, second):
            assert np.allclose(combined(client, round_number, timeout=15), 2.0)

    run_round(1)
    nodes.kill(1)
    wait_lost(first, 1)
    wait_lost(second, 1)
    run_round(2)  # node 0 serves both shares
    nodes.restart(1)
    # party-a probes first, before round 3: node 1 names round 4, since party-b may not have probed
    # yet; party-b, probing before round 3 too, gets the same answer. Neither routes to it mid-round.
    run_round(3)
    assert 1 in first.lost_nodes and 1 in second.lost_nodes
    run_round(4)
    assert not first.lost_nodes and not second.lost_nodes
    state = nodes.workdir / "node-1" / "job-f"
    assert sorted(path.name for path in state.glob("round-*.bin")) == ["round-1-0-s1.bin", "round-4-0-s1.bin"]
    assert not (nodes.workdir / "node-0" / "job-f" / "round-4-0-s1.bin").exists()


def test_a_restarted_party_reaches_peers_that_moved_the_relay_and_then_routes_as_they_do(cluster):
    # Found by the lattice soak: node 0 (the relay) died and came back, then the leader died. The
    # survivors had moved the relay to node 1 until the next round boundary; the leader's new
    # process counted no node lost and asked back in through node 0, where nobody listened, and a
    # survivor waited for the leader's word until the message timeout.
    nodes, connect = cluster
    peer = connect("party-a")
    nodes.kill(0)
    wait_lost(peer, 0)
    nodes.restart(0)
    fresh = connect("party-b")  # a restarted party: its new process counts no node lost
    assert not fresh.lost_nodes
    fresh.send(CONTROL_ROUND, "rejoin/1", b"through its relay", ["party-a"])
    with pytest.raises(MessageTimeoutError):
        peer.recv(CONTROL_ROUND, "rejoin/1", "party-b", timeout=1.5)  # node 0: party-a does not listen there
    fresh.send_through_every_node(CONTROL_ROUND, "rejoin/2", b"take me back", ["party-a"])
    assert peer.recv(CONTROL_ROUND, "rejoin/2", "party-b", timeout=10) == b"take me back"
    # The admission goes through every node too, node 0 included: both saw the request (each now
    # counts party-b a dead process until it is admitted), so both must see that it was.
    peer.send_through_every_node(CONTROL_ROUND, "admit/2", b"welcome", ["party-b"])
    assert fresh.recv(CONTROL_ROUND, "admit/2", "party-a", timeout=10) == b"welcome"
    # Admitted, it counts lost what its admitter does: one relay, one routing, one readmission round.
    fresh.adopt_lost(peer.lost())
    assert fresh.lost_nodes == {0}
    fresh.send(1, "bound/0", b"routed alike", ["party-a"])
    assert peer.recv(1, "bound/0", "party-b", timeout=10) == b"routed alike"
    vector = np.ones(NUM_SLICES * SLICE_LENGTH, dtype=np.float32)
    for round_number in (1, 2):
        for client, party in ((peer, "party-a"), (fresh, "party-b")):
            client.push(round_header(party, round_number), vector_slices(vector, range(NUM_SLICES)))
            time.sleep(1.0)  # party-b's header comes late: a node that missed the admission aborts meanwhile
        for client in (peer, fresh):
            assert np.allclose(combined(client, round_number, timeout=15), 2.0)
    assert not peer.lost_nodes and not fresh.lost_nodes, "both took node 0 back at round 2"
