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
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import grpc

from confide.errors import MessageTimeoutError, RoundAbortedError, TransportUnavailableError
from confide.transport import tls
from confide.transport.certs import Identity
from confide.transport.pool import Interrupted, MessagePool
from confide.transport.status import from_rpc_error
from confide.v1 import runtime_pb2 as pb
from confide.v1 import runtime_pb2_grpc as rpc

__all__ = ["AGGREGATOR", "AggregatorClient"]

log = logging.getLogger("confide.transport")
AGGREGATOR = "aggregator"


class AggregatorClient:
    """One party's link to the aggregator for one job.

    Parameters
    ----------
    target : str
        "host:port" of the aggregator.
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
        self._channel = tls.channel(target, identity)
        self._aggregation = rpc.AggregationStub(self._channel)
        self._relay = rpc.RelayStub(self._channel)
        self._sent: dict[tuple[int, str, tuple[str, ...]], pb.Envelope] = {}
        self._sent_lock = threading.Lock()
        self._closed = threading.Event()
        self._subscribed = threading.Event()
        self._fatal: BaseException | None = None
        self._interrupt: tuple | None = None
        self._stream: grpc.Future | None = None
        self._thread = threading.Thread(target=self._subscribe_loop, name="confide-subscribe", daemon=True)

    # -- lifecycle --------------------------------------------------------------------------
    def connect(self, timeout: float | None = None) -> None:
        """Open the delivery stream; raises if the aggregator refuses us or stays unreachable."""
        timeout = self.reconnect_timeout_s if timeout is None else timeout
        try:
            reply = self._aggregation.Health(pb.HealthRequest(), timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as error:
            raise from_rpc_error(error, "connecting to the aggregator") from None
        log.info("connected to aggregator %s", reply.name)
        self._thread.start()
        if not self._subscribed.wait(timeout):
            raise TransportUnavailableError(f"no delivery stream from the aggregator within {timeout:g} s")
        self._raise_fatal()

    def close(self) -> None:
        """Stop the delivery stream and close the channel."""
        self._closed.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._channel.close()

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _subscribe_loop(self) -> None:
        first = True
        while not self._closed.is_set():
            try:
                stream = self._relay.Subscribe(
                    pb.SubscribeRequest(job_id=self.job_id, party_id=self.party_id), wait_for_ready=True
                )
                self._stream = stream
                self._subscribed.set()
                if not first:
                    self.reconnects += 1
                    self._replay()
                first = False
                for delivery in stream:
                    self._file(delivery)
            except grpc.RpcError as error:
                if self._closed.is_set():
                    return
                if error.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                    self._fatal = from_rpc_error(error, "subscribing to deliveries")
                    self._subscribed.set()
                    return
                log.info("delivery stream broke (%s); reconnecting", error.code())
            time.sleep(0.2)

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
            key = (self.job_id, item.round, f"abort/{item.attempt}", AGGREGATOR)
            value, round_number = item, item.round
        else:
            return
        self.bytes_received[round_number] += delivery.ByteSize()
        self.pool.put(key, value)

    # -- relay ------------------------------------------------------------------------------
    def send(self, round_number: int, tag: str, payload: bytes, recipients: Sequence[str]) -> None:
        """Relay ``payload`` to ``recipients`` (kept for re-sending after a reconnect)."""
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
            newest = max(key[0] for key in self._sent)
            for key in [k for k in self._sent if 0 < k[0] < newest - 1]:
                del self._sent[key]
        self._call(lambda timeout: self._relay.Send(envelope, timeout=timeout, wait_for_ready=True), "relaying")
        self.bytes_sent[round_number] += envelope.ByteSize()

    def _replay(self) -> None:
        with self._sent_lock:
            envelopes = list(self._sent.values())
        for envelope in envelopes:
            try:
                self._relay.Send(envelope, timeout=self.reconnect_timeout_s, wait_for_ready=True)
            except grpc.RpcError as error:
                log.warning("re-sending %s failed: %s", envelope.tag, error.code())
                return

    def recv(self, round_number: int, tag: str, sender: str, *, timeout: float | None = None) -> bytes:
        """A relayed payload; raises :class:`RoundAbortedError` if the current attempt is aborted."""
        return self.wait((self.job_id, round_number, tag, sender), timeout)

    def watch_round(self, round_number: int | None, attempt: int = 0) -> None:
        """Make every wait raise :class:`RoundAbortedError` once this attempt is aborted (None: stop)."""
        self._interrupt = None if round_number is None else (self.job_id, round_number, f"abort/{attempt}", AGGREGATOR)

    def raise_if_aborted(self, timeout: float) -> None:
        """Raise :class:`RoundAbortedError` if the watched attempt's abort arrives within ``timeout``."""
        if self._interrupt is None:
            return
        try:
            self.wait(self._interrupt, timeout)  # the abort key is its own interrupt: present means raise
        except MessageTimeoutError:
            return

    def wait(self, key: tuple, timeout: float | None = None):
        """The pooled message under ``key``, honouring the watched round's abort."""
        self._raise_fatal()
        try:
            return self.pool.get(key, self.message_timeout_s if timeout is None else timeout, interrupt=self._interrupt)
        except Interrupted as interrupted:
            control = interrupted.value
            raise RoundAbortedError(
                f"round {control.round} attempt {control.attempt} aborted: {control.reason}",
                list(control.dropped),
                list(control.survivors),
            ) from None

    # -- aggregation ------------------------------------------------------------------------
    def push(self, header: pb.RoundHeader, slices: Iterable[pb.Slice]) -> pb.PushReply:
        """Stream the header and ``slices``; one attempt, no retry (the caller decides)."""

        def requests():
            message = pb.PushMessage(header=header)
            self.bytes_sent[header.round] += message.ByteSize()
            yield message
            for item in slices:
                message = pb.PushMessage(slice=item)
                self.bytes_sent[header.round] += message.ByteSize()
                yield message

        try:
            return self._aggregation.PushSlices(requests(), wait_for_ready=True, timeout=None)
        except grpc.RpcError as error:
            raise from_rpc_error(error, f"pushing round {header.round} attempt {header.attempt}") from None

    def fetch(self, round_number: int, attempt: int, indices: list[int]) -> list[pb.Slice]:
        """Combined slices of a completed attempt, from the aggregator's store."""
        request = pb.FetchRequest(job_id=self.job_id, round=round_number, attempt=attempt, indices=indices)

        def call(timeout):
            return [item.slice for item in self._aggregation.FetchResult(request, timeout=timeout, wait_for_ready=True)]

        return self._call(call, f"fetching round {round_number} attempt {attempt}")

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
