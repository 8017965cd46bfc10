"""A party's link to the aggregator for one round: the upload stream and the peers' messages.

:class:`RoundUpload` opens the round's stream with its header, sends the protected slices as they
are produced and keeps them for a re-upload after a reconnect; :class:`PartyExchange` carries the
protection's messages to the peers through the aggregator's relay.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from confide.errors import (
    MessageTimeoutError,
    RoundClosedError,
    TransportUnavailableError,
)
from confide.hooks import PartyHooks
from confide.spec import TransportSpec
from confide.transport.client import AggregatorClient
from confide.transport.slicing import Paced, pipelined
from confide.v1 import runtime_pb2 as pb

__all__ = ["PartyExchange", "RoundUpload", "encode_workers"]

log = logging.getLogger("confide.party")
#: Bytes of produced slices an upload keeps for a re-upload after a reconnect; slices past them are
#: produced again (a model's upload never holds a second copy of the model).
RETAIN_BYTES = 8 * 1024 * 1024


class RoundUpload:
    """One attempt's upload: header first, slices once the scale is agreed; retried on reconnect."""

    def __init__(
        self,
        client: AggregatorClient,
        header: pb.RoundHeader,
        produce,
        count: int,
        transport: TransportSpec,
        hooks: PartyHooks | None = None,
        *,
        retain_all: bool = False,
    ) -> None:
        """An upload of ``count`` slices from ``produce(index)`` under ``header``.

        ``retain_all``: keep every slice for a re-upload, for a mode whose slices must not be
        produced twice (``threshold`` decrypts against the very ciphertexts it sent).
        """
        self._client = client
        self._hooks = hooks or PartyHooks()  # the party process's observers (confide.hooks)
        self._header = header
        self._produce = produce
        self._count = count
        self._transport = transport
        #: The first slices produced, ``_cache[i].index == i``, up to :data:`RETAIN_BYTES` (all of them
        #: with ``retain_all``): a retried stream sends these again and produces the rest anew.
        self._cache: list[pb.Slice] = []
        self._cache_bytes = 0
        self._retain_bytes = None if retain_all else RETAIN_BYTES
        #: Which push stream owns ``_cache`` (the newest); guarded by ``_lock``.
        self._generation = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.reply: pb.PushReply | None = None
        self.seconds = 0.0

    def start(self, key: bytes = b"", *, renew: bool = False) -> None:
        """Begin (or begin again) uploading in a background thread; ``key`` goes into the header.

        If the thread is still pushing, it goes on (its next stream carries ``key``); with
        ``renew`` (the link to the aggregator broke and came back) its stream is moved to a fresh
        connection first, since the one it is on may be half-open and would never fail by itself.
        """
        if key and not self._header.encryption_key:
            header = pb.RoundHeader()
            header.CopyFrom(self._header)
            header.encryption_key = key
            self._header = header
        if self._thread is not None and self._thread.is_alive():
            if renew and self._client.renew_push_channels():
                log.info("upload still open: moving it to a fresh data-port connection")
            return
        self.reply = None
        self._thread = threading.Thread(target=self._run, name="confide-upload", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """The scale is agreed: slices may flow."""
        self._ready.set()

    def cancel(self) -> None:
        """Stop uploading (the attempt was aborted)."""
        self._cancelled.set()
        self._ready.set()

    def join(self) -> None:
        """Wait for the upload thread."""
        if self._thread is not None:
            self._thread.join()

    def _requests(self, generation: int) -> Paced[pb.Slice]:
        """The slices of push stream ``generation``, telling the sender when the next is not ready yet."""
        pipeline: list[Paced[pb.Slice]] = []
        return Paced(self._slices(generation, pipeline), lambda: not pipeline or pipeline[0].ready())

    def _slices(self, generation: int, pipeline: list):
        # A stream that failed while this generator waited for the scale leaves it suspended in
        # gRPC's request thread, which resumes it once on release and drops what it yields. Such
        # a superseded generator must stop there: were it to produce and cache slices beside the
        # newest stream's, the cache would hold duplicates, the next retry would start past slices
        # never sent, and the aggregator would wait for them ("away") while this party's upload
        # had ended without error.
        self._hooks.round_opened(self._header.round)
        self._ready.wait()
        if self._cancelled.is_set():
            return
        with self._lock:
            if generation != self._generation:
                return
            cached = list(self._cache)
        self._hooks.round_released(self._header.round)
        yield from cached
        start = len(cached)
        transport = self._transport
        paced = pipelined(
            lambda i: self._produce(start + i),
            self._count - start,
            depth=transport.pipeline_depth,
            enabled=transport.pipeline,
            workers=encode_workers(transport.pipeline),
        )
        pipeline.append(paced)
        done = 0
        try:
            for item in paced:
                with self._lock:
                    if generation != self._generation:
                        return
                    if len(self._cache) == start + done and (
                        self._retain_bytes is None or self._cache_bytes < self._retain_bytes
                    ):
                        self._cache.append(item)
                        self._cache_bytes += len(item.payload)
                done += 1
                yield item
        finally:
            paced.close()  # a superseded or abandoned stream stops its producers now

    def _run(self) -> None:
        deadline = time.monotonic() + self._transport.reconnect_timeout_s
        while not self._cancelled.is_set():
            started = time.perf_counter()
            with self._lock:
                self._generation += 1
                generation = self._generation
            try:
                self.reply = self._client.push(self._header, self._requests(generation))
                self.seconds += time.perf_counter() - started
                return
            except TransportUnavailableError as error:
                if time.monotonic() > deadline:
                    self.error = error
                    return
                time.sleep(0.3)
            except BaseException as error:  # noqa: BLE001 - handed to the round's main thread
                self.error = error
                return


class PartyExchange:
    """:class:`confide.protect.Exchange` over the aggregator client, aware of the open attempt.

    Waits run in one-second steps: between steps a failed upload surfaces, and after a
    reconnect (the aggregator may have restarted and lost the attempt's partial sums) the
    upload runs again from its cache.
    """

    def __init__(self, client: AggregatorClient) -> None:
        self.client = client
        #: Public key material for headers after a reconnect (a restarted aggregator may lack it).
        self.header_key = b""
        self.key_sent_at: int | None = None
        self.job_id = client.job_id
        self.party_id = client.party_id
        self.identity = client.identity
        self.upload: RoundUpload | None = None
        #: The process's hooks (confide.hooks): a lying party's messages change here, nobody else's.
        self.hooks: PartyHooks = PartyHooks()
        self._reconnects = 0
        self._lost: frozenset[int] = frozenset()
        self.wait_seconds = 0.0

    def send(self, round_number: int, tag: str, payload: bytes, recipients) -> None:
        """Relay a payload."""
        self.client.send(round_number, tag, self.hooks.message_sent(round_number, tag, payload), recipients)

    def recv(self, round_number: int, tag: str, sender: str, *, timeout: float | None = None) -> bytes:
        """Wait for a relayed payload."""
        return self.wait((self.job_id, round_number, tag, sender), timeout)

    def release(self, round_number: int, prefix: str) -> None:
        """Free relayed messages every party is done with (here, in the relay, and in the re-send cache)."""
        self.client.release(round_number, prefix)

    def discard_received(self, round_number: int, prefix: str) -> None:
        """Drop the pooled messages of rounds 1..``round_number`` under ``prefix`` (the relay retires its own)."""
        self.client.pool.discard(
            lambda k: k[0] == self.job_id and 1 <= k[1] <= round_number and str(k[2]).startswith(prefix)
        )

    def wait(self, key: tuple, timeout: float | None = None, *, pop: bool = False):
        """Wait for a pooled message, re-uploading after a reconnect; ``pop`` takes it out of the pool."""
        timeout = self.client.message_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        started = time.perf_counter()
        try:
            while True:
                upload = self.upload
                if upload is not None and upload.error is not None:
                    self._upload_failed(upload, key)
                if self.client.reconnects != self._reconnects:
                    self._reconnects = self.client.reconnects
                    if upload is not None:
                        log.info("reconnected to the aggregator: uploading the open attempt again")
                        upload.start(self.header_key, renew=True)
                lost = self.client.lost()
                if lost != self._lost:
                    # A cluster node was lost: its share goes to the next live node from our retained copy.
                    # (A node leaving the set is a re-admission, effective from a later round: nothing to re-route.)
                    newly, self._lost = lost - self._lost, lost
                    if upload is not None and newly:
                        log.info("aggregator node(s) %s lost: re-routing the open attempt", sorted(lost))
                        upload.start(self.header_key)
                self.client.raise_fatal()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MessageTimeoutError(f"no message {key!r} within {timeout:g} s")
                try:
                    return self.client.wait(key, min(1.0, remaining), pop=pop)
                except MessageTimeoutError:
                    continue
        finally:
            self.wait_seconds += time.perf_counter() - started

    def _upload_failed(self, upload: RoundUpload, key: tuple) -> None:
        if isinstance(upload.error, RoundClosedError):
            # The attempt was aborted: the abort notice says who dropped; give it a moment to arrive.
            self.client.raise_if_aborted(5.0)
        raise upload.error


def encode_workers(pipeline: bool) -> int:
    """Slices protected at once: one per core with the pipeline, one without."""
    return max(1, os.cpu_count() or 1) if pipeline else 1
