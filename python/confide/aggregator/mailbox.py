"""Per-party mailboxes: what the aggregator must deliver, kept until it can no longer matter.

Every delivery (a combined slice, a relayed envelope, a round abort) is appended to the
recipient's mailbox and pushed to its live Subscribe streams. A party that (re)subscribes gets
the whole retained mailbox replayed first; its message pool ignores what it already has. So a
broken stream, a party reconnecting or the aggregator restarting never loses a message that
still matters. Retention: the current and the previous round of each job, under a byte cap;
membership messages (``CONTROL_ROUND``: a restarted party asking to rejoin) until the job ends.
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
        self._streams: dict[tuple[str, str], list[queue.Queue]] = {}
        self._bytes = 0
        self._cap = cap_bytes
        self._lock = threading.Lock()

    def deliver(self, job_id: str, party: str, round_number: int, delivery: pb.Delivery) -> None:
        """Retain ``delivery`` for ``party`` and hand it to its live streams."""
        size = delivery.ByteSize()
        with self._lock:
            if self._bytes + size > self._cap:
                raise ResourceLimitError(
                    f"relay mailboxes hold {self._bytes} bytes; {size} more would pass the cap of {self._cap} bytes"
                )
            self._boxes.setdefault((job_id, party), []).append((round_number, delivery, size))
            self._bytes += size
            for stream in self._streams.get((job_id, party), []):
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
            for (job, party), box in self._boxes.items():
                if job != job_id:
                    continue
                kept = [entry for entry in box if entry[0] >= before_round or entry[0] == CONTROL_ROUND]
                self._bytes -= sum(entry[2] for entry in box) - sum(entry[2] for entry in kept)
                self._boxes[(job, party)] = kept

    @property
    def retained_bytes(self) -> int:
        """Bytes currently retained across all mailboxes."""
        with self._lock:
            return self._bytes
