"""Per-party mailboxes: what the aggregator must deliver, kept until its recipient has it.

Every delivery (a combined slice, a relayed envelope, a round abort) is appended to each of its
recipients' mailboxes under the next sequence number of that mailbox, and streamed to the
recipient's live Subscribe streams. The recipient acknowledges what it has filed (an
``ack/<seq>`` envelope to itself, or ``acked`` when it subscribes again): only then is a delivery
dropped. So a broken stream, a party reconnecting or a slow reader never loses a message, and
what the relay holds is what its recipients have not read yet, not whole rounds.

Memory: a delivery is serialized once and its bytes are shared by all its recipients' mailboxes
(a round's sum goes to every party). Up to ``memory_bytes`` of them are held in memory; beyond
that, new deliveries are written to files under ``spill_dir`` and read back as their streams
reach them. A slow or absent reader therefore slows its own stream, never its peers', and never
fails the job. A backstop: deliveries of rounds two behind the newest one are dropped whether
acknowledged or not (``retire``). Membership messages (``CONTROL_ROUND``: a restarted party
asking to rejoin) are kept until the job ends; setup messages (``SETUP_ROUND``: key
announcements, sample counts, the model agreement) are not retired, only acknowledged. A run
resumed at round r retires rounds below r - 1 as soon as its first slice arrives: had that
dropped the setup messages, a party still reading its mailbox then would wait for its peers'
keys that were gone. A relayed envelope is kept once: a party re-sending the same bytes under
the same tag (after its stream reconnected) adds nothing. A recipient may release what it is
done with before acknowledging (the many steps of a threshold key generation).
"""

from __future__ import annotations

import bisect
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confide.errors import ResourceLimitError
from confide.transport.client import CONTROL_ROUND
from confide.v1 import runtime_pb2 as pb

__all__ = ["SETUP_ROUND", "Mailboxes", "with_seq"]

#: The round of a job's setup messages (``confide.protect.base.SETUP_ROUND``): never retired.
SETUP_ROUND = 0

#: Deliveries held in memory (bytes, each counted once however many mailboxes hold it).
DEFAULT_MEMORY_BYTES = 512 * 1024**2
#: Deliveries a stream takes from its mailbox at a time (then it looks again).
_BATCH = 16


def with_seq(serialized: bytes, seq: int, epoch: int) -> bytes:
    """``serialized`` (a ``Delivery`` without them) with fields 5 ``seq`` and 6 ``epoch`` appended.

    Protobuf parses concatenated fields as one message, so the shared bytes are not re-encoded
    per recipient.
    """
    suffix = bytearray()
    for number, value in ((5, seq), (6, epoch)):
        suffix.append(number << 3)  # varint
        while True:
            byte = value & 0x7F
            value >>= 7
            if not value:
                suffix.append(byte)
                break
            suffix.append(byte | 0x80)
    return serialized + suffix  # one copy of the delivery per recipient, as serializing it was


class _Blob:
    """One serialized delivery, in memory or in a spill file; shared by the mailboxes that hold it."""

    __slots__ = ("data", "path", "refs", "size")

    def __init__(self, data: bytes | None, path: Path | None, size: int) -> None:
        self.data, self.path, self.size, self.refs = data, path, size, 0

    def read(self) -> bytes | None:
        """Its bytes; None where a spilled one was dropped meanwhile (acknowledged or retired)."""
        data, path = self.data, self.path
        if data is not None:
            return data
        if path is None:
            return None
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None


@dataclass(slots=True)
class _Entry:
    seq: int
    round: int
    blob: _Blob
    #: (round, tag, sender, digest of the payload) of a relayed envelope; None for the aggregator's own.
    envelope: tuple[int, str, str, bytes] | None


@dataclass(slots=True)
class _Box:
    entries: list[_Entry] = field(default_factory=list)
    next_seq: int = 1
    #: (round, tag, sender) -> the entry holding that envelope (a re-send is kept once).
    envelopes: dict[tuple[int, str, str], _Entry] = field(default_factory=dict)


class Mailboxes:
    """Mailboxes keyed by (job, party)."""

    def __init__(self, memory_bytes: int = DEFAULT_MEMORY_BYTES, spill_dir: str | os.PathLike | None = None) -> None:
        self._boxes: dict[tuple[str, str], _Box] = {}
        self._memory_bytes = memory_bytes
        self._spill_root = Path(spill_dir) if spill_dir is not None else None
        self._spill_dir: Path | None = None  # created on first spill
        self._spill_temp: tempfile.TemporaryDirectory | None = None
        self._spilled = 0
        self._bytes = 0
        self._peak = 0
        self._changed = threading.Condition()
        #: Sequence numbers are this instance's: a subscriber's acknowledgement of another is ignored.
        self.epoch = int.from_bytes(os.urandom(8), "little") or 1

    # -- delivering --------------------------------------------------------------------------
    def deliver(self, job_id: str, party: str, round_number: int, delivery: pb.Delivery) -> None:
        """Retain ``delivery`` for ``party`` and hand it to its live streams."""
        self.deliver_to(job_id, [party], round_number, delivery)

    def deliver_to(self, job_id: str, parties: Iterable[str], round_number: int, delivery: pb.Delivery) -> None:
        """Retain ``delivery`` once for all ``parties`` and hand it to their live streams."""
        data = delivery.SerializeToString()
        envelope = _envelope_key(delivery)
        digest = hashlib.blake2b(delivery.envelope.payload, digest_size=16).digest() if envelope else b""
        with self._changed:
            wanting = []
            for party in dict.fromkeys(parties):
                box = self._boxes.setdefault((job_id, party), _Box())
                held = box.envelopes.get(envelope) if envelope is not None else None
                if held is not None and held.envelope[3] == digest:
                    continue  # a re-send: the mailbox holds it until the recipient acknowledges it
                wanting.append(box)
            if not wanting:
                return
            blob = self._store(data)
            for box in wanting:
                entry = _Entry(box.next_seq, round_number, blob, (*envelope, digest) if envelope else None)
                box.next_seq += 1
                box.entries.append(entry)
                blob.refs += 1
                if envelope is not None:
                    box.envelopes[envelope] = entry
            self._changed.notify_all()

    def _store(self, data: bytes) -> _Blob:
        """A blob for ``data``: in memory while the memory budget allows, else in a spill file (under the lock)."""
        size = len(data)
        if self._bytes + size <= self._memory_bytes:
            self._bytes += size
            self._peak = max(self._peak, self._bytes)
            return _Blob(data, None, size)
        directory = self._spill_directory()
        try:
            handle, name = tempfile.mkstemp(dir=directory, prefix="delivery-")
            with os.fdopen(handle, "wb") as file:
                file.write(data)
        except OSError as error:
            raise ResourceLimitError(
                f"relay mailboxes hold {self._bytes} bytes in memory (the limit) and {self._spilled} on disk; "
                f"writing {size} more to {directory} failed: {error}"
            ) from None
        self._spilled += size
        return _Blob(None, Path(name), size)

    def _spill_directory(self) -> Path:
        if self._spill_dir is None:
            if self._spill_root is not None:
                self._spill_root.mkdir(parents=True, exist_ok=True)
                for stale in self._spill_root.glob("delivery-*"):  # left by an earlier process
                    stale.unlink(missing_ok=True)
                self._spill_dir = self._spill_root
            else:
                self._spill_temp = tempfile.TemporaryDirectory(prefix="confide-mailbox-")
                self._spill_dir = Path(self._spill_temp.name)
        return self._spill_dir

    def _drop(self, entry: _Entry) -> None:
        """One mailbox lets go of ``entry`` (under the lock); its blob goes with its last holder."""
        blob = entry.blob
        blob.refs -= 1
        if blob.refs:
            return
        if blob.data is not None:
            self._bytes -= blob.size
            blob.data = None
        else:
            self._spilled -= blob.size
            blob.path.unlink(missing_ok=True)
            blob.path = None

    # -- streaming ---------------------------------------------------------------------------
    def subscribe(
        self, job_id: str, party: str, is_active: Callable[[], bool], acked: int = 0, epoch: int = 0
    ) -> Iterator[bytes]:
        """Deliveries after ``acked`` (serialized, with ``seq`` and ``epoch``), then new ones while ``is_active()``.

        ``acked`` > 0 is the subscriber's word that it filed everything up to it: dropped first
        (if ``epoch`` is this instance's).
        A stream reads its mailbox as it goes, so what a slow reader has not taken yet stays in
        the mailbox (in memory or spilled), not in a queue of its own.
        """
        if epoch != self.epoch:
            acked = 0  # about the mailboxes of an earlier aggregator process
        if acked:
            self.ack(job_id, party, acked)
        cursor = acked
        key = (job_id, party)
        while True:
            with self._changed:
                box = self._boxes.get(key)
                batch = []
                if box is not None:
                    start = bisect.bisect_right(box.entries, cursor, key=lambda entry: entry.seq)
                    batch = box.entries[start : start + _BATCH]
                if not batch:
                    if not is_active():
                        return
                    self._changed.wait(0.5)
                    continue
            for entry in batch:
                cursor = entry.seq
                data = entry.blob.read()
                if data is not None:  # else acknowledged or retired meanwhile: nothing to send
                    yield with_seq(data, entry.seq, self.epoch)

    # -- forgetting --------------------------------------------------------------------------
    def ack(self, job_id: str, party: str, seq: int) -> int:
        """``party`` filed its deliveries up to ``seq``: drop them (membership messages stay); returns how many went."""
        with self._changed:
            if (job_id, party) not in self._boxes:
                return 0
            return self._keep((job_id, party), lambda entry: entry.seq > seq or entry.round == CONTROL_ROUND)

    def retire(self, job_id: str, before_round: int) -> None:
        """Forget deliveries of ``job_id`` for rounds older than ``before_round`` (setup and membership ones stay)."""
        with self._changed:
            for key in [key for key in self._boxes if key[0] == job_id]:
                self._keep(
                    key, lambda entry: entry.round >= before_round or entry.round in (CONTROL_ROUND, SETUP_ROUND)
                )

    def release(self, job_id: str, party: str, round_number: int, prefix: str) -> int:
        """Forget the envelopes of ``round_number`` under tag ``prefix`` in ``party``'s mailbox; returns how many.

        Only the recipient asks for this: it has filed them and will never need them replayed.
        """

        def done(entry: _Entry) -> bool:
            return (
                entry.envelope is not None
                and entry.envelope[0] == round_number
                and entry.envelope[1].startswith(prefix)
            )

        with self._changed:
            if (job_id, party) not in self._boxes:
                return 0
            return self._keep((job_id, party), lambda entry: not done(entry))

    def _keep(self, key: tuple[str, str], keep: Callable[[_Entry], bool]) -> int:
        """Keep the entries of one mailbox that ``keep`` accepts (under the lock); returns how many went."""
        box = self._boxes[key]
        kept = [entry for entry in box.entries if keep(entry)]
        if len(kept) == len(box.entries):
            return 0
        for entry in box.entries:
            if not keep(entry):
                self._drop(entry)
        gone = len(box.entries) - len(kept)
        box.entries = kept
        box.envelopes = {entry.envelope[:3]: entry for entry in kept if entry.envelope is not None}
        return gone

    # -- gauges ------------------------------------------------------------------------------
    @property
    def retained_bytes(self) -> int:
        """Bytes of deliveries held in memory (each counted once)."""
        with self._changed:
            return self._bytes

    @property
    def spilled_bytes(self) -> int:
        """Bytes of deliveries written to spill files, not yet acknowledged."""
        with self._changed:
            return self._spilled

    @property
    def peak_bytes(self) -> int:
        """The most bytes held in memory at once since this aggregator started."""
        with self._changed:
            return self._peak

    def unacknowledged(self, job_id: str, party: str) -> int:
        """Deliveries ``party``'s mailbox holds for job ``job_id`` (membership messages included)."""
        with self._changed:
            box = self._boxes.get((job_id, party))
            return len(box.entries) if box is not None else 0


def _envelope_key(delivery: pb.Delivery) -> tuple[int, str, str] | None:
    """(round, tag, sender) of a relayed envelope; None for the aggregator's own deliveries."""
    if delivery.WhichOneof("body") != "envelope":
        return None
    envelope = delivery.envelope
    return envelope.round, envelope.tag, envelope.sender
