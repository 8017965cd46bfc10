"""Per-party mailboxes: what the aggregator must deliver, kept until it can no longer matter.

Every delivery (a combined slice, a relayed envelope, a round abort) is appended to the
recipient's mailbox and pushed to its live Subscribe streams. A party that (re)subscribes gets
the whole retained mailbox replayed first; its message pool ignores what it already has. So a
broken stream, a party reconnecting or the aggregator restarting never loses a message that
still matters. Retention: the current and the previous round of each job, under a byte cap;
membership messages (``CONTROL_ROUND``: a restarted party asking to rejoin) until the job ends.
A relayed envelope is kept once: a party re-sending the same bytes under the same tag (after its
stream reconnected) adds nothing. A recipient may release what it is done with before its round
retires (the many steps of a threshold key generation all run in the set-up round).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from confide.errors import ResourceLimitError
from confide.transport.client import CONTROL_ROUND
from confide.v1 import runtime_pb2 as pb

__all__ = ["Mailboxes"]

DEFAULT_CAP_BYTES = 2 * 1024**3


class Mailboxes:
    """Mailboxes keyed by (job, party)."""

    def __init__(self, cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self._boxes: dict[tuple[str, str], list[tuple[int, pb.Delivery, int]]] = {}
        #: The envelopes each mailbox holds by (round, tag, sender): a re-sent one is not kept twice.
        self._envelopes: dict[tuple[str, str], dict[tuple[int, str, str], pb.Delivery]] = {}
        self._streams: dict[tuple[str, str], list[queue.Queue]] = {}
        self._bytes = 0
        self._cap = cap_bytes
        self._lock = threading.Lock()

    def deliver(self, job_id: str, party: str, round_number: int, delivery: pb.Delivery) -> None:
        """Retain ``delivery`` for ``party`` and hand it to its live streams."""
        size = delivery.ByteSize()
        box = (job_id, party)
        with self._lock:
            envelope = _envelope_key(delivery)
            held = self._envelopes.get(box, {}).get(envelope) if envelope is not None else None
            if held is not None and held.envelope.payload == delivery.envelope.payload:
                return  # a re-send: the mailbox holds it, and a resubscribing stream replays it
            if self._bytes + size > self._cap:
                raise ResourceLimitError(
                    f"relay mailboxes hold {self._bytes} bytes; {size} more would pass the cap of {self._cap} bytes"
                )
            self._boxes.setdefault(box, []).append((round_number, delivery, size))
            if envelope is not None:
                self._envelopes.setdefault(box, {})[envelope] = delivery
            self._bytes += size
            for stream in self._streams.get(box, []):
                stream.put(delivery)

    def subscribe(self, job_id: str, party: str, is_active) -> Iterator[pb.Delivery]:
        """Replay the retained mailbox, then yield new deliveries while ``is_active()``."""
        stream: queue.Queue = queue.Queue()
        with self._lock:
            retained = [delivery for _, delivery, _ in self._boxes.get((job_id, party), [])]
            self._streams.setdefault((job_id, party), []).append(stream)
        try:
            yield from retained
            while is_active():
                try:
                    yield stream.get(timeout=0.5)
                except queue.Empty:
                    continue
        finally:
            with self._lock:
                self._streams[(job_id, party)].remove(stream)

    def retire(self, job_id: str, before_round: int) -> None:
        """Forget deliveries of ``job_id`` for rounds older than ``before_round``."""
        with self._lock:
            for key in [key for key in self._boxes if key[0] == job_id]:
                self._keep(key, lambda entry: entry[0] >= before_round or entry[0] == CONTROL_ROUND)

    def release(self, job_id: str, party: str, round_number: int, prefix: str) -> int:
        """Forget the envelopes of ``round_number`` under tag ``prefix`` in ``party``'s mailbox; returns how many.

        Only the recipient asks for this: it has filed them and will never need them replayed.
        """

        def done(entry) -> bool:
            envelope = _envelope_key(entry[1])
            return envelope is not None and envelope[0] == round_number and envelope[1].startswith(prefix)

        with self._lock:
            if (job_id, party) not in self._boxes:
                return 0
            return self._keep((job_id, party), lambda entry: not done(entry))

    def _keep(self, key: tuple[str, str], keep) -> int:
        """Keep the entries of one mailbox that ``keep`` accepts (under the lock); returns how many went."""
        box = self._boxes[key]
        kept = [entry for entry in box if keep(entry)]
        if len(kept) == len(box):  # nothing went: the envelope index stands as it is
            return 0
        self._bytes -= sum(entry[2] for entry in box) - sum(entry[2] for entry in kept)
        self._boxes[key] = kept
        self._envelopes[key] = {
            envelope: entry[1] for entry in kept if (envelope := _envelope_key(entry[1])) is not None
        }
        return len(box) - len(kept)

    @property
    def retained_bytes(self) -> int:
        """Bytes currently retained across all mailboxes."""
        with self._lock:
            return self._bytes


def _envelope_key(delivery: pb.Delivery) -> tuple[int, str, str] | None:
    """(round, tag, sender) of a relayed envelope; None for the aggregator's own deliveries."""
    if delivery.WhichOneof("body") != "envelope":
        return None
    envelope = delivery.envelope
    return envelope.round, envelope.tag, envelope.sender
