"""A party's connection to the aggregator: push slices, relay messages, receive deliveries.

A background thread holds the party's Subscribe stream and files every delivery into the
:class:`MessagePool` under ``(job, round, tag, sender)``:

- combined slices under tag ``agg/<attempt>/<index>`` from ``"aggregator"``;
- round aborts under ``abort/<attempt>`` from ``"aggregator"``;
- relayed envelopes under their own tag and sender.

When the stream breaks (network, aggregator restart) the thread reconnects and the party
re-sends every envelope of the recent rounds: receivers ignore what they already have, so a
restarted relay loses nothing that still matters. Bytes are counted per round as serialized
on the wire (protobuf size), both directions.

Slices go out in batches (:class:`SliceBatch`, about 1 MiB each) so that per-message overhead
stays off the data path. With an aggregator cluster (``target`` lists several nodes) every
node holds a Subscribe stream; slices are split by share (:mod:`confide.transport.routing`)
and each share is pushed to the node serving it. A node whose delivery stream stays broken for
``node_grace_s``, or that refuses connections while slices or envelopes go to it, is marked
lost: its share goes to the next live node (:func:`~confide.transport.routing.serving_node`).
The client keeps the slices of its pushes of the last two rounds by share, and re-pushes every
share the lost node served (completed or not) to that node at once: a node that delivered part
of a share, or delivered it to some parties only, leaves no party waiting for its results.

The relay is the first live node (``serving_node(0, ...)``), so every party that has found the
same nodes lost sends to the same one. Every party subscribes to every live node, so an
envelope reaches its recipients through whichever live node carries it. When the relay node is
lost the party re-sends its retained envelopes of the open rounds to the new one: an envelope
the old relay took but never delivered arrives through the new one.

A lost node is probed (``Health`` with the job and round) before each new round the party
pushes; the node answers with the round from which it serves again, fixed by the first probe
of the loss at that probe's round + 1. No party has pushed that round yet, so every party routes
to the node again from the same round on, and never changes routing mid-round.

One module of about 870 lines, past the project's ~800: the subscribe threads, the relay's
fail-over, node loss and re-admission and the retained uploads are one state machine under one
lock (:class:`AggregatorClient`), and each of them reads and changes the others' state. The
per-node channels (:class:`_Node`) are the one part that stands alone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from confide.crypto.identity import Identity
from confide.errors import ConfideError, MessageTimeoutError, RoundAbortedError, TransportUnavailableError
from confide.transport import tls
from confide.transport.pool import Interrupted, MessagePool
from confide.transport.routing import node_for, serving_node
from confide.transport.slicing import Paced
from confide.transport.status import from_rpc_error
from confide.v1 import runtime_pb2 as pb
from confide.v1 import runtime_pb2_grpc as rpc

__all__ = [
    "AGGREGATOR",
    "ACK_PREFIX",
    "ADMIT_PREFIX",
    "CONTROL_ROUND",
    "REJOIN_PREFIX",
    "RELEASE_PREFIX",
    "AggregatorClient",
    "batched",
    "parse_targets",
]

log = logging.getLogger("confide.transport")
AGGREGATOR = "aggregator"
#: The round number of a job's membership messages (a party asking to rejoin, its admission):
#: outside every training round, so the relay never retires them with a round's messages.
CONTROL_ROUND = 2**32 - 1
#: Tag prefix of a restarted party's request to rejoin (sent at ``CONTROL_ROUND``).
REJOIN_PREFIX = "rejoin/"
#: Tag prefix of a peer's admission of a restarted party (at ``CONTROL_ROUND``).
ADMIT_PREFIX = "admit/"
#: Tag prefix of a party's word to the relay that it is done with some of its mailbox (at
#: ``CONTROL_ROUND``, to itself; never delivered): ``release/<round>/<tag prefix>``.
RELEASE_PREFIX = "release/"
#: Tag prefix of a party's acknowledgement of its mailbox up to a sequence number (at
#: ``CONTROL_ROUND``, to itself; never delivered): ``ack/<epoch>/<seq>``. The relay drops what it covers.
ACK_PREFIX = "ack/"
#: How often a party acknowledges what it filed (seconds), per aggregator node.
ACK_INTERVAL_S = 0.2
#: Slices per push message: up to this many bytes or slices, whichever comes first.
BATCH_BYTES = 1 << 20
BATCH_SLICES = 64
#: Keepalive of a data-port channel. A push stream on a half-open connection (its far end gone,
#: its bytes still accepted) never errors by itself; only an unanswered keepalive ping ends it.
#: grpcio (measured with 1.85) closes such a connection after ``ping_timeout_ms`` (default one
#: minute), not after ``keepalive_timeout_ms``: without it a half-open upload hung until the data
#: server's own keepalive gave up, about 40 s. The 10 s allowance covers a ping queued behind a
#: full send buffer on a slow uplink.
DATA_CHANNEL_OPTIONS = (("grpc.keepalive_time_ms", 2_000), ("grpc.http2.ping_timeout_ms", 10_000))


def parse_targets(target: str | Sequence[str]) -> list[str]:
    """Aggregator node addresses from "host:port[,host:port...]" or a list."""
    items = target.split(",") if isinstance(target, str) else list(target)
    targets = [t.strip() for t in items if t.strip()]
    if not targets:
        raise ValueError("aggregator must name at least one host:port")
    return targets


def batched(header: pb.RoundHeader, slices: Iterable[pb.Slice], sent: dict[int, int] | None = None):
    """The push stream: the header, then slices grouped into :class:`SliceBatch` messages.

    A batch closes when it is full, or when ``slices`` has a ``ready()`` that says the next slice
    is still being protected (:class:`confide.transport.slicing.Paced`): what is done goes on the
    wire now instead of waiting, so protection and transmission overlap.
    """
    ready = getattr(slices, "ready", None)
    message = pb.PushMessage(header=header)
    if sent is not None:
        sent[header.round] += message.ByteSize()
    yield message
    indices: list[int] = []
    n_valid: list[int] = []
    lengths: list[int] = []
    payloads: list[bytes] = []
    size = 0
    for item in slices:
        indices.append(item.index)
        n_valid.append(item.n_valid)
        lengths.append(len(item.payload))
        payloads.append(item.payload)
        size += len(item.payload)
        if size >= BATCH_BYTES or len(indices) >= BATCH_SLICES or (ready is not None and not ready()):
            message = pb.PushMessage(
                batch=pb.SliceBatch(indices=indices, n_valid=n_valid, lengths=lengths, payload=b"".join(payloads))
            )
            if sent is not None:
                sent[header.round] += message.ByteSize()
            yield message
            indices, n_valid, lengths, payloads, size = [], [], [], [], 0
    if indices:
        message = pb.PushMessage(
            batch=pb.SliceBatch(indices=indices, n_valid=n_valid, lengths=lengths, payload=b"".join(payloads))
        )
        if sent is not None:
            sent[header.round] += message.ByteSize()
        yield message


class _RetainedUpload:
    """One pushed attempt's slices by share, kept so that a lost node's share can go elsewhere.

    The slices arrive as the mode releases them (:meth:`add`, then :meth:`close`); each share's
    push streams them from the first (:meth:`stream`), the header having gone out at once.
    """

    def __init__(self, header: pb.RoundHeader, nodes: int) -> None:
        self.header = header
        self.shares: dict[int, list[pb.Slice]] = {share: [] for share in range(nodes)}
        #: Share -> the node it went to last.
        self.served: dict[int, int] = {}
        #: Share -> pushes of it under way (such a push moves on by itself when its node is lost).
        self.pushing: dict[int, int] = defaultdict(int)
        self.lock = threading.Lock()
        self._routed = threading.Condition(self.lock)
        self._closed = False

    def add(self, share: int, item: pb.Slice) -> None:
        with self._routed:
            self.shares[share].append(item)
            self._routed.notify_all()

    def close(self) -> None:
        """No slice follows: every share's stream ends after its last."""
        with self._routed:
            self._closed = True
            self._routed.notify_all()

    def stream(self, share: int) -> Paced[pb.Slice]:
        """The share's slices from the first, as they come, until :meth:`close`."""
        sent = [0]

        def items():
            while True:
                with self._routed:
                    while sent[0] == len(self.shares[share]) and not self._closed:
                        self._routed.wait()
                    ready, closed = self.shares[share][sent[0] :], self._closed
                for item in ready:
                    sent[0] += 1
                    yield item
                if closed:
                    return

        def ready() -> bool:
            with self.lock:
                return self._closed or sent[0] < len(self.shares[share])

        return Paced(items(), ready)


class _Node:
    """One aggregator node: its channel, stubs and delivery stream."""

    def __init__(self, index: int, target: str, identity: Identity) -> None:
        self.index = index
        self.target = target
        self.identity = identity
        self.channel = tls.channel(target, identity)
        self.aggregation = rpc.AggregationStub(self.channel)
        self.relay = rpc.RelayStub(self.channel)
        #: Where PushSlices goes: the node's data port (Rust data path) once found, else here.
        self.push_stub = self.aggregation
        self.data_channel: grpc.Channel | None = None
        self.data_port = 0
        self.stream: grpc.Future | None = None
        self.thread: threading.Thread | None = None
        self.subscribed = threading.Event()
        self.broken_since: float | None = None
        #: The node's mailbox: its epoch, the newest delivery filed, the newest acknowledged.
        self.epoch = 0
        self.filed = 0
        self.acked = 0

    def filed_delivery(self, delivery: pb.Delivery) -> None:
        """``delivery`` is in the message pool: the node may drop it once told (see ``acknowledge``)."""
        if delivery.epoch != self.epoch:  # the node's process started anew: its numbering too
            self.epoch, self.filed, self.acked = delivery.epoch, 0, 0
        self.filed = max(self.filed, delivery.seq)

    def acknowledge(self, party_id: str, job_id: str, timeout: float) -> int:
        """Tell the node what was filed since the last time, if anything (``ack/<epoch>/<seq>``); bytes sent."""
        epoch, filed = self.epoch, self.filed
        if filed <= self.acked or not epoch:
            return 0
        envelope = pb.Envelope(
            job_id=job_id,
            round=CONTROL_ROUND,
            tag=f"{ACK_PREFIX}{epoch}/{filed}",
            sender=party_id,
            recipients=[party_id],
        )
        self.relay.Send(envelope, timeout=timeout, wait_for_ready=False)
        if self.epoch == epoch:
            self.acked = max(self.acked, filed)
        return envelope.ByteSize()

    def use_data_port(self, port: int, timeout: float) -> None:
        """Push slices to the node's data port; stay on the control port if it is unreachable."""
        host = self.target.rpartition(":")[0]
        channel = tls.channel(f"{host}:{port}", self.identity, DATA_CHANNEL_OPTIONS)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            channel.close()
            log.warning(
                "aggregator %s: data port %d unreachable within %g s; pushing slices through the control port "
                "(the Python path, slower)",
                self.target,
                port,
                timeout,
            )
            return
        self.data_channel = channel
        self.data_port = port
        self.push_stub = rpc.AggregationStub(channel)

    def refresh_data_port(self, timeout: float) -> None:
        """After a failed push: the node may have restarted with another data port."""
        try:
            reply = self.aggregation.Health(pb.HealthRequest(), timeout=timeout)
        except grpc.RpcError:
            return  # still away; the next attempt asks again
        self.follow_data_port(reply, timeout)

    def follow_data_port(self, reply: pb.HealthReply, timeout: float) -> None:
        """Push to the data port a Health reply names (a restarted node listens on a new one)."""
        if reply.data_port == self.data_port:
            return
        if self.data_channel is not None:
            self.data_channel.close()
        self.data_channel, self.data_port, self.push_stub = None, 0, self.aggregation
        if reply.data_port:
            self.use_data_port(reply.data_port, timeout)

    def renew_data_channel(self) -> bool:
        """Push over a fresh data-port connection from now on; the old one's streams fail at once.

        After the control connection broke and came back, the data connection may be half-open
        (a reset or a stall on the path leaves it accepting bytes that never arrive) and a push on
        it would wait for its keepalive to notice. Closing it cancels that push, whose retry then
        connects anew; the new channel is in place first, so the retry cannot pick the old one.
        """
        old = self.data_channel
        if old is None:
            return False
        host = self.target.rpartition(":")[0]
        self.data_channel = tls.channel(f"{host}:{self.data_port}", self.identity, DATA_CHANNEL_OPTIONS)
        self.push_stub = rpc.AggregationStub(self.data_channel)
        old.close()
        return True

    def probe(self, job_id: str, round_number: int, timeout: float) -> pb.HealthReply | None:
        """The Health of a node found lost, with its admission round; None while it stays away.

        It asks over a fresh channel, which then replaces the node's own: that one backed off
        reconnecting while the node was away and would refuse calls for up to its backoff (2 s)
        after the node is back.
        """
        channel = tls.channel(self.target, self.identity)
        try:
            # No wait_for_ready: a node still away must cost the round boundary nothing.
            reply = rpc.AggregationStub(channel).Health(
                pb.HealthRequest(job_id=job_id, round=round_number), timeout=timeout
            )
        except grpc.RpcError:
            channel.close()
            return None
        self.channel.close()
        self.channel = channel
        self.aggregation = rpc.AggregationStub(channel)
        self.relay = rpc.RelayStub(channel)
        if self.data_channel is None:
            self.push_stub = self.aggregation
        self.follow_data_port(reply, timeout)
        return reply

    @property
    def push_waits_for_ready(self) -> bool:
        """The control channel rides over restarts; a data channel fails fast and is re-found."""
        return self.data_channel is None


class AggregatorClient:
    """One party's link to the aggregator for one job.

    Parameters
    ----------
    target : str or list of str
        "host:port" of the aggregator, or its cluster's nodes ("h:p1,h:p2,...": the first live one relays).
    identity : Identity
        The party's certificate and key.
    job_id : str
        The job.
    reconnect_timeout_s : float
        How long calls keep retrying while the aggregator is unreachable.
    message_timeout_s : float
        Default wait for a relayed message.
    """

    def __init__(
        self,
        target: str,
        identity: Identity,
        job_id: str,
        *,
        reconnect_timeout_s: float = 60.0,
        message_timeout_s: float = 120.0,
        node_grace_s: float = 3.0,
    ) -> None:
        self.identity = identity
        self.party_id = identity.name
        self.job_id = job_id
        self.pool = MessagePool()
        self.reconnect_timeout_s = reconnect_timeout_s
        self.message_timeout_s = message_timeout_s
        self.bytes_sent: dict[int, int] = defaultdict(int)
        self.bytes_received: dict[int, int] = defaultdict(int)
        self.reconnects = 0
        self.node_grace_s = node_grace_s
        self._nodes = [_Node(i, t, identity) for i, t in enumerate(parse_targets(target))]
        #: Cluster nodes found lost (their shares are served by the next live node).
        self.lost_nodes: set[int] = set()
        self._lost_lock = threading.Lock()
        #: The newest round whose routing was settled (lost nodes probed before pushing it).
        self._routed_round = -1
        #: Round -> the newest attempt pushed in it (cluster only; the last two rounds).
        self._retained: dict[int, _RetainedUpload] = {}
        self._retained_lock = threading.Lock()
        self._sent: dict[tuple[int, str, tuple[str, ...]], pb.Envelope] = {}
        self._sent_lock = threading.Lock()
        self._closed = threading.Event()
        self._fatal: BaseException | None = None
        self._interrupt: tuple | None = None
        for node in self._nodes:
            node.thread = threading.Thread(
                target=self._subscribe_loop, args=(node,), name=f"confide-subscribe-{node.index}", daemon=True
            )
        self._acker = threading.Thread(target=self._ack_loop, name="confide-ack", daemon=True)

    @property
    def _relay(self) -> rpc.RelayStub:
        """The relay's stub: the first live node's on a cluster."""
        return self._nodes[self._relay_index()].relay

    @property
    def cluster_nodes(self) -> int:
        """Aggregator nodes (1: a single aggregator)."""
        return len(self._nodes)

    # -- lifecycle --------------------------------------------------------------------------
    def connect(self, timeout: float | None = None) -> None:
        """Open the delivery stream; raises if the aggregator refuses us or stays unreachable."""
        timeout = self.reconnect_timeout_s if timeout is None else timeout
        for node in self._nodes:
            try:
                reply = node.aggregation.Health(pb.HealthRequest(), timeout=timeout, wait_for_ready=True)
            except grpc.RpcError as error:
                raise from_rpc_error(error, f"connecting to the aggregator at {node.target}") from None
            log.info("connected to aggregator %s", reply.name)
            if reply.data_port:
                node.use_data_port(reply.data_port, min(timeout, 10.0))
        for node in self._nodes:
            assert node.thread is not None
            node.thread.start()
        self._acker.start()
        for node in self._nodes:
            if not node.subscribed.wait(timeout):
                raise TransportUnavailableError(
                    f"no delivery stream from the aggregator at {node.target} within {timeout:g} s"
                )
        self._raise_fatal()

    def health(self, node: int = 0) -> pb.HealthReply:
        """The Health reply of one node (the enclave key and report for tee mode)."""
        return self._call(
            lambda timeout: self._nodes[node].aggregation.Health(
                pb.HealthRequest(), timeout=timeout, wait_for_ready=True
            ),
            "asking the aggregator's health",
        )

    def close(self) -> None:
        """Acknowledge what was filed, stop the delivery streams and close the channels (once)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._acker.is_alive():
            self._acker.join(timeout=5)
        for node in self._nodes:
            if node.index not in self.lost_nodes:
                with contextlib.suppress(grpc.RpcError):  # best effort: the relay drops them two rounds on
                    node.acknowledge(self.party_id, self.job_id, timeout=1.0)
        for node in self._nodes:
            if node.stream is not None:
                node.stream.cancel()
        for node in self._nodes:
            if node.thread is not None and node.thread.is_alive():
                node.thread.join(timeout=5)
            node.channel.close()
            if node.data_channel is not None:
                node.data_channel.close()

    def raise_fatal(self) -> None:
        """Raise what made the connection unusable (refused identity, relay node lost)."""
        self._raise_fatal()

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _subscribe_loop(self, node: _Node) -> None:
        first = True
        cluster = len(self._nodes) > 1
        # A node found lost and re-admitted gets a new thread: this one ends once it is replaced.
        while (
            not self._closed.is_set()
            and node.index not in self.lost_nodes
            and node.thread is threading.current_thread()
        ):
            opened = time.monotonic()
            refused = False
            try:
                # On a cluster a dead node must fail fast (no wait_for_ready), so that it can be
                # declared lost; a single aggregator is waited for (it may be restarting).
                stream = node.relay.Subscribe(
                    pb.SubscribeRequest(job_id=self.job_id, party_id=self.party_id, acked=node.filed, epoch=node.epoch),
                    wait_for_ready=not cluster,
                )
                node.stream = stream
                node.subscribed.set()
                if not first and not cluster:
                    self.reconnects += 1
                    self._replay()
                first = False
                for delivery in stream:
                    if node.broken_since is not None:
                        # The node is back: what it held may be gone, so upload the open attempt again.
                        node.broken_since = None
                        self.reconnects += 1
                        if node.index == self._relay_index():
                            self._replay()
                    self._file(delivery)
                    node.filed_delivery(delivery)
            except grpc.RpcError as error:
                if self._closed.is_set():
                    return
                if error.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                    self._fatal = from_rpc_error(error, "subscribing to deliveries")
                    node.subscribed.set()
                    return
                log.info("delivery stream from %s broke (%s); reconnecting", node.target, error.code())
                refused = error.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - opened < 1.0
            if cluster:
                now = time.monotonic()
                if now - opened > 1.0 or node.broken_since is None:
                    node.broken_since = now  # a stream that had been up broke: the grace starts now
                elif refused and now - node.broken_since > 1.0:
                    # Its stream broke and new ones are refused for a second: the process is gone (or
                    # restarting, which loses its open rounds too). Every party sees the same refusals, so all
                    # move its share well before the grace, which covers streams a flaky link resets; one
                    # refusal alone may be this party's own link resetting.
                    self.mark_lost(node.index, "its delivery stream broke and it refuses new ones")
                    return
                if now - node.broken_since > self.node_grace_s:
                    self.mark_lost(node.index, f"its delivery stream stayed broken for {self.node_grace_s:g} s")
                    return
            time.sleep(0.2)

    def mark_lost(self, index: int, why: str) -> None:
        """Take a cluster node out of service: its share, and the relay if it was there, move to the next live node.

        The shares it served in the retained pushes go to their new node at once, and if it was the
        relay, the retained envelopes go to the new relay (in a background thread: the caller may be
        a delivery stream or a push).
        """
        nodes = len(self._nodes)
        if nodes == 1:
            return
        node = self._nodes[index]
        with self._lost_lock:
            if index in self.lost_nodes:
                return
            relay_before = serving_node(0, nodes, self.lost_nodes)
            self.lost_nodes.add(index)
            if len(self.lost_nodes) == nodes:
                self._fatal = TransportUnavailableError(
                    f"every one of the {nodes} aggregator nodes is lost; the last, node {index} ({node.target}): {why}"
                )
                return
            relay = serving_node(0, nodes, self.lost_nodes)
        if node.stream is not None:
            node.stream.cancel()  # it may still be open (a push failed first): its thread ends
        log.warning("aggregator node %d (%s) lost: %s; its share moves on", index, node.target, why)
        if relay != relay_before:
            log.warning(
                "the relay moves from aggregator node %d to node %d (%s); re-sending the envelopes of the open rounds",
                relay_before,
                relay,
                self._nodes[relay].target,
            )
        threading.Thread(
            target=self._recover_lost, args=(index, relay != relay_before), name="confide-failover", daemon=True
        ).start()

    def _recover_lost(self, index: int, relay_moved: bool) -> None:
        if relay_moved:
            self._replay()
        with self._retained_lock:
            uploads = sorted(self._retained.values(), key=lambda upload: upload.header.round)
        for upload in uploads:
            header = upload.header
            if (self.job_id, header.round, f"abort/{header.attempt}", AGGREGATOR) in self.pool:
                continue  # aborted: no node completes that attempt
            with upload.lock:
                moved = [share for share, node in upload.served.items() if node == index and not upload.pushing[share]]
            for share in moved:
                log.info("re-pushing share %d of round %d attempt %d", share, header.round, header.attempt)
                try:
                    self._push_share(upload, share)
                except (grpc.RpcError, ConfideError) as error:
                    log.warning("re-pushing share %d of round %d failed: %s", share, header.round, error)

    def _relay_index(self) -> int:
        """The node that relays: the first live one (the same for every party that lost the same nodes)."""
        with self._lost_lock:
            return serving_node(0, len(self._nodes), self.lost_nodes)

    def _readmit(self, round_number: int) -> None:
        """Before pushing a new round: lost nodes that are back and admit this round serve again."""
        with self._lost_lock:
            if round_number <= self._routed_round:
                return  # another attempt of a routed round: its routing stays
            self._routed_round = round_number
            lost = sorted(self.lost_nodes)
        for index in lost:
            node = self._nodes[index]
            reply = node.probe(self.job_id, round_number, timeout=2.0)
            if reply is None or reply.admitted_round > round_number:
                continue
            with self._lost_lock:
                self.lost_nodes.discard(index)
            log.warning(
                "aggregator node %d (%s) is back: it serves its share again from round %d",
                index,
                node.target,
                round_number,
            )
            node.broken_since = None
            node.subscribed.clear()
            node.thread = threading.Thread(
                target=self._subscribe_loop, args=(node,), name=f"confide-subscribe-{node.index}", daemon=True
            )
            node.thread.start()

    def _ack_loop(self) -> None:
        """Acknowledge what each node delivered and this party filed, every ``ACK_INTERVAL_S``.

        Apart from the delivery streams, so a slow acknowledgement (a far-away aggregator) never
        holds up receiving. A failed one is sent again with the next (an acknowledgement covers
        everything before it); a node that never hears one still drops its deliveries two rounds on.
        """
        while not self._closed.wait(ACK_INTERVAL_S):
            for node in list(self._nodes):
                if node.index in self.lost_nodes:
                    continue
                try:
                    # Counted with the membership messages: no training round's bytes.
                    self.bytes_sent[CONTROL_ROUND] += node.acknowledge(
                        self.party_id, self.job_id, timeout=max(1.0, 10 * ACK_INTERVAL_S)
                    )
                except grpc.RpcError as error:
                    log.debug("acknowledging deliveries to %s failed (%s)", node.target, error.code())

    def _file(self, delivery: pb.Delivery) -> None:
        body = delivery.WhichOneof("body")
        if body == "aggregate":
            item = delivery.aggregate
            key = (self.job_id, item.round, f"agg/{item.attempt}/{item.slice.index}", AGGREGATOR)
            value, round_number = item.slice, item.round
        elif body == "envelope":
            item = delivery.envelope
            key = (self.job_id, item.round, item.tag, item.sender)
            value, round_number = item.payload, item.round
        elif body == "control":
            item = delivery.control
            if item.kind == pb.RoundControl.KIND_EXCLUDED:
                # Each exclusion names everyone excluded so far: filed by size, the newest is the largest.
                key = (self.job_id, item.round, f"excluded/{item.attempt}/{len(item.dropped)}", AGGREGATOR)
            else:
                key = (self.job_id, item.round, f"abort/{item.attempt}", AGGREGATOR)
            value, round_number = item, item.round
        else:
            return
        self.bytes_received[round_number] += delivery.ByteSize()
        self.pool.put(key, value)

    # -- relay ------------------------------------------------------------------------------
    def send(self, round_number: int, tag: str, payload: bytes, recipients: Sequence[str]) -> None:
        """Relay ``payload`` to ``recipients`` (kept for re-sending after a reconnect)."""
        envelope = self._kept(round_number, tag, payload, recipients)
        self._call(lambda timeout: self._relay_send(envelope, timeout), "relaying")
        self.bytes_sent[round_number] += envelope.ByteSize()

    def _kept(self, round_number: int, tag: str, payload: bytes, recipients: Sequence[str]) -> pb.Envelope:
        """The envelope of a send, kept for re-sending after a reconnect (the last two rounds' and control ones)."""
        envelope = pb.Envelope(
            job_id=self.job_id,
            round=round_number,
            tag=tag,
            sender=self.party_id,
            recipients=list(recipients),
            payload=payload,
        )
        with self._sent_lock:
            self._sent[(round_number, tag, tuple(recipients))] = envelope
            newest = max((key[0] for key in self._sent if key[0] != CONTROL_ROUND), default=0)
            for key in [k for k in self._sent if 0 < k[0] < newest - 1]:
                del self._sent[key]
        return envelope

    def send_through_every_node(self, round_number: int, tag: str, payload: bytes, recipients: Sequence[str]) -> None:
        """Relay ``payload`` through every node, those this party counts lost too, not only its relay.

        For a rejoin request and its admission, which every node must see: a node that saw the
        request but not the admission would abort the joiner's attempts as a dead process's. A
        restarted party's fresh process counts no node lost, while the others may have moved the
        relay off a node that died and came back since (they take it back only at a round
        boundary): the request reaches them whichever node they listen to, and the admission
        reaches that node too, over a fresh channel (this party's own may be backing off), two
        seconds at most. A recipient files one copy. A node this party counts live must take it;
        with none, the last refusal is raised.
        """
        if len(self._nodes) == 1:
            self.send(round_number, tag, payload, recipients)
            return
        envelope = self._kept(round_number, tag, payload, recipients)
        delivered, failure, lost = False, None, self.lost()
        for node in self._nodes:
            try:
                if node.index in lost:
                    with contextlib.closing(tls.channel(node.target, self.identity)) as channel:
                        rpc.RelayStub(channel).Send(envelope, timeout=2.0, wait_for_ready=True)
                    continue
                node.relay.Send(envelope, timeout=max(1.0, self.reconnect_timeout_s / 4), wait_for_ready=False)
            except grpc.RpcError as error:
                if node.index not in lost:
                    failure = from_rpc_error(error, f"relaying {tag} through node {node.index}")
                continue
            delivered = True
            self.bytes_sent[round_number] += envelope.ByteSize()
        if not delivered and failure is not None:
            raise failure

    def adopt_lost(self, indices: Iterable[int]) -> None:
        """Count these nodes lost, as the party that admitted this restarted one does.

        Every party must relay through, and push each share to, the same node. A restarted party
        starts with no node lost; the others take a node that died back only at a round boundary
        (:meth:`_readmit`, asking the node, which answers all of them alike). Adopting their
        lost nodes puts this party on their routing, and its next push probes those nodes as
        theirs do. Nothing of this process went to them yet, so nothing moves.
        """
        for index in indices:
            if not 0 <= index < len(self._nodes) or len(self._nodes) == 1:
                continue
            node = self._nodes[index]
            with self._lost_lock:
                if index in self.lost_nodes or len(self.lost_nodes) + 1 == len(self._nodes):
                    continue
                self.lost_nodes.add(index)
            if node.stream is not None:
                node.stream.cancel()
            log.info("aggregator node %d (%s) counted lost, as by the party that admitted this one", index, node.target)

    def _relay_send(self, envelope: pb.Envelope, timeout: float) -> pb.RelayReply:
        """Send one envelope through the relay; on a cluster a relay node that refuses is lost and the next relays."""
        if len(self._nodes) == 1:
            return self._nodes[0].relay.Send(envelope, timeout=timeout, wait_for_ready=True)
        refused_since: dict[int, float] = {}
        while True:
            node = self._nodes[self._relay_index()]
            try:
                # No wait_for_ready: a dead relay node must fail fast so that the next one takes over.
                return node.relay.Send(envelope, timeout=timeout, wait_for_ready=False)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or self._closed.is_set():
                    raise
                # One refusal may be this party's link resetting; a node that keeps refusing for a
                # second is gone for everyone, and only then does the relay move (parties must agree).
                first = refused_since.setdefault(node.index, time.monotonic())
                if time.monotonic() - first < 1.0:
                    time.sleep(0.2)
                    continue
                self.mark_lost(
                    node.index, f"relaying failed for {time.monotonic() - first:.1f} s ({error.code().name})"
                )
                self._raise_fatal()

    def _replay(self) -> None:
        with self._sent_lock:
            envelopes = list(self._sent.values())
        for envelope in envelopes:
            try:
                self._relay_send(envelope, self.reconnect_timeout_s)
            except (grpc.RpcError, TransportUnavailableError) as error:
                log.warning("re-sending %s failed: %s", envelope.tag, error)
                return

    def recv(self, round_number: int, tag: str, sender: str, *, timeout: float | None = None) -> bytes:
        """A relayed payload; raises :class:`RoundAbortedError` if the current attempt is aborted."""
        return self.wait((self.job_id, round_number, tag, sender), timeout)

    def release(self, round_number: int, prefix: str) -> None:
        """Drop the relayed messages of ``round_number`` under tag ``prefix``: every party is done with them.

        What this party received goes from its pool and from its relay mailbox; what it sent is no
        longer re-sent after a reconnect. Call it only once the recipients of what it sent have
        them (a later message of theirs shows it): a multi-step exchange inside one round (a
        threshold key generation) then holds two steps, not all of them, in every process.
        """
        envelope = pb.Envelope(
            job_id=self.job_id,
            round=CONTROL_ROUND,
            tag=f"{RELEASE_PREFIX}{round_number}/{prefix}",
            sender=self.party_id,
            recipients=[self.party_id],
        )
        self._call(lambda timeout: self._relay_send(envelope, timeout), "releasing relayed messages")
        self.pool.discard(lambda k: k[0] == self.job_id and k[1] == round_number and str(k[2]).startswith(prefix))
        with self._sent_lock:
            for key in [k for k in self._sent if k[0] == round_number and k[1].startswith(prefix)]:
                del self._sent[key]

    def forget(self, round_number: int, tags: Sequence[str]) -> None:
        """Stop re-sending these envelopes after a reconnect (they served their purpose)."""
        with self._sent_lock:
            for key in [k for k in self._sent if k[0] == round_number and k[1] in tags]:
                del self._sent[key]

    def pending(self, round_number: int, prefix: str) -> list[tuple[str, str]]:
        """(tag, sender) of the pooled messages of ``round_number`` whose tag starts with ``prefix``."""
        keys = self.pool.keys(lambda k: k[0] == self.job_id and k[1] == round_number and str(k[2]).startswith(prefix))
        return [(key[2], key[3]) for key in keys]

    def watch_round(self, round_number: int | None, attempt: int = 0) -> None:
        """Make every wait raise :class:`RoundAbortedError` once this attempt is aborted (None: stop)."""
        self._interrupt = None if round_number is None else (self.job_id, round_number, f"abort/{attempt}", AGGREGATOR)

    def lost(self) -> frozenset[int]:
        """The cluster nodes found lost now (a snapshot, safe against the threads that change it)."""
        with self._lost_lock:
            return frozenset(self.lost_nodes)

    def excluded(self, round_number: int, attempt: int) -> list[str]:
        """Participants the aggregator excluded from this attempt as dropouts (secagg recovery); a look, no wait.

        The aggregator sends the exclusion before any slice it lets complete, and deliveries arrive
        in order: once a combined slice of the attempt is in, so is its exclusion, if any.
        """
        prefix = f"excluded/{attempt}/"
        keys = self.pool.keys(lambda k: k[0] == self.job_id and k[1] == round_number and str(k[2]).startswith(prefix))
        if not keys:
            return []
        newest = max(keys, key=lambda k: int(str(k[2]).rsplit("/", 1)[1]))
        return list(self.pool.get(newest, 0.0).dropped)

    def raise_if_aborted(self, timeout: float) -> None:
        """Raise :class:`RoundAbortedError` if the watched attempt's abort arrives within ``timeout``."""
        if self._interrupt is None:
            return
        try:
            self.wait(self._interrupt, timeout)  # the abort key is its own interrupt: present means raise
        except MessageTimeoutError:
            return

    def wait(self, key: tuple, timeout: float | None = None, *, pop: bool = False):
        """The pooled message under ``key``, honouring the watched round's abort; ``pop`` takes it out."""
        self._raise_fatal()
        try:
            return self.pool.get(
                key, self.message_timeout_s if timeout is None else timeout, pop=pop, interrupt=self._interrupt
            )
        except Interrupted as interrupted:
            control = interrupted.value
            raise RoundAbortedError(
                f"round {control.round} attempt {control.attempt} aborted: {control.reason}",
                list(control.dropped),
                list(control.survivors),
            ) from None

    # -- aggregation ------------------------------------------------------------------------
    def renew_push_channels(self) -> int:
        """Move pushes to fresh data-port connections, failing those in flight; returns how many.

        For a party that saw its delivery stream break and come back while a push was open: the
        push's connection went through the same broken path and may be half-open. Not on a
        cluster, where a share's failed push marks its node lost.
        """
        if len(self._nodes) > 1:
            return 0
        return sum(node.renew_data_channel() for node in self._nodes)

    def push(self, header: pb.RoundHeader, slices: Iterable[pb.Slice]) -> pb.PushReply:
        """Stream the header and ``slices`` in batches; one attempt, no retry (the caller decides).

        On a cluster the slices are split by share and every share goes to the node serving it;
        a node that is unreachable is marked lost and its share goes to the next live node.
        """
        if len(self._nodes) == 1:
            node = self._nodes[0]
            try:
                return node.push_stub.PushSlices(
                    batched(header, slices, self.bytes_sent), wait_for_ready=node.push_waits_for_ready, timeout=None
                )
            except grpc.RpcError as error:
                failure = from_rpc_error(error, f"pushing round {header.round} attempt {header.attempt}")
                if isinstance(failure, TransportUnavailableError):
                    node.refresh_data_port(timeout=2.0)
                raise failure from None
        # Routing changes only between rounds (and by losses): a node that is back serves from its admission round.
        self._readmit(header.round)
        return self._push_cluster(header, slices)

    def _push_cluster(self, header: pb.RoundHeader, slices: Iterable[pb.Slice]) -> pb.PushReply:
        nodes = len(self._nodes)
        upload = _RetainedUpload(header, nodes)
        with self._retained_lock:
            # Kept for two rounds: parties are at most one round apart, so a share a peer still
            # waits for belongs to this round or the one before.
            self._retained[header.round] = upload
            for old in [r for r in self._retained if r < header.round - 1]:
                del self._retained[old]
        # One stream per share, all at once: the nodes aggregate in parallel. Each opens with the
        # header now, as a single aggregator's does, and its slices follow as the mode releases
        # them: every node knows the attempt while the parties agree (a lattice party's key
        # shares, paillier's range), so a party that died before sending anything is dropped as
        # soon as its new process says so, instead of its peers waiting out the message timeout.
        with ThreadPoolExecutor(max_workers=nodes, thread_name_prefix="confide-push") as pool:
            pushes = [pool.submit(self._push_share, upload, share) for share in range(nodes)]
            try:
                for item in slices:
                    upload.add(node_for(self.job_id, item.index, nodes), item)
            finally:
                upload.close()
            replies = [push.result() for push in pushes]
        return pb.PushReply(
            accepted=sum(r.accepted for r in replies),
            duplicates=sum(r.duplicates for r in replies),
            round_complete=all(r.round_complete for r in replies),
        )

    def _push_share(self, upload: _RetainedUpload, share: int) -> pb.PushReply:
        """Push one share to the node serving it; a node that refuses is lost and the next live one gets it."""
        nodes = len(self._nodes)
        header = upload.header
        while True:
            with self._lost_lock:
                node = serving_node(share, nodes, self.lost_nodes)
            share_header = pb.RoundHeader()
            share_header.CopyFrom(header)
            share_header.cluster_nodes = nodes
            share_header.share = share
            with upload.lock:
                upload.served[share] = node
                upload.pushing[share] += 1
            try:
                return self._nodes[node].push_stub.PushSlices(
                    batched(share_header, upload.stream(share), self.bytes_sent),
                    wait_for_ready=False,
                    timeout=None,
                )
            except grpc.RpcError as error:
                failure = from_rpc_error(error, f"pushing share {share} of round {header.round} to node {node}")
                if not isinstance(failure, TransportUnavailableError):
                    raise failure from None
                self.mark_lost(node, str(failure))
                self._raise_fatal()
            finally:
                with upload.lock:
                    upload.pushing[share] -= 1

    def _served_by(self, round_number: int, attempt: int, share: int) -> int:
        """The node holding a share of an attempt this party pushed (routing may have changed since)."""
        with self._retained_lock:
            upload = self._retained.get(round_number)
        if upload is not None and upload.header.attempt == attempt:
            with upload.lock:
                node = upload.served.get(share)
            if node is not None and node not in self.lost_nodes:
                return node
        with self._lost_lock:
            return serving_node(share, len(self._nodes), self.lost_nodes)

    def slice_node(self, round_number: int, attempt: int, index: int) -> int:
        """The node that served combined slice ``index`` of an attempt this party pushed."""
        nodes = len(self._nodes)
        if nodes == 1:
            return 0
        return self._served_by(round_number, attempt, node_for(self.job_id, index, nodes))

    def node_name(self, node: int) -> str:
        """How reports name aggregator node ``node``: its number in the cluster and its address."""
        target = self._nodes[node].target
        return f"aggregator node {node} ({target})" if len(self._nodes) > 1 else f"the aggregator ({target})"

    def fetch(self, round_number: int, attempt: int, indices: list[int]) -> list[pb.Slice]:
        """Combined slices of a completed attempt, from the store of the node serving each share."""
        nodes = len(self._nodes)
        by_share: dict[int, list[int]] = defaultdict(list)
        if nodes == 1:
            by_share[0] = list(indices)  # empty: every slice
        for index in indices if nodes > 1 else []:
            by_share[node_for(self.job_id, index, nodes)].append(index)
        out: list[pb.Slice] = []
        for share, wanted in sorted(by_share.items()):
            node = self._nodes[self._served_by(round_number, attempt, share) if nodes > 1 else 0]
            request = pb.FetchRequest(
                job_id=self.job_id, round=round_number, attempt=attempt, indices=wanted, share=share
            )

            def call(timeout, node=node, request=request):
                return [
                    item.slice for item in node.aggregation.FetchResult(request, timeout=timeout, wait_for_ready=True)
                ]

            out.extend(self._call(call, f"fetching round {round_number} attempt {attempt}"))
        return out

    def _call(self, function: Callable[[float], object], action: str):
        deadline = time.monotonic() + self.reconnect_timeout_s
        while True:
            try:
                return function(max(1.0, deadline - time.monotonic()))
            except grpc.RpcError as error:
                failure = from_rpc_error(error, action)
                if isinstance(failure, TransportUnavailableError) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise failure from None
