"""Fixed-size slices and the encryption/transmission pipeline (seed 003, without RDMA).

An update of ``length`` values is cut into slices of ``slice_length`` values (the default,
64 KiB of float32 plaintext, is 16,384 values); the last slice may be shorter. Slices are
protected one by one: with ``pipelined`` a producer thread protects slice i while the gRPC
stream sends slice i-1, holding at most ``depth`` protected slices in memory. The native
crypto releases the GIL, so the producer and the sender really run at the same time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from confide.errors import InvalidParameterError

__all__ = ["DEFAULT_SLICE_BYTES", "pipelined", "slice_bounds", "slice_length_for"]

DEFAULT_SLICE_BYTES = 64 * 1024
MIN_SLICE_BYTES = 1024
MAX_SLICE_BYTES = 16 * 1024 * 1024
T = TypeVar("T")


def slice_length_for(slice_bytes: int) -> int:
    """Values per slice for ``slice_bytes`` of float32 plaintext."""
    if not isinstance(slice_bytes, int) or not MIN_SLICE_BYTES <= slice_bytes <= MAX_SLICE_BYTES:
        raise InvalidParameterError(
            f"slice_bytes must be an int in [{MIN_SLICE_BYTES}, {MAX_SLICE_BYTES}], got {slice_bytes!r}"
        )
    if slice_bytes % 4:
        raise InvalidParameterError(f"slice_bytes must be a multiple of 4 (float32 values), got {slice_bytes}")
    return slice_bytes // 4


def slice_bounds(length: int, slice_length: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of every slice of a vector of ``length`` values."""
    if length < 1:
        raise InvalidParameterError(f"vector length must be >= 1, got {length}")
    return [(start, min(start + slice_length, length)) for start in range(0, length, slice_length)]


def pipelined(produce: Callable[[int], T], count: int, *, depth: int = 4, enabled: bool = True) -> Iterator[T]:
    """Yield ``produce(0..count-1)`` in order, computing ahead in a thread when ``enabled``.

    Without ``enabled`` every item is produced first and then yielded (the non-overlapped
    reference). An exception in ``produce`` is re-raised by the iterator; abandoning the
    iterator stops the producer.
    """
    if not enabled:
        yield from [produce(index) for index in range(count)]
        return
    if depth < 1:
        raise InvalidParameterError(f"depth must be >= 1, got {depth}")
    buffer: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def worker() -> None:
        try:
            for index in range(count):
                item = produce(index)
                while not stop.is_set():
                    try:
                        buffer.put((None, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            buffer.put((None, done))
        except BaseException as error:  # noqa: BLE001 - handed to the consuming thread
            buffer.put((error, None))

    thread = threading.Thread(target=worker, name="confide-slice-producer", daemon=True)
    thread.start()
    try:
        while True:
            error, item = buffer.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()
