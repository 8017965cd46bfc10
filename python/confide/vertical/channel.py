"""Typed, chunked party-to-party messages for the vertical protocols.

A :class:`Channel` sends a mapping (:mod:`confide.vertical.wire`) under a tag to one or more
parties and receives one by ``(sender, tag)``. Large messages (100,000 ciphertexts are 51 MB)
travel as parts of at most ``chunk_bytes`` so no single gRPC message nears its limit and the
relay can interleave other traffic.

- :class:`RelayChannel` runs over the runtime's Relay service (gRPC + mutual TLS through the
  aggregator process, which only routes; docs/runtime.md). ``round`` scopes the relay's
  retention: a protocol advances it once per tree or epoch, so the aggregator's mailbox keeps
  only the current and the previous step.
- :class:`LocalChannel` is the same contract in memory, for unit tests and the in-process
  reference runs. It records a transcript of every message (sender, recipients, tag, bytes),
  which the privacy tests inspect.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import defaultdict
from collections.abc import Sequence

from confide.errors import ProtocolError
from confide.transport.pool import MessagePool
from confide.vertical import wire

__all__ = ["Channel", "LocalChannel", "RelayChannel", "run_parties"]

DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT_S = 600.0


class Channel:
    """Common logic: chunking, byte counts, per-tag accounting."""

    party: str
    round: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.bytes_by_tag: dict[str, int] = defaultdict(int)

    # -- transport hooks -------------------------------------------------------------------
    def _send_raw(self, recipients: list[str], key: str, payload: bytes) -> None:
        raise NotImplementedError

    def _recv_raw(self, sender: str, key: str, timeout: float) -> bytes:
        raise NotImplementedError

    # -- API ------------------------------------------------------------------------------
    def send(self, recipients: str | Sequence[str], tag: str, message: dict) -> int:
        """Send ``message`` under ``tag``; returns the bytes written (once, not per recipient)."""
        recipients = [recipients] if isinstance(recipients, str) else list(recipients)
        if not recipients:
            raise ValueError("recipients: at least one party is required")
        if self.party in recipients:
            raise ValueError(f"recipients: {self.party} cannot send to itself")
        payload = wire.encode(message)
        parts = max(1, -(-len(payload) // self.chunk_bytes))
        for index in range(parts):
            chunk = payload[index * self.chunk_bytes : (index + 1) * self.chunk_bytes]
            if index == 0:
                chunk = struct.pack(">I", parts) + chunk
            self._send_raw(recipients, f"{tag}#{index}", chunk)
        self.bytes_sent += len(payload)
        self.messages_sent += 1
        self.bytes_by_tag[tag.split("/")[0]] += len(payload)
        return len(payload)

    def recv(self, sender: str, tag: str, timeout: float | None = None) -> dict:
        """The message ``sender`` sent under ``tag`` (waits up to ``timeout`` seconds)."""
        timeout = self.timeout_s if timeout is None else timeout
        first = self._recv_raw(sender, f"{tag}#0", timeout)
        if len(first) < 4:
            raise ProtocolError(f"message {tag!r} from {sender}: truncated first part")
        (parts,) = struct.unpack(">I", first[:4])
        if not 1 <= parts <= 1 << 20:
            raise ProtocolError(f"message {tag!r} from {sender}: {parts} parts is out of range 1..{1 << 20}")
        chunks = [first[4:]] + [self._recv_raw(sender, f"{tag}#{i}", timeout) for i in range(1, parts)]
        payload = b"".join(chunks)
        self.bytes_received += len(payload)
        return wire.decode(payload)


class RelayChannel(Channel):
    """A channel over the runtime's Relay (an :class:`~confide.transport.client.AggregatorClient`)."""

    def __init__(self, client, *, timeout_s: float = DEFAULT_TIMEOUT_S, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        super().__init__()
        self.client = client
        self.party = client.party_id
        self.timeout_s = timeout_s
        self.chunk_bytes = chunk_bytes

    def _send_raw(self, recipients: list[str], key: str, payload: bytes) -> None:
        self.client.send(self.round, key, payload, recipients)

    def _recv_raw(self, sender: str, key: str, timeout: float) -> bytes:
        key_tuple = (self.client.job_id, self.round, key, sender)
        data = self.client.wait(key_tuple, timeout)
        self.client.pool.discard(lambda k, target=key_tuple: k == target)
        return data


def run_parties(jobs: dict, timeout: float | None = None) -> dict:
    """Run one callable per party, each in its own thread; returns their results by party.

    The first failure is re-raised as soon as it happens (peers blocked on the failed party are
    daemon threads, left to their channel timeout). ``timeout``: give up after this many seconds.
    """
    results, errors = {}, {}

    def run(name, job):
        try:
            results[name] = job()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            errors[name] = error

    threads = [threading.Thread(target=run, args=item, name=f"confide-{item[0]}", daemon=True) for item in jobs.items()]
    for thread in threads:
        thread.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    while any(t.is_alive() for t in threads) and not errors:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"parties {[t.name for t in threads if t.is_alive()]} did not finish in {timeout:g} s")
        time.sleep(0.005)
    if errors:
        raise next(iter(errors.values()))
    return results


class _Hub:
    def __init__(self) -> None:
        self.pools: dict[str, MessagePool] = {}
        self.transcript: list[tuple[str, tuple[str, ...], str, bytes]] = []
        self.lock = threading.Lock()


class LocalChannel(Channel):
    """An in-memory channel; :meth:`group` makes one per party, all sharing a transcript."""

    def __init__(
        self, party: str, hub: _Hub, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, timeout_s: float = 60.0
    ) -> None:
        super().__init__()
        self.party = party
        self._hub = hub
        self.chunk_bytes = chunk_bytes
        self.timeout_s = timeout_s

    @classmethod
    def group(cls, parties: Sequence[str], **options) -> dict[str, LocalChannel]:
        """One connected channel per party."""
        hub = _Hub()
        for party in parties:
            hub.pools[party] = MessagePool()
        return {party: cls(party, hub, **options) for party in parties}

    @property
    def transcript(self) -> list[tuple[str, tuple[str, ...], str, bytes]]:
        """Every part sent by anyone: (sender, recipients, tag, payload)."""
        with self._hub.lock:
            return list(self._hub.transcript)

    def received_by(self, party: str) -> list[tuple[str, str, dict]]:
        """Every whole message ``party`` was sent: (sender, tag, decoded message)."""
        parts: dict[tuple[str, str], dict[int, bytes]] = defaultdict(dict)
        for sender, recipients, key, payload in self.transcript:
            if party in recipients:
                tag, index = key.rsplit("#", 1)
                parts[(sender, tag)][int(index)] = payload
        out = []
        for (sender, tag), chunks in parts.items():
            data = b"".join(chunks[i] for i in sorted(chunks))
            out.append((sender, tag, wire.decode(data[4:])))
        return out

    def _send_raw(self, recipients: list[str], key: str, payload: bytes) -> None:
        with self._hub.lock:
            self._hub.transcript.append((self.party, tuple(recipients), key, payload))
        for recipient in recipients:
            pool = self._hub.pools.get(recipient)
            if pool is None:
                raise ProtocolError(f"recipients: no party {recipient!r} in this group")
            if not pool.put((self.round, key, self.party), payload):
                raise ProtocolError(f"message {key!r} sent twice to {recipient}")

    def _recv_raw(self, sender: str, key: str, timeout: float) -> bytes:
        return self._hub.pools[self.party].get((self.round, key, sender), timeout, pop=True)
