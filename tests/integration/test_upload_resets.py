"""A party's round upload across connection resets and half-open connections, on loopback.

The aggregator runs in-process; the party under test reaches both its ports through
:class:`~tests.fixtures.tcpproxy.TcpProxy` on 127.0.0.2 (same port numbers, so the data port the
aggregator reports in Health is proxied too), the other party talks to it directly. These pin
what tests/integration/test_wan.py met over Toxiproxy once in three CI runs: after resets, a
party re-uploaded and its push ended without error, yet slices were missing and the aggregator
waited for them ("away").
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from confide.aggregator import AggregatorConfig, serve
from confide.party.upload import PartyExchange, RoundUpload
from confide.transport.certs import Identity, init_federation
from confide.transport.client import AGGREGATOR, AggregatorClient
from confide.v1 import runtime_pb2 as pb
from tests.fixtures.tcpproxy import TcpProxy
from tests.integration.conftest import make_spec

PARTIES = ["party-a", "party-b"]
SLICES, LENGTH = 400, 256
PROXY_HOST = "127.0.0.2"


def _loopback_alias_usable() -> bool:
    try:
        with socket.create_server((PROXY_HOST, 0)):
            return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _loopback_alias_usable(), reason=f"cannot listen on {PROXY_HOST} here")


class Federation:
    def __init__(self, tmp_path) -> None:
        certs = tmp_path / "certs"
        init_federation(certs, parties=PARTIES, hosts=["localhost", "127.0.0.1", PROXY_HOST])
        config = AggregatorConfig(round_timeout_s=60.0, dropout_grace_s=5.0)
        self.server, port, self.core = serve(Identity.load(certs, "aggregator"), "127.0.0.1:0", config)
        data_port = self.core.data_server.port
        self.control = TcpProxy(f"{PROXY_HOST}:{port}", f"127.0.0.1:{port}")
        self.data = TcpProxy(f"{PROXY_HOST}:{data_port}", f"127.0.0.1:{data_port}")
        self.a = AggregatorClient(f"{PROXY_HOST}:{port}", Identity.load(certs, "party-a"), "job-1")
        self.b = AggregatorClient(f"127.0.0.1:{port}", Identity.load(certs, "party-b"), "job-1")
        self.a.connect(10)
        self.b.connect(10)
        assert self.a._nodes[0].data_port == data_port  # party-a pushes through the data-port proxy

    def close(self) -> None:
        for item in (self.a, self.b, self.control, self.data):
            item.close()
        self.server.stop(grace=None).wait()
        self.core.close()

    def state(self):
        return next(iter(self.core._rounds.values()), None)

    def a_is_streaming(self) -> bool:
        state = self.state()
        return state is not None and "party-a" in state.joined and "party-a" not in state.broken


@pytest.fixture
def federation(tmp_path):
    made = Federation(tmp_path)
    yield made
    made.close()


def header(party: str) -> pb.RoundHeader:
    return pb.RoundHeader(
        job_id="job-1",
        round=1,
        attempt=0,
        party_id=party,
        participants=PARTIES,
        kind=pb.AGGREGATION_KIND_FLOAT32_SUM,
        num_slices=SLICES,
        slice_length=LENGTH,
        vector_length=SLICES * LENGTH,
        routing=pb.RESULT_ROUTING_ALL,
        mode="plain",
    )


def slice_of(index: int) -> pb.Slice:
    return pb.Slice(index=index, n_valid=LENGTH, payload=np.full(LENGTH, index, "<f4").tobytes())


def slow_slice(index: int) -> pb.Slice:
    time.sleep(0.005)  # encoding takes a while, so a reset can land mid-upload
    return slice_of(index)


def until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


def upload_of(federation: Federation) -> tuple[PartyExchange, RoundUpload]:
    spec = make_spec(parties=PARTIES, transport={"reconnect_timeout_s": 30.0})
    exchange = PartyExchange(federation.a)
    upload = RoundUpload(federation.a, header("party-a"), slow_slice, SLICES, spec.transport)
    exchange.upload = upload
    return exchange, upload


def party_b_pushes(federation: Federation):
    """Party b pushes every slice in a thread; returns a wait for that push (True once it is accepted).

    A test resets or hangs party a's connection only after b's push is in: cut too, b (a bare client
    without the party's retries) would never send the rest, and a slow machine made that likely.
    """
    slices = [slice_of(i) for i in range(SLICES)]
    replies: list = []
    thread = threading.Thread(target=lambda: replies.append(federation.b.push(header("party-b"), slices)), daemon=True)
    thread.start()

    def pushed(timeout: float = 30.0) -> bool:
        thread.join(timeout)
        return bool(replies)

    return pushed


def every_result(exchange: PartyExchange, timeout: float) -> float:
    """Seconds until every combined slice arrived (each the sum of both parties' values)."""
    began = time.monotonic()
    for index in range(SLICES):
        remaining = max(0.1, timeout - (time.monotonic() - began))
        combined = exchange.wait(("job-1", 1, f"agg/0/{index}", AGGREGATOR), remaining)
        assert np.frombuffer(combined.payload, "<f4")[0] == 2 * index
    return time.monotonic() - began


def test_an_upload_reset_while_it_waits_for_the_scale_still_sends_every_slice(federation):
    """Streams that broke while their request iterator waited for release stay suspended in gRPC.

    On release each one produced a batch into the shared cache beside the live stream; the
    cache then held duplicates, and the retry after the next reset started past slices it had
    never sent: its push ended normally, and the aggregator waited for them ("away").
    """
    exchange, upload = upload_of(federation)
    upload.start()
    assert until(federation.a_is_streaming)
    for _ in range(2):  # two streams reset after their header went out, while slices are held back
        accepted = federation.data.accepted
        assert federation.data.reset() == 1
        federation.control.reset()
        assert until(lambda accepted=accepted: federation.data.accepted > accepted and federation.a_is_streaming())
        time.sleep(0.3)  # the retried stream's request iterator is waiting for release too
    upload.release()
    b_pushed = party_b_pushes(federation)
    assert until(lambda: len({item.index for item in list(upload._cache)}) > SLICES // 3)
    assert b_pushed()
    federation.data.reset()  # mid-upload: the retry resends the cache and produces the rest
    federation.control.reset()

    every_result(exchange, timeout=20.0)
    upload.join()
    assert upload.error is None
    assert [item.index for item in upload._cache] == list(range(SLICES))


def test_a_half_open_upload_moves_to_a_fresh_connection_once_the_party_reconnects(federation):
    """The data connection swallows bytes for good; the control connection resets and comes back."""
    exchange, upload = upload_of(federation)
    upload.start()
    upload.release()
    b_pushed = party_b_pushes(federation)
    assert until(lambda: len(upload._cache) > SLICES // 3)
    assert b_pushed()
    assert federation.data.hang() == 1
    federation.control.reset()

    # Renewed on the reconnect, well before any keepalive could notice (the slowest takes ~12 s).
    assert every_result(exchange, timeout=30.0) < 5.0
    upload.join()
    assert upload.error is None and upload.reply is not None


def test_a_half_open_data_connection_alone_is_found_by_the_keepalive(federation):
    """Nothing else breaks, so only the data channel's keepalive ping can end the dead stream."""
    exchange, upload = upload_of(federation)
    upload.start()
    upload.release()
    b_pushed = party_b_pushes(federation)
    assert until(lambda: len(upload._cache) > SLICES // 3)
    assert b_pushed()
    assert federation.data.hang() == 1

    # Keepalive time 2 s and ping timeout 10 s: found within about 12 s (gRPC's own default: 60 s).
    assert every_result(exchange, timeout=40.0) < 20.0
    upload.join()
    assert upload.error is None and upload.reply is not None
