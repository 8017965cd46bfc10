"""Test harness for the runtime unit tests: an in-memory relay standing in for the aggregator.

The protection modes talk only through an ``Exchange`` (``send``/``recv``); :class:`MemoryHub`
stands in for the aggregator's relay so the mask and key algebra runs without gRPC.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confide.errors import MessageTimeoutError
from confide.transport.certs import Identity

PARTIES = ["alpha", "bravo", "charlie", "delta"]
JOB = "job-1"
DEFAULT_RECV_TIMEOUT = 30.0


@dataclass
class Sent:
    """One payload that went through the relay."""

    sender: str
    round: int
    tag: str
    recipients: tuple[str, ...]
    payload: bytes


@dataclass
class MemoryHub:
    """The relay: payloads keyed by (round, tag, sender, recipient)."""

    boxes: dict = field(default_factory=dict)
    log: list[Sent] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def exchange(self, identity: Identity, job_id: str = JOB) -> MemoryExchange:
        return MemoryExchange(job_id=job_id, party_id=identity.name, identity=identity, hub=self)


@dataclass
class MemoryExchange:
    """An ``Exchange`` backed by a :class:`MemoryHub`."""

    job_id: str
    party_id: str
    identity: Identity
    hub: MemoryHub
    drop: Callable[[int, str], bool] | None = None

    def send(self, round_number: int, tag: str, payload: bytes, recipients: Sequence[str]) -> None:
        if self.drop is not None and self.drop(round_number, tag):
            return
        payload = bytes(payload)
        with self.hub.changed:
            self.hub.log.append(Sent(self.party_id, round_number, tag, tuple(recipients), payload))
            for recipient in recipients:
                self.hub.boxes.setdefault((round_number, tag, self.party_id, recipient), payload)
            self.hub.changed.notify_all()

    def recv(self, round_number: int, tag: str, sender: str, *, timeout: float | None = None) -> bytes:
        key = (round_number, tag, sender, self.party_id)
        limit = DEFAULT_RECV_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self.hub.changed:
            while key not in self.hub.boxes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MessageTimeoutError(f"no message {key!r} within {limit:g} s")
                self.hub.changed.wait(remaining)
            return self.hub.boxes[key]

    def release(self, round_number: int, prefix: str) -> None:
        # Gone for real: a party that released too early waits for it in vain, and its test fails.
        with self.hub.changed:
            for key in [k for k in self.hub.boxes if k[0] == round_number and k[1].startswith(prefix)]:
                if key[3] == self.party_id:
                    del self.hub.boxes[key]

    def discard_received(self, round_number: int, prefix: str) -> None:
        for number in range(1, round_number + 1):
            self.release(number, prefix)  # the hub is this party's only copy


def run_parallel(work: dict[str, Callable[[], object]], timeout: float = 60.0) -> dict[str, object]:
    """Run one callable per party in its own thread; return results, re-raise the first error."""
    results: dict[str, object] = {}
    errors: dict[str, BaseException] = {}

    def target(name: str, fn: Callable[[], object]) -> None:
        try:
            results[name] = fn()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            errors[name] = error

    threads = [
        threading.Thread(target=target, args=(name, fn), name=f"party-{name}", daemon=True) for name, fn in work.items()
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [thread.name for thread in threads if thread.is_alive()]
    if alive:
        raise AssertionError(f"parties still running after {timeout} s: {alive}")
    if errors:
        name, error = next(iter(errors.items()))
        raise AssertionError(f"party {name!r} failed: {type(error).__name__}: {error}") from error
    return results


def fast_decryption_key(bits: int = 2048):
    """A fresh Paillier key from OpenSSL's RSA primes, for tests that need a key of their own.

    ``DecryptionKey.generate`` no longer has a heavy tail (a failed pair condition now redraws
    both primes, ``crates/confide-paillier/src/keys.rs``); this is an independent source of
    primes for the tests that use it. Tests that only need some key load the fixed one
    (``tests/fixtures/keys.py``).
    """
    from cryptography.hazmat.primitives.asymmetric import rsa

    from confide.crypto import DecryptionKey

    numbers = rsa.generate_private_key(public_exponent=65537, key_size=bits).private_numbers()
    return DecryptionKey.from_primes(numbers.p, numbers.q)
