"""How the parties of a threshold key talk (a :class:`Channel`; in-process for tests), and which (t, m) can run."""

from __future__ import annotations

import queue
import threading
from typing import Protocol

from confide.errors import InvalidParameterError, ProtocolError


class CheatingPartyError(ProtocolError):
    """A party's message failed its check (share vs commitment, or partial decryption proof)."""

    def __init__(self, party: int | str, detail: str) -> None:
        super().__init__(f"party {party}: {detail}")
        self.party = party
        self.detail = detail

    def __reduce__(self):
        return (type(self), (self.party, self.detail))


class Channel(Protocol):
    """How one party of the key generation reaches the others (1-based indices)."""

    index: int
    parties: int

    def send(self, to: int, tag: str, payload: bytes) -> None:
        """A payload only party ``to`` can read."""

    def broadcast(self, tag: str, payload: bytes) -> None:
        """The same payload to every other party."""

    def recv(self, sender: int, tag: str) -> bytes:
        """What ``sender`` sent (or broadcast) under ``tag``."""

    def release(self, prefix: str) -> None:
        """Every party has what was sent under tags starting ``prefix``: free this party's copies."""


class LocalChannels:
    """Channels between m parties in one process (threads): simulations, tests and benchmarks.

    ``received[j]`` lists every payload party j received, in order: party j's view.
    """

    def __init__(self, parties: int, timeout: float = 3600.0) -> None:
        self.parties = parties
        self.timeout = timeout
        self.received: dict[int, list[bytes]] = {i: [] for i in range(1, parties + 1)}
        self._boxes: dict = {}
        self._lock = threading.Lock()

    def _box(self, key) -> queue.Queue:
        with self._lock:
            return self._boxes.setdefault(key, queue.Queue())

    def channel(self, index: int) -> _LocalChannel:
        """Party ``index``'s end (1-based)."""
        return _LocalChannel(self, index)


class _LocalChannel:
    def __init__(self, hub: LocalChannels, index: int) -> None:
        self.hub, self.index, self.parties = hub, index, hub.parties

    def send(self, to: int, tag: str, payload: bytes) -> None:
        self.hub._box((to, self.index, tag)).put(payload)

    def broadcast(self, tag: str, payload: bytes) -> None:
        for to in range(1, self.parties + 1):
            if to != self.index:
                self.send(to, tag, payload)

    def recv(self, sender: int, tag: str) -> bytes:
        try:
            payload = self.hub._box((self.index, sender, tag)).get(timeout=self.hub.timeout)
        except queue.Empty:
            raise ProtocolError(f"party {sender} sent nothing under {tag!r} within {self.hub.timeout:g} s") from None
        self.hub.received[self.index].append(payload)
        return payload

    def release(self, prefix: str) -> None:
        with self.hub._lock:
            for key in [k for k in self.hub._boxes if k[0] == self.index and k[2].startswith(prefix)]:
                del self.hub._boxes[key]


def check_threshold(parties: int, threshold: int, *, dealer: bool = False) -> None:
    """Clear errors for a (t, m) the protocol cannot run."""
    if not isinstance(parties, int) or parties < 2:
        raise InvalidParameterError(f"parties must be at least 2, got {parties}")
    if not isinstance(threshold, int) or threshold < 2:
        raise InvalidParameterError(
            f"threshold must be at least 2 (with 1 any single party could decrypt alone), got {threshold}"
        )
    if threshold > parties:
        raise InvalidParameterError(f"threshold ({threshold}) must not exceed the number of parties ({parties})")
    if not dealer and threshold > (parties + 1) // 2:
        raise InvalidParameterError(
            f"threshold ({threshold}) must be at most (parties + 1) // 2 = {(parties + 1) // 2} for key generation "
            f"without a dealer: the modulus is computed by BGW, which needs an honest majority, so with "
            f"{parties} parties it hides p and q from at most {(parties - 1) // 2} colluders"
        )
