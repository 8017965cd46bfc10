"""The aggregator process: Aggregation and Relay services over mutual TLS around :class:`AggregatorCore`.

:class:`AggregationServicer` and :class:`RelayServicer` turn gRPC streams into calls on the core
(:mod:`confide.aggregator.core`); :class:`NativeDataPath` is the Rust data path for slices;
:func:`serve` starts the whole process (TLS, revocation gate, data path).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from confide import _native
from confide.aggregator.core import MAX_NAME, AggregatorConfig, AggregatorCore, incarnation_of
from confide.aggregator.rounds import RoundState
from confide.crypto.identity import Identity, name_from_der
from confide.errors import ConfideError, ProtocolError, RoundClosedError
from confide.transport import status, tls
from confide.transport.client import ACK_PREFIX, ADMIT_PREFIX, CONTROL_ROUND, REJOIN_PREFIX, RELEASE_PREFIX
from confide.transport.revocation import RevocationGate, RevocationList
from confide.v1 import runtime_pb2 as pb
from confide.v1 import runtime_pb2_grpc as rpc

__all__ = ["AggregationServicer", "AggregatorConfig", "AggregatorCore", "NativeDataPath", "RelayServicer", "serve"]

log = logging.getLogger("confide.aggregator")
#: Ended data-path streams remembered for completions their last batch reports late.
_ENDED_KEPT = 1024
Observer = Callable[[str, str, object], None]


class NativeDataPath:
    """The control side of the Rust data path (``_native.DataServer``, crate ``confide-aggnet``).

    The data server receives a party's ``PushSlices`` stream, parses and checks every batch
    and folds it in the data plane without the GIL. It calls this object once per stream
    (:meth:`open`, :meth:`ended`), when a batch completed slices (:meth:`folded`) or was
    refused (:meth:`refused`), and per message only while an observer is attached. The
    replies and status codes are those of :meth:`AggregationServicer.PushSlices`.
    """

    def __init__(self, core: AggregatorCore) -> None:
        self._core = core
        self._streams: dict[int, tuple[str, RoundState]] = {}
        #: Streams that ended, newest last, for completions reported after the end (:meth:`ended`).
        self._ended: dict[int, tuple[str, RoundState]] = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self.observing = core.observer is not None
        #: Streams this path opened (a measure that slices took it).
        self.streams_opened = 0

    def open(self, peer_der: bytes | None, raw: bytes) -> tuple[int, int, int] | None:
        """A stream's header: (round id, party position, token), or None if already complete."""
        if self._core.revocation_gate is not None:
            self._core.revocation_gate.check_der(peer_der)
        header = _push_message(raw).header
        party = tls.check_caller(name_from_der(peer_der), header.party_id, "header.party_id")
        self._core.observe("header", party, header)
        state = self._core.open_round(header)
        if state is None:
            self._core.redeliver((header.job_id, header.round, header.attempt, header.share), party)
            return None
        token = next(self._tokens)
        with self._lock:
            self._streams[token] = (party, state)
            self.streams_opened += 1
        return state.round_id, state.position(party), token

    def _stream(self, token: int) -> tuple[str, RoundState]:
        with self._lock:
            found = self._streams.get(token) or self._ended.get(token)
        if found is None:
            raise ProtocolError(f"data path stream {token} is unknown")
        return found

    def observe(self, token: int, raw: bytes) -> None:
        """Hand the slices of a received message to the observer."""
        party, _ = self._stream(token)
        message = _push_message(raw)
        items = unbatch(message.batch) if message.HasField("batch") else [message.slice]
        for item in items:
            self._core.observe("slice", party, item)

    def folded(self, token: int, completed: list[tuple[int, bytes]]) -> None:
        """Book and deliver the slices a batch completed."""
        _, state = self._stream(token)
        self._core._deliver(state, *state.settle(completed))

    def refused(self, token: int, kind: str, message: str, slices: int) -> int:
        """The data plane refused a batch: late copies (returned) or the error to end with."""
        _, state = self._stream(token)
        if state.status == "complete":
            return slices  # late copies of slices whose indices completed
        if kind == "closed" or state.status != "open":
            raise RoundClosedError(f"round attempt {state.key} is {state.status}")
        # Slices of the batch folded before the refused one stay folded; deliver what they completed.
        self._core._deliver(state, *state.drain())
        if kind == "invalid":
            raise ProtocolError(message)
        raise ConfideError(message)

    def ended(self, token: int) -> bool:
        """The stream ended; whether the round attempt (share) is complete."""
        with self._lock:
            party, state = self._streams.pop(token)
            # A batch the data plane is still folding may report what it completed after its stream
            # was cut (the party's connection reset): those slices must still be booked and delivered.
            self._ended[token] = (party, state)
            while len(self._ended) > _ENDED_KEPT:
                self._ended.pop(next(iter(self._ended)))
        self._core.stream_ended(party, state)
        return state.status == "complete"

    def status_of(self, error: BaseException) -> tuple[int, str]:
        """The gRPC status code (number) and message for an error raised here."""
        code, message = status.code_of(error)
        return int(code.value[0]), message

    def log_failure(self, what: str, error: BaseException) -> None:
        """A callback failed where no status can be sent (the stream is gone)."""
        log.error("data path %s failed: %s: %s", what, type(error).__name__, error)


class AggregationServicer(rpc.AggregationServicer):
    """gRPC Aggregation service."""

    def __init__(self, core: AggregatorCore, name: str) -> None:
        self._core = core
        self._name = name

    def PushSlices(self, request_iterator, context):  # noqa: N802 - gRPC method name
        """Receive one party's slices for one round attempt."""
        state: RoundState | None = None
        party = ""
        accepted = duplicates = 0
        try:
            # Messages arrive as received bytes (see add_aggregation_service): batches go to the
            # data plane as they are, so their payload is never copied in Python.
            raw = next(request_iterator, None)
            first = _push_message(raw) if raw is not None else None
            if first is None or not first.HasField("header"):
                raise ProtocolError("a PushSlices stream must start with a header")
            header = first.header
            party = tls.require_caller(context, header.party_id, "header.party_id")
            self._core.observe("header", party, header)
            state = self._core.open_round(header)
            if state is None:
                self._core.redeliver((header.job_id, header.round, header.attempt, header.share), party)
                return pb.PushReply(round_complete=True)
            for raw in request_iterator:
                try:
                    view = _native.agg_parse_batch(raw)
                except ValueError as error:
                    raise ProtocolError(str(error)) from None
                if view is not None:
                    if self._core.observer is not None:
                        for item in unbatch(_push_message(raw).batch):
                            self._core.observe("slice", party, item)
                    took, repeated = self._core.push_message(party, state, raw, view)
                    accepted += took
                    duplicates += repeated
                    continue
                message = _push_message(raw)
                body = message.WhichOneof("body")
                if body == "slice":
                    self._core.observe("slice", party, message.slice)
                    if self._core.push(party, state, message.slice):
                        accepted += 1
                    else:
                        duplicates += 1
                else:
                    raise ProtocolError("only the first message of a PushSlices stream may be a header")
            return pb.PushReply(accepted=accepted, duplicates=duplicates, round_complete=state.status == "complete")
        except (ConfideError, ValueError) as error:
            status.abort(context, error)
        finally:
            if state is not None:
                self._core.stream_ended(party, state)

    def FetchResult(self, request, context):  # noqa: N802
        """Combined slices of a completed round attempt again."""
        try:
            party = tls.caller_name(context) or ""
            key = (request.job_id, request.round, request.attempt, request.share)
            yield from self._core.fetch(key, party, list(request.indices))
        except (ConfideError, ValueError) as error:
            status.abort(context, error)

    @status.guarded
    def Health(self, request, context):  # noqa: N802
        """Name and load."""
        return self._core.health(self._name, request)


class RelayServicer(rpc.RelayServicer):
    """gRPC Relay service: routes end-to-end protected envelopes between parties."""

    def __init__(self, core: AggregatorCore) -> None:
        self._core = core

    @status.guarded
    def Send(self, request, context):  # noqa: N802
        """Deliver one envelope to its recipients' mailboxes."""
        tls.require_caller(context, request.sender, "envelope.sender")
        if not request.job_id or not request.tag:
            raise ProtocolError("envelope.job_id and envelope.tag are required")
        recipients = list(request.recipients)
        if not recipients or any(not 0 < len(r) <= MAX_NAME for r in recipients):
            raise ProtocolError(f"envelope.recipients must list 1.. names of 1..{MAX_NAME} characters")
        if request.round == CONTROL_ROUND and request.tag.startswith(ACK_PREFIX):
            return self._ack(request)
        if request.round == CONTROL_ROUND and request.tag.startswith(RELEASE_PREFIX):
            return self._release(request)
        self._core.observe("envelope", request.sender, request)
        if request.round == CONTROL_ROUND and request.tag.startswith(REJOIN_PREFIX):
            # A restarted party: the process that held its place in an open round is gone.
            self._core.party_restarted(request.job_id, request.sender, incarnation_of(request.tag))
        elif request.round == CONTROL_ROUND and request.tag.startswith(ADMIT_PREFIX):
            self._core.parties_admitted(request.job_id, recipients, incarnation_of(request.tag))
        elif request.round > 1:
            # Relay-only jobs (vertical) never push slices: retire by the envelopes' rounds too.
            self._core.mailboxes.retire(request.job_id, request.round - 1)
        delivery = pb.Delivery(job_id=request.job_id, envelope=request)
        self._core.mailboxes.deliver_to(request.job_id, recipients, request.round, delivery)
        return pb.RelayReply(delivered=len(recipients))

    def _ack(self, request: pb.Envelope) -> pb.RelayReply:
        """A party filed its mailbox's deliveries up to a sequence number (``ack/<epoch>/<seq>``): dropped."""
        if list(request.recipients) != [request.sender]:
            raise ProtocolError("an ack names its sender as its only recipient: it frees that party's own mailbox")
        epoch, _, seq = request.tag[len(ACK_PREFIX) :].partition("/")
        if not (epoch.isdigit() and seq.isdigit() and len(epoch) <= 20 and len(seq) <= 20):
            raise ProtocolError(f"envelope.tag {request.tag!r} must read ack/<epoch>/<sequence number>")
        if int(epoch) == self._core.mailboxes.epoch:  # else about an earlier process's mailboxes
            self._core.mailboxes.ack(request.job_id, request.sender, int(seq))
        return pb.RelayReply(delivered=0)

    def _release(self, request: pb.Envelope) -> pb.RelayReply:
        """A party is done with part of its own mailbox (``release/<round>/<tag prefix>``): nothing is delivered."""
        if list(request.recipients) != [request.sender]:
            raise ProtocolError("a release names its sender as its only recipient: it frees that party's own mailbox")
        round_text, _, prefix = request.tag[len(RELEASE_PREFIX) :].partition("/")
        if not round_text.isdigit() or not prefix:
            raise ProtocolError(f"envelope.tag {request.tag!r} must read release/<round>/<tag prefix>")
        self._core.mailboxes.release(request.job_id, request.sender, int(round_text), prefix)
        return pb.RelayReply(delivered=0)

    def Subscribe(self, request, context):  # noqa: N802
        """Replay the party's mailbox, then stream new deliveries."""
        try:
            tls.require_caller(context, request.party_id, "subscribe.party_id")
        except ConfideError as error:
            status.abort(context, error)
        yield from self._core.mailboxes.subscribe(
            request.job_id, request.party_id, context.is_active, acked=request.acked, epoch=request.epoch
        )


def add_aggregation_service(servicer: AggregationServicer, server: grpc.Server) -> None:
    """The Aggregation service, with PushSlices receiving each message as its bytes."""
    handlers = {
        "PushSlices": grpc.stream_unary_rpc_method_handler(
            servicer.PushSlices, request_deserializer=None, response_serializer=pb.PushReply.SerializeToString
        ),
        "FetchResult": grpc.unary_stream_rpc_method_handler(
            servicer.FetchResult,
            request_deserializer=pb.FetchRequest.FromString,
            response_serializer=pb.AggregatedSlice.SerializeToString,
        ),
        "Health": grpc.unary_unary_rpc_method_handler(
            servicer.Health,
            request_deserializer=pb.HealthRequest.FromString,
            response_serializer=pb.HealthReply.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("confide.v1.Aggregation", handlers),))


def add_relay_service(servicer: RelayServicer, server: grpc.Server) -> None:
    """The Relay service, with Subscribe sending the mailbox's serialized deliveries as they are."""
    handlers = {
        "Send": grpc.unary_unary_rpc_method_handler(
            servicer.Send,
            request_deserializer=pb.Envelope.FromString,
            response_serializer=pb.RelayReply.SerializeToString,
        ),
        "Subscribe": grpc.unary_stream_rpc_method_handler(
            servicer.Subscribe, request_deserializer=pb.SubscribeRequest.FromString, response_serializer=None
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("confide.v1.Relay", handlers),))


def _push_message(raw: bytes) -> pb.PushMessage:
    """One received ``PushMessage``; bytes protobuf cannot parse are a :class:`ProtocolError`."""
    try:
        return pb.PushMessage.FromString(raw)
    except DecodeError as error:
        raise ProtocolError(f"push message ({len(raw)} bytes) does not parse: {error}") from None


def unbatch(batch: pb.SliceBatch) -> list[pb.Slice]:
    """The slices of a batch (for observers; the data path never splits a batch in Python)."""
    out, offset = [], 0
    for index, n_valid, length in zip(batch.indices, batch.n_valid, batch.lengths, strict=False):
        out.append(pb.Slice(index=index, n_valid=n_valid, payload=batch.payload[offset : offset + length]))
        offset += length
    return out


def keep_freed_memory() -> bool:
    """Ask glibc to reuse freed buffers instead of returning them to the kernel at once.

    Every received message is a fresh ~1 MiB buffer; with glibc's defaults each one is mapped,
    faulted in page by page (zeroed by the kernel) and unmapped again, which cost the node more
    CPU than TLS and folding together (measured: ~40% of its cycles in clear_page). Raising the
    mmap and trim thresholds and the top pad keeps those buffers in the heap (measured: node
    throughput 340 → 520–800 MB/s with 200 participants). No-op where glibc is absent.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_threshold, m_arena_max = -1, -2, -3, -8
        settings = (
            (m_mmap_threshold, 32 * 1024 * 1024),
            (m_trim_threshold, 512 * 1024 * 1024),
            (m_top_pad, 256 * 1024 * 1024),
            # One arena: hundreds of stream threads otherwise each grow and trim a heap of their own.
            (m_arena_max, 1),
        )
        return all(libc.mallopt(option, value) == 1 for option, value in settings)
    except (OSError, AttributeError):
        return False


def serve(
    identity: Identity, address: str, config: AggregatorConfig, *, observer: Observer | None = None
) -> tuple[grpc.Server, int, AggregatorCore]:
    """Start the aggregator's gRPC server; returns (server, bound port, core)."""
    keep_freed_memory()
    gate = None
    if config.crl_path is not None:
        gate = RevocationGate(RevocationList(config.crl_path, identity.ca_pem), identity.name)
    core = AggregatorCore(config, observer)
    if gate is not None:
        core.revocation_gate = gate
        gate.on_cut(lambda party, _serial, message: core.drop_revoked(party, message))
        gate.start()
    server, port = tls.server(
        identity, address, max_workers=config.max_workers, interceptors=[gate] if gate is not None else []
    )
    add_aggregation_service(AggregationServicer(core, identity.name), server)
    add_relay_service(RelayServicer(core), server)
    if config.data_port is not None:
        host = address.rpartition(":")[0] or "0.0.0.0"
        core.data_path = NativeDataPath(core)
        core.data_server = _native.DataServer(
            core.dataplane,
            core.data_path,
            f"{host}:{config.data_port}",
            identity.cert_pem,
            identity.key_pem,
            identity.ca_pem,
            threads=config.data_threads,
            max_message_bytes=tls.MAX_MESSAGE_BYTES,
        )
        log.info("data path (Rust) listening on port %d", core.data_server.port)
    server.start()
    return server, port, core
