"""The Rust data path (crate confide-aggnet): PushSlices on the aggregator's data port over mTLS.

The runtime's jobs in the rest of the suite go through it too (clients find the port in
Health); these tests pin what is particular to it: the same replies and status codes as the
Python service, identities from the TLS layer, a stream dropped mid-round, and the fallback
to the control port when the data path is switched off.
"""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from confide.aggregator import AggregatorConfig, serve
from confide.transport import tls
from confide.transport.certs import Identity, init_federation
from confide.transport.client import AggregatorClient
from confide.v1 import runtime_pb2 as pb
from confide.v1 import runtime_pb2_grpc as rpc
from tests.fixtures.waiting import wait_for

PARTIES = ["party-a", "party-b"]


def start(tmp_path, **config):
    init_federation(tmp_path / "certs", parties=PARTIES)
    events: list[tuple[str, str, object]] = []
    observer = (lambda *event: events.append(event)) if config.pop("observe", False) else None
    defaults = dict(round_timeout_s=5.0, dropout_grace_s=0.5)
    defaults.update(config)
    server, port, core = serve(
        Identity.load(tmp_path / "certs", "aggregator"), "127.0.0.1:0", AggregatorConfig(**defaults), observer=observer
    )
    return server, port, core, events


@pytest.fixture
def node(tmp_path):
    server, port, core, _ = start(tmp_path)
    yield port, core, tmp_path
    server.stop(grace=None).wait()
    core.close()


def header(party: str, *, length: int = 10, **extra) -> pb.PushMessage:
    fields = dict(
        job_id="job-1",
        round=1,
        attempt=0,
        party_id=party,
        participants=PARTIES,
        kind=pb.AGGREGATION_KIND_FLOAT32_SUM,
        num_slices=1,
        slice_length=16,
        vector_length=length,
        routing=pb.RESULT_ROUTING_ALL,
        mode="plain",
    )
    fields.update(extra)
    return pb.PushMessage(header=pb.RoundHeader(**fields))


def batch(values, *, index: int = 0, n_valid: int | None = None) -> pb.PushMessage:
    data = np.asarray(values, dtype="<f4").tobytes()
    return pb.PushMessage(
        batch=pb.SliceBatch(
            indices=[index], n_valid=[len(values) if n_valid is None else n_valid], lengths=[len(data)], payload=data
        )
    )


def data_stub(tmp_path, port: int, core, name: str = "party-a") -> rpc.AggregationStub:
    channel = tls.channel(f"127.0.0.1:{core.data_server.port}", Identity.load(tmp_path / "certs", name))
    return rpc.AggregationStub(channel)


def test_health_reports_the_data_port_and_parties_push_through_it(node):
    port, core, tmp_path = node
    clients = [
        AggregatorClient(f"127.0.0.1:{port}", Identity.load(tmp_path / "certs", p), "job-1", reconnect_timeout_s=3)
        for p in PARTIES
    ]
    try:
        for c in clients:
            c.connect()
            assert c.health().data_port == core.data_server.port != port
            assert c._nodes[0].data_channel is not None
        values = np.arange(10, dtype=np.float32)
        replies = [c.push(header(p).header, [pb.Slice(index=0, n_valid=10, payload=values.tobytes())]) for c, p in
                   zip(clients, PARTIES, strict=True)]  # fmt: skip
        assert [r.accepted for r in replies] == [1, 1]
        assert replies[-1].round_complete
        assert core.data_path.streams_opened == 2  # both streams went through the Rust path
        for c in clients:
            combined = c.wait(("job-1", 1, "agg/0/0", "aggregator"), 5)
            np.testing.assert_array_equal(np.frombuffer(combined.payload, "<f4"), 2 * values)
    finally:
        for c in clients:
            c.close()


def push(stub: rpc.AggregationStub, messages: list[pb.PushMessage]) -> pb.PushReply:
    return stub.PushSlices(iter(messages), timeout=5)


def status_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as error:
        call()
    return error.value.code(), error.value.details()


def test_the_data_port_answers_bad_input_like_the_python_service(node):
    port, core, tmp_path = node
    stub = data_stub(tmp_path, port, core)
    ones = np.ones(10)
    code, details = status_of(lambda: push(stub, [batch(ones)]))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "a PushSlices stream must start with a header")
    code, details = status_of(lambda: push(stub, [header("party-a"), header("party-a")]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "only the first message" in details
    code, details = status_of(lambda: push(stub, [header("party-a"), batch(ones, n_valid=9)]))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "slice.n_valid of slice 0 is 9; it must be 10")
    code, details = status_of(lambda: push(stub, [header("party-a"), batch(ones, index=3)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "slice.index 3 is out of range" in details
    code, details = status_of(lambda: push(stub, [header("party-a"), batch([np.nan] * 10)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "non-finite" in details
    code, details = status_of(lambda: push(stub, [header("party-b")]))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "certificate names 'party-a'" in details
    code, details = status_of(lambda: push(stub, [header("party-a", length=11)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "header.vector_length of 'party-a' (11) differs" in details
    code, _ = status_of(lambda: stub.Health(pb.HealthRequest(), timeout=5))
    assert code == grpc.StatusCode.UNIMPLEMENTED
    # nothing refused above was lost or double counted: the round still completes exactly
    reply = push(stub, [header("party-a"), batch(ones), batch(ones)])
    assert (reply.accepted, reply.duplicates, reply.round_complete) == (1, 1, False)
    reply = push(data_stub(tmp_path, port, core, "party-b"), [header("party-b"), batch(ones)])
    assert (reply.accepted, reply.round_complete) == (1, True)
    # a late copy after completion is counted, not refused
    reply = push(stub, [header("party-a"), batch(ones)])
    assert reply.round_complete


def test_a_peer_from_another_ca_or_without_a_certificate_cannot_connect(node, tmp_path):
    port, core, _ = node
    init_federation(tmp_path / "rogue" / "certs", parties=PARTIES)
    rogue = data_stub(tmp_path / "rogue", port, core)
    code, _ = status_of(lambda: push(rogue, [header("party-a")]))
    assert code == grpc.StatusCode.UNAVAILABLE
    ca = (tmp_path / "certs" / "ca.crt").read_bytes()
    target = f"127.0.0.1:{core.data_server.port}"
    with grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca)) as channel:
        code, _ = status_of(lambda: push(rpc.AggregationStub(channel), [header("party-a")]))
    assert code == grpc.StatusCode.UNAVAILABLE


def test_a_stream_cut_mid_round_is_a_dropout(node):
    port, core, tmp_path = node
    stub = data_stub(tmp_path, port, core)
    hold = threading.Event()

    def messages():
        yield header("party-a", length=20, num_slices=2, slice_length=10)
        yield batch(np.ones(10))
        hold.wait(10)

    call = stub.PushSlices.future(messages(), timeout=10)
    wait_for(lambda: core._rounds, 5, "the round to open", every_s=0.02)
    time.sleep(0.3)  # the first batch folds
    call.cancel()  # the party's connection goes away with a slice missing
    hold.set()
    state = next(iter(core._rounds.values()))
    wait_for(lambda: state.status != "open", 5, "the round to close")
    assert state.status == "aborted"
    assert "party-a dropped out" in state.reason
    assert state.contributed.get("party-a") == 1


def test_observers_see_every_slice_of_the_data_path(tmp_path):
    server, port, core, events = start(tmp_path, observe=True)
    try:
        stub = data_stub(tmp_path, port, core)
        push(stub, [header("party-a"), batch(np.ones(10))])
        kinds = [(event, party) for event, party, _ in events]
        assert kinds == [("header", "party-a"), ("slice", "party-a")]
        assert events[1][2].n_valid == 10
    finally:
        server.stop(grace=None).wait()
        core.close()


def test_without_the_data_path_slices_go_through_the_python_service(tmp_path):
    server, port, core, _ = start(tmp_path, data_port=None)
    try:
        assert core.data_server is None
        client = AggregatorClient(f"127.0.0.1:{port}", Identity.load(tmp_path / "certs", "party-a"), "job-1")
        client.connect()
        assert client.health().data_port == 0 and client._nodes[0].data_channel is None
        reply = client.push(header("party-a").header, [pb.Slice(index=0, n_valid=10, payload=bytes(40))])
        assert reply.accepted == 1
        client.close()
    finally:
        server.stop(grace=None).wait()
        core.close()
