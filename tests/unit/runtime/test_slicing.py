"""Slicing and the producer/consumer pipeline."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.errors import InvalidParameterError
from confide.transport.slicing import (
    DEFAULT_SLICE_BYTES,
    MAX_SLICE_BYTES,
    MIN_SLICE_BYTES,
    Paced,
    pipelined,
    slice_bounds,
    slice_length_for,
)


def wait_gone(threads: set[threading.Thread], timeout: float = 3.0) -> bool:
    for thread in threads:
        thread.join(timeout)
    return not any(thread.is_alive() for thread in threads)


# ---------------------------------------------------------------------------------------------------------------------
# slice_length_for / slice_bounds


def test_slice_length_for_default_and_limits():
    assert slice_length_for(DEFAULT_SLICE_BYTES) == 16384
    assert slice_length_for(MIN_SLICE_BYTES) == MIN_SLICE_BYTES // 4
    assert slice_length_for(MAX_SLICE_BYTES) == MAX_SLICE_BYTES // 4


@pytest.mark.parametrize("value", [0, MIN_SLICE_BYTES - 4, MAX_SLICE_BYTES + 4, -4096, 4096.0, "4096", None])
def test_slice_length_for_out_of_range_names_field_and_limits(value):
    with pytest.raises(InvalidParameterError) as info:
        slice_length_for(value)
    message = str(info.value)
    assert "slice_bytes" in message
    assert str(MIN_SLICE_BYTES) in message and str(MAX_SLICE_BYTES) in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [MIN_SLICE_BYTES + 1, MIN_SLICE_BYTES + 2, DEFAULT_SLICE_BYTES + 3])
def test_slice_length_for_not_multiple_of_four(value):
    with pytest.raises(InvalidParameterError, match="slice_bytes.*multiple of 4"):
        slice_length_for(value)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 100_000), st.integers(1, 5_000))
def test_slice_bounds_cover_vector_exactly(length, slice_length):
    bounds = slice_bounds(length, slice_length)
    assert len(bounds) == -(-length // slice_length)
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    for (start, stop), (next_start, _) in zip(bounds, bounds[1:], strict=False):
        assert stop == next_start
        assert stop - start == slice_length
    assert 1 <= bounds[-1][1] - bounds[-1][0] <= slice_length


def test_slice_bounds_examples_and_errors():
    assert slice_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert slice_bounds(8, 4) == [(0, 4), (4, 8)]
    assert slice_bounds(1, 16384) == [(0, 1)]
    with pytest.raises(InvalidParameterError, match="length"):
        slice_bounds(0, 4)


# ---------------------------------------------------------------------------------------------------------------------
# pipelined


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("count,depth", [(0, 1), (1, 1), (7, 1), (25, 4), (25, 100)])
def test_pipelined_yields_in_order(enabled, count, depth):
    calls = []

    def produce(index: int) -> int:
        calls.append(index)
        return index * 10

    assert list(pipelined(produce, count, depth=depth, enabled=enabled)) == [i * 10 for i in range(count)]
    assert calls == list(range(count))


def test_pipelined_same_results_enabled_or_not():
    def produce(index: int) -> bytes:
        return bytes([index % 251]) * (index + 1)

    assert list(pipelined(produce, 40, enabled=True)) == list(pipelined(produce, 40, enabled=False))


def test_pipelined_depth_validated():
    with pytest.raises(InvalidParameterError, match="depth"):
        list(pipelined(lambda i: i, 3, depth=0))
    with pytest.raises(InvalidParameterError, match="workers"):
        list(pipelined(lambda i: i, 3, workers=0))


@pytest.mark.parametrize("enabled", [True, False])
def test_pipelined_reraises_produce_error(enabled):
    class Boom(RuntimeError):
        pass

    def produce(index: int) -> int:
        if index == 3:
            raise Boom("slice 3 failed")
        return index

    got = []
    with pytest.raises(Boom, match="slice 3 failed"):
        for item in pipelined(produce, 10, depth=2, enabled=enabled):
            got.append(item)
    if enabled:
        assert got == [0, 1, 2]


class Recorder:
    """A produce() that records the threads it ran on and how many ran at once."""

    def __init__(self, delay: float = 0.0, fail_at: int | None = None) -> None:
        self.delay = delay
        self.fail_at = fail_at
        self.threads: set[threading.Thread] = set()
        self.produced: list[int] = []
        self.running = 0
        self.max_running = 0
        self._lock = threading.Lock()

    def __call__(self, index: int) -> int:
        with self._lock:
            self.threads.add(threading.current_thread())
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            if self.delay:
                time.sleep(self.delay)
            if index == self.fail_at:
                raise RuntimeError(f"slice {index} failed")
            with self._lock:
                self.produced.append(index)
            return index
        finally:
            with self._lock:
                self.running -= 1


def test_pipelined_producer_runs_in_another_thread():
    recorder = Recorder()
    assert list(pipelined(recorder, 3, enabled=True)) == [0, 1, 2]
    assert recorder.threads and threading.current_thread() not in recorder.threads
    recorder = Recorder()
    list(pipelined(recorder, 3, enabled=False))
    assert recorder.threads == {threading.current_thread()}


def test_pipelined_holds_at_most_depth_items_ahead():
    recorder = Recorder()
    depth = 2
    iterator = pipelined(recorder, 50, depth=depth)
    assert next(iterator) == 0
    time.sleep(0.3)
    # one handed out, at most `depth` more produced or queued (plus one waiting for room)
    assert len(recorder.produced) <= 1 + depth + 1
    iterator.close()


def test_abandoning_the_iterator_stops_the_producer():
    recorder = Recorder()
    iterator = pipelined(recorder, 10_000, depth=2)
    assert next(iterator) == 0
    iterator.close()
    assert wait_gone(recorder.threads), "producer thread still running after the iterator was closed"
    produced = len(recorder.produced)
    time.sleep(0.2)
    assert len(recorder.produced) == produced < 10


def test_abandoning_the_iterator_with_a_break_stops_the_producer():
    recorder = Recorder()
    for item in pipelined(recorder, 1000, depth=1):
        if item == 2:
            break
    assert wait_gone(recorder.threads)
    assert len(recorder.produced) < 10


def test_abandoning_after_the_last_item_was_queued_stops_the_producer():
    recorder = Recorder()
    iterator = pipelined(recorder, 2, depth=1)
    assert next(iterator) == 0
    time.sleep(0.3)  # item 1 may be queued; the producer may be handing over the end marker
    iterator.close()
    assert wait_gone(recorder.threads, timeout=1.0), "producer thread blocked after the consumer left"


@pytest.mark.parametrize("depth", [1, 3])
def test_abandoning_then_produce_error_stops_the_producer(depth):
    release = threading.Event()
    threads: set[threading.Thread] = set()

    def produce(index: int) -> int:
        threads.add(threading.current_thread())
        if index == 2:
            release.wait(5)
            raise RuntimeError("late failure")
        return index

    iterator = pipelined(produce, 3, depth=depth)
    assert next(iterator) == 0
    time.sleep(0.3)  # produce(2) may be running and blocked
    closer = threading.Thread(target=iterator.close)  # close may wait for the running produce()
    closer.start()
    time.sleep(0.1)
    release.set()
    closer.join(3)
    assert not closer.is_alive()
    assert wait_gone(threads, timeout=2.0), "producer thread blocked handing over its error"


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_pipelined_workers_keep_order(workers):
    def produce(index: int) -> int:
        time.sleep(0.001 * ((index * 7) % 5))  # finish out of order
        return index

    assert list(pipelined(produce, 30, depth=4, workers=workers)) == list(range(30))


def test_pipelined_workers_run_concurrently_and_are_bounded():
    recorder = Recorder(delay=0.03)
    assert list(pipelined(recorder, 12, depth=6, workers=3)) == list(range(12))
    assert 2 <= recorder.max_running <= 3


def _timed(enabled: bool, depth: int, count: int = 10, delay: float = 0.02) -> float:
    def produce(index: int) -> int:
        time.sleep(delay)
        return index

    start = time.perf_counter()
    for _ in pipelined(produce, count, depth=depth, enabled=enabled):
        time.sleep(delay)
    return time.perf_counter() - start


def test_pipeline_overlaps_production_and_consumption():
    count, delay = 10, 0.02
    _timed(True, 4)  # warm-up
    serial = min(_timed(False, 4) for _ in range(2))
    overlapped = min(_timed(True, 4) for _ in range(2))
    assert serial >= 2 * count * delay * 0.95
    assert overlapped < 0.8 * serial, f"pipelined {overlapped:.3f} s vs serial {serial:.3f} s"


def test_pipeline_overlaps_with_depth_one():
    serial = min(_timed(False, 1) for _ in range(2))
    overlapped = min(_timed(True, 1) for _ in range(2))
    assert overlapped < 0.8 * serial, f"pipelined {overlapped:.3f} s vs serial {serial:.3f} s"


# ---------------------------------------------------------------------------------------------------------------------
# readiness: a batch never waits for a slice still being protected


def test_ready_says_whether_the_next_item_is_done():
    gate = threading.Event()

    def produce(index: int) -> int:
        if index == 1:
            gate.wait(5.0)
        return index

    iterator = pipelined(produce, 3, depth=2)
    assert next(iterator) == 0
    assert not iterator.ready()  # item 1 is held at the gate
    gate.set()
    deadline = time.monotonic() + 5.0
    while not iterator.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert iterator.ready()
    assert list(iterator) == [1, 2]
    assert iterator.ready()  # exhausted: next() would not wait
    sequential = pipelined(lambda i: i, 3, enabled=False)
    assert sequential.ready() and list(sequential) == [0, 1, 2]


def test_a_batch_closes_early_when_the_next_slice_is_not_ready():
    from confide.transport.client import batched
    from confide.v1 import runtime_pb2 as pb

    items = [pb.Slice(index=i, n_valid=1, payload=bytes([i]) * 100) for i in range(6)]
    taken: list[int] = []

    def take():
        for item in items:
            taken.append(item.index)
            yield item

    # The slice after 1 and the one after 4 "are still being protected".
    paced = Paced(take(), lambda: taken[-1] not in (1, 4))
    messages = list(batched(pb.RoundHeader(round=1), paced))
    assert messages[0].HasField("header")
    assert [list(m.batch.indices) for m in messages[1:]] == [[0, 1], [2, 3, 4], [5]]
    # A plain iterable (no ready()) fills batches as before.
    whole = list(batched(pb.RoundHeader(round=1), iter(items)))
    assert [list(m.batch.indices) for m in whole[1:]] == [[0, 1, 2, 3, 4, 5]]
