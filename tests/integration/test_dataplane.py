"""The data plane behind the gRPC service: batches, checkpoints while a party is away, Health."""

from __future__ import annotations

import json

import numpy as np
import pytest

from confide.aggregator import AggregatorConfig, serve
from confide.transport.certs import Identity, init_federation
from confide.transport.client import AGGREGATOR, AggregatorClient
from confide.v1 import runtime_pb2 as pb
from tests.fixtures.waiting import wait_for

PARTIES = ["party-a", "party-b", "party-c"]
L, SLICES = 256, 40


@pytest.fixture
def node(tmp_path):
    init_federation(tmp_path / "certs", parties=PARTIES)
    config = AggregatorConfig(round_timeout_s=30.0, dropout_grace_s=5.0, checkpoint_after_s=0.2)
    server, port, core = serve(Identity.load(tmp_path / "certs", "aggregator"), "127.0.0.1:0", config)
    clients = []

    def client(name):
        c = AggregatorClient(
            f"127.0.0.1:{port}", Identity.load(tmp_path / "certs", name), "job-d", message_timeout_s=10
        )
        c.connect()
        clients.append(c)
        return c

    yield client, core
    for c in clients:
        c.close()
    server.stop(grace=None).wait()
    core.close()


def header(party, **extra):
    return pb.RoundHeader(
        job_id="job-d",
        round=1,
        attempt=0,
        party_id=party,
        participants=PARTIES,
        kind=pb.AGGREGATION_KIND_FLOAT32_SUM,
        num_slices=SLICES,
        slice_length=L,
        vector_length=SLICES * L,
        routing=pb.RESULT_ROUTING_ALL,
        mode="plain",
        **extra,
    )


def slices(vector, indices):
    return [pb.Slice(index=i, n_valid=L, payload=vector[i * L : (i + 1) * L].astype("<f4").tobytes()) for i in indices]


def collect(client):
    return np.concatenate(
        [
            np.frombuffer(client.wait(("job-d", 1, f"agg/0/{i}", AGGREGATOR), 10).payload, dtype="<f4")
            for i in range(SLICES)
        ]
    )


def test_batched_slices_in_any_order_sum_to_the_float64_reference(node):
    client, core = node
    rng = np.random.default_rng(4)
    vectors = {p: rng.standard_normal(SLICES * L).astype(np.float32) for p in PARTIES}
    links = {p: client(p) for p in PARTIES}
    for p in PARTIES:
        order = rng.permutation(SLICES)
        reply = links[p].push(header(p), slices(vectors[p], order) + slices(vectors[p], order[:3]))
        assert reply.accepted == SLICES and reply.duplicates == 3
    got = collect(links["party-a"])
    reference = sum(v.astype(np.float64) for v in vectors.values())
    assert np.max(np.abs(got - reference)) <= 1e-5 * np.max(np.abs(reference))
    health = links["party-b"].health()
    assert health.simd in ("avx512", "avx2", "scalar") and health.workers >= 1
    assert health.peak_staged_bytes > 0 and health.staged_bytes == 0
    assert json.loads(health.enclave_report)["mode"] == "simulation"


def test_partial_sums_checkpointed_while_a_party_is_away_then_restored(node):
    client, core = node
    rng = np.random.default_rng(5)
    vectors = {p: rng.standard_normal(SLICES * L).astype(np.float32) for p in PARTIES}
    links = {p: client(p) for p in PARTIES}
    for p in PARTIES[:2]:
        links[p].push(header(p), slices(vectors[p], range(SLICES)))
    # party-c shows up, sends half its slices and its stream ends: it is away with slices missing.
    links["party-c"].push(header("party-c"), slices(vectors["party-c"], range(SLICES // 2)))
    state = next(iter(core._rounds.values()))
    wait_for(lambda: state.checkpoint is not None, 4, "a checkpoint written while party-c was away")
    assert core.dataplane.stats()["staged_bytes"] == 0  # partial sums left memory
    # Back within the grace period: the rest of its slices, and the round completes exactly.
    links["party-c"].push(header("party-c"), slices(vectors["party-c"], range(SLICES)))
    got = collect(links["party-a"])
    reference = sum(v.astype(np.float64) for v in vectors.values())
    assert np.max(np.abs(got - reference)) <= 1e-5 * np.max(np.abs(reference))
    assert state.checkpoints_written == 1 and state.status == "complete"


def test_batch_with_a_bad_slice_is_refused_and_the_rest_survive(node):
    client, core = node
    a, b, c = (client(p) for p in PARTIES)
    good = np.ones(SLICES * L, dtype=np.float32)
    # A NaN is found by the worker folding it, after the batch's other slices were dispatched.
    bad = slices(np.full(SLICES * L, np.nan, dtype=np.float32), [0])[0]
    from confide.errors import ProtocolError

    with pytest.raises(ProtocolError, match="slice 0.*finite"):
        a.push(header("party-a"), [*slices(good, range(1, SLICES)), bad])
    state = next(iter(core._rounds.values()))
    assert state.contributed["party-a"] == SLICES - 1  # the 39 good slices stayed folded and counted
    reply = a.push(header("party-a"), slices(good, range(SLICES)))
    assert (reply.accepted, reply.duplicates) == (1, SLICES - 1)
    assert state.contributed["party-a"] == SLICES
    b.push(header("party-b"), slices(good, range(SLICES)))
    c.push(header("party-c"), slices(good, range(SLICES)))
    assert np.array_equal(collect(b), np.full(SLICES * L, 3.0, dtype=np.float32))
