"""Fixed-size slices and the encryption/transmission pipeline (seed 003, without RDMA).

An update of ``length`` values is cut into slices of ``slice_length`` values (the default,
64 KiB of float32 plaintext, is 16,384 values); the last slice may be shorter. Slices are
protected one by one: with ``pipelined`` producer threads protect the next slices while the
gRPC stream sends slice i-1, holding at most ``depth`` protected slices in memory. The native
crypto releases the GIL, so the producers and the sender really run at the same time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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


def pipelined(
    produce: Callable[[int], T], count: int, *, depth: int = 4, enabled: bool = True, workers: int = 1
) -> Iterator[T]:
    """Yield ``produce(0..count-1)`` in order, computing ahead in threads when ``enabled``.

    ``workers`` threads protect different slices at once (each single-threaded is better on a
    loaded machine than one slice split across cores: no thread waits for a descheduled
    sibling); at most ``depth`` finished-or-running slices are held. Without ``enabled`` every
    item is produced first and then yielded (the non-overlapped reference). An exception in
    ``produce`` is re-raised by the iterator; abandoning the iterator cancels what is queued.
    """
    if not enabled:
        yield from [produce(index) for index in range(count)]
        return
    if depth < 1 or workers < 1:
        raise InvalidParameterError(f"depth and workers must be >= 1, got depth={depth}, workers={workers}")
    ahead = max(depth, workers)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="confide-slice") as pool:
        pending: deque = deque()
        submitted = 0
        try:
            while submitted < count or pending:
                while submitted < count and len(pending) < ahead:
                    pending.append(pool.submit(produce, submitted))
                    submitted += 1
                item = pending.popleft().result()
                # Refill before handing the item over, so production goes on while it is sent.
                while submitted < count and len(pending) < ahead:
                    pending.append(pool.submit(produce, submitted))
                    submitted += 1
                yield item
        finally:
            for future in pending:
                future.cancel()
