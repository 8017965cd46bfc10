"""The message pool: messages keyed by (job, round, tag, sender), taken in any order.

Seed 003's communication layer decouples computation from message order: a receiver asks for
the message it needs next (``get``) and blocks only until *that* message is present, however
many others arrived before it; a sender never waits for the receiver (``put`` returns at once).
Keys are tuples ``(job_id, round, tag, sender)``; putting a key twice keeps the first value
(retransmissions after a reconnect are idempotent).

A wait can be interrupted: ``get(..., interrupt=key)`` raises :class:`Interrupted` carrying the
interrupting message as soon as that key is present (the aggregator aborting a round wakes
every wait of that round).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterable
from typing import Any

from confide.errors import ConfideError, MessageTimeoutError

__all__ = ["Interrupted", "MessagePool", "PoolKey"]

PoolKey = tuple[str, int, str, str]


class Interrupted(ConfideError):
    """A wait was interrupted by a control message (``value`` holds it)."""

    def __init__(self, key: Hashable, value: Any) -> None:
        super().__init__(f"interrupted by {key!r}")
        self.key = key
        self.value = value


class MessagePool:
    """Thread-safe store of messages keyed by ``(job, round, tag, sender)``."""

    def __init__(self) -> None:
        self._items: dict[Hashable, Any] = {}
        self._consumed: set[Hashable] = set()
        self._changed = threading.Condition()

    def put(self, key: Hashable, value: Any) -> bool:
        """Store ``value`` under ``key``; False (and nothing changes) if the key was seen before."""
        with self._changed:
            if key in self._items or key in self._consumed:
                return False
            self._items[key] = value
            self._changed.notify_all()
            return True

    def __contains__(self, key: Hashable) -> bool:
        with self._changed:
            return key in self._items

    def get(
        self,
        key: Hashable,
        timeout: float,
        *,
        pop: bool = False,
        interrupt: Hashable | Iterable[Hashable] | None = None,
    ) -> Any:
        """The message under ``key``, waiting up to ``timeout`` seconds.

        ``pop`` removes it (a later duplicate is still ignored). ``interrupt`` names one key or
        several whose presence raises :class:`Interrupted` instead of waiting on.
        """
        interrupts = _as_keys(interrupt)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for other in interrupts:
                    if other in self._items:
                        raise Interrupted(other, self._items[other])
                if key in self._items:
                    if pop:
                        self._consumed.add(key)
                        return self._items.pop(key)
                    return self._items[key]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MessageTimeoutError(f"no message {key!r} within {timeout:g} s")
                self._changed.wait(remaining)

    def keys(self, predicate) -> list[Hashable]:
        """Keys of the stored messages that satisfy ``predicate`` (a look, nothing is consumed)."""
        with self._changed:
            return [key for key in self._items if predicate(key)]

    def discard(self, predicate) -> int:
        """Drop every stored message whose key satisfies ``predicate``; returns how many."""
        with self._changed:
            doomed = [key for key in self._items if predicate(key)]
            for key in doomed:
                del self._items[key]
            self._consumed = {key for key in self._consumed if not predicate(key)}
            return len(doomed)

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)


def _as_keys(interrupt: Hashable | Iterable[Hashable] | None) -> list[Hashable]:
    if interrupt is None:
        return []
    if isinstance(interrupt, (list, set, frozenset)):
        return list(interrupt)
    return [interrupt]  # one key (a tuple key, a string...)
