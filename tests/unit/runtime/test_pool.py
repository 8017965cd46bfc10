"""MessagePool: keyed messages taken in any order, blocking waits, duplicates, interrupts."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.errors import ConfideError, MessageTimeoutError
from confide.transport.pool import Interrupted, MessagePool


def key(tag: str, sender: str = "alpha", round_number: int = 1) -> tuple[str, int, str, str]:
    return ("job", round_number, tag, sender)


def put_later(pool: MessagePool, delay: float, k, value) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        pool.put(k, value)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@settings(max_examples=30, deadline=None)
@given(st.permutations(list(range(12))), st.permutations(list(range(12))))
def test_get_in_any_order_of_put(put_order, get_order):
    pool = MessagePool()
    for i in put_order:
        assert pool.put(key(f"t{i}"), i) is True
    assert len(pool) == 12
    for i in get_order:
        assert pool.get(key(f"t{i}"), timeout=0) == i
    # get without pop leaves everything in place
    assert len(pool) == 12
    for i in get_order:
        assert pool.get(key(f"t{i}"), timeout=0, pop=True) == i
    assert len(pool) == 0


def test_get_blocks_until_another_thread_puts():
    pool = MessagePool()
    k = key("late")
    thread = put_later(pool, 0.15, k, b"payload")
    start = time.monotonic()
    assert pool.get(k, timeout=5) == b"payload"
    waited = time.monotonic() - start
    thread.join()
    assert 0.1 <= waited < 3


def test_get_only_waits_for_its_own_key():
    pool = MessagePool()
    pool.put(key("other"), 1)
    thread = put_later(pool, 0.05, key("mine"), 2)
    assert pool.get(key("mine"), timeout=5) == 2
    thread.join()
    assert pool.get(key("other"), timeout=0) == 1


def test_timeout_raises_message_timeout_naming_the_key():
    pool = MessagePool()
    pool.put(key("present"), 1)
    k = key("absent-tag", "bravo", 7)
    start = time.monotonic()
    with pytest.raises(MessageTimeoutError) as info:
        pool.get(k, timeout=0.1)
    assert time.monotonic() - start >= 0.09
    assert "absent-tag" in str(info.value) and "bravo" in str(info.value)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ConfideError)


def test_duplicate_put_is_ignored_and_first_value_kept():
    pool = MessagePool()
    k = key("dup")
    assert pool.put(k, "first") is True
    assert pool.put(k, "second") is False
    assert pool.get(k, timeout=0) == "first"
    assert len(pool) == 1


def test_duplicate_after_pop_is_still_ignored():
    pool = MessagePool()
    k = key("dup")
    pool.put(k, "first")
    assert pool.get(k, timeout=0, pop=True) == "first"
    assert k not in pool
    assert pool.put(k, "retransmitted") is False
    assert k not in pool
    with pytest.raises(MessageTimeoutError):
        pool.get(k, timeout=0.01)


def test_interrupt_key_present_raises_interrupted_with_value():
    pool = MessagePool()
    abort = key("abort", "aggregator")
    pool.put(abort, {"dropped": ["charlie"]})
    with pytest.raises(Interrupted) as info:
        pool.get(key("never"), timeout=5, interrupt=abort)
    assert info.value.key == abort
    assert info.value.value == {"dropped": ["charlie"]}
    assert isinstance(info.value, ConfideError)


def test_interrupt_wakes_a_blocked_wait():
    pool = MessagePool()
    aborts = [key("abort", "aggregator", 1), key("abort", "aggregator", 2)]
    thread = put_later(pool, 0.1, aborts[1], "stop")
    start = time.monotonic()
    with pytest.raises(Interrupted) as info:
        pool.get(key("never"), timeout=5, interrupt=aborts)
    thread.join()
    assert time.monotonic() - start < 3
    assert info.value.key == aborts[1] and info.value.value == "stop"


def test_interrupt_absent_does_not_disturb_get():
    pool = MessagePool()
    pool.put(key("mine"), 3)
    assert pool.get(key("mine"), timeout=0, interrupt=[key("abort"), key("abort2")]) == 3


def test_interrupt_with_a_single_string_key():
    pool = MessagePool()
    pool.put("abort", "stop")
    with pytest.raises(Interrupted):
        pool.get("result", timeout=0.2, interrupt="abort")


def test_discard_drops_matching_and_forgets_consumed():
    pool = MessagePool()
    for r in (1, 2, 3):
        for s in ("alpha", "bravo"):
            pool.put(key("t", s, r), (r, s))
    pool.get(key("t", "alpha", 1), timeout=0, pop=True)
    dropped = pool.discard(lambda k: k[1] < 3)
    assert dropped == 3  # (1, bravo), (2, alpha), (2, bravo): (1, alpha) was already popped
    assert len(pool) == 2
    assert pool.get(key("t", "bravo", 3), timeout=0) == (3, "bravo")
    # consumed keys of discarded rounds are forgotten: the key can be used again
    assert pool.put(key("t", "alpha", 1), "again") is True
    # consumed keys that do not match stay consumed
    pool.get(key("t", "alpha", 3), timeout=0, pop=True)
    assert pool.discard(lambda k: False) == 0
    assert pool.put(key("t", "alpha", 3), "again") is False


def test_concurrent_puts_and_gets():
    pool = MessagePool()
    count = 200
    results: dict[int, int] = {}

    def consumer() -> None:
        for i in reversed(range(count)):
            results[i] = pool.get(key(f"m{i}"), timeout=10, pop=True)

    def producer(offset: int) -> None:
        for i in range(offset, count, 4):
            pool.put(key(f"m{i}"), i * i)
            pool.put(key(f"m{i}"), -1)  # duplicate, ignored

    threads = [threading.Thread(target=consumer)] + [threading.Thread(target=producer, args=(o,)) for o in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    assert results == {i: i * i for i in range(count)}
    assert len(pool) == 0
