"""A party's memory during a round: the global vector waits on disk while the round runs.

A round needs the global vector twice: to take this party's change after local training
(``delta = local - global``) and to apply the sum at the end (``global + aggregate``). In
between it holds the change (scaled into its contribution) and the aggregate as it arrives.
Holding the global vector too would make three copies of the model; a model of
:data:`SPILL_BYTES` or more has it written to an unnamed temporary file instead (freed by the
system even if the process dies) and read back a chunk at a time for the subtraction, and whole
for the apply, once the contribution is gone. What a round adds to a party's memory is then
about twice the model's bytes (docs/models.md, "Memory").

Smaller models, and FedProx (whose local fit reads the global weights throughout), keep it in
memory.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import weakref
from typing import TYPE_CHECKING

import numpy as np

from confide.errors import InvalidParameterError
from confide.protect.base import CHUNK

if TYPE_CHECKING:
    from confide.ml import WeightLayout

__all__ = [
    "ROUND_FACTOR",
    "SPILL_BYTES",
    "HeldVector",
    "SpilledAggregate",
    "byte_pieces",
    "check_memory_limit",
    "release_freed_memory",
    "resident_bytes",
    "return_large_buffers",
]

#: Global vectors of at least this many bytes wait on disk during a round.
SPILL_BYTES = 64 * 1024 * 1024
#: What a round may add to a party's process, in model sizes (docs/models.md: about 2, and 3 as
#: the bound a memory limit is checked against).
ROUND_FACTOR = 3


def release_freed_memory() -> None:
    """Hand freed heap memory back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    A round frees thousands of slice-sized buffers, many from the upload's threads' arenas;
    glibc keeps them for reuse, so without this a party's resident set carries about a model's
    size of freed slices into the next round.
    """
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM = None

#: glibc's ``mallopt`` parameter for the size from which an allocation is its own mapping.
_M_MMAP_THRESHOLD = -3
#: Buffers from this size up (slices, relayed pieces, tensors) are mapped on their own.
MMAP_THRESHOLD = 1024 * 1024


def return_large_buffers() -> None:
    """Give every buffer of :data:`MMAP_THRESHOLD` or more its own mapping, unmapped when freed.

    glibc raises its threshold for that as large buffers are freed (up to 32 MiB), after which
    buffers of a slice's or a relayed piece's size come from the heap, and freed ones stay in the
    process until trimmed: a party then carries a model's size of freed pieces into its rounds. A
    fixed threshold keeps the resident set to what is in use. Nothing where glibc is missing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass


def resident_bytes(*, peak: bool = False) -> int:
    """The calling process's resident set (``VmRSS``), or with ``peak`` its largest (``VmHWM``), bytes.

    0 where /proc is missing.
    """
    field = "VmHWM:" if peak else "VmRSS:"
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def check_memory_limit(
    party_id: str, values: int, model_bytes: int, limit_mb: int, resident: int | None = None
) -> None:
    """Refuse, with the numbers, a model whose rounds would pass the party's ``model.memory_limit_mb``."""
    resident = resident_bytes() if resident is None else resident
    need = resident + ROUND_FACTOR * model_bytes
    if need > limit_mb * 2**20:
        raise InvalidParameterError(
            f"party {party_id!r}: the model's {values:,} values ({model_bytes / 2**20:,.0f} MiB) need about "
            f"{need / 2**20:,.0f} MiB here (this process holds {resident / 2**20:,.0f} MiB with the model built, "
            f"and a round adds up to {ROUND_FACTOR}x the model's bytes), past model.memory_limit_mb {limit_mb}"
        )


def _unnamed_file(owner: object) -> tuple[int, weakref.finalize]:
    """A descriptor of an unnamed temporary file, closed when ``owner`` goes (or the process dies)."""
    descriptor, name = tempfile.mkstemp(prefix="confide-round-")
    os.unlink(name)
    return descriptor, weakref.finalize(owner, os.close, descriptor)


def _pwrite_all(descriptor: int, values: np.ndarray, position: int) -> None:
    view = memoryview(np.ascontiguousarray(values)).cast("B")
    offset = 0
    while offset < len(view):
        offset += os.pwrite(descriptor, view[offset:], position + offset)


def _pread_into(descriptor: int, out: np.ndarray, position: int) -> None:
    view = memoryview(out).cast("B")
    offset = 0
    while offset < len(view):
        read = os.preadv(descriptor, [view[offset:]], position + offset)
        if read <= 0:
            raise OSError(f"a round's temporary file ended after {position + offset} bytes")
        offset += read


def _read_chunks(descriptor: int, size: int, dtype: np.dtype):
    """``(start, values)`` of a file of ``size`` values, :data:`CHUNK` at a time, into one reused buffer."""
    buffer = np.empty(min(CHUNK, size), dtype=dtype)
    for start in range(0, size, CHUNK):
        part = buffer[: min(CHUNK, size - start)]
        _pread_into(descriptor, part, start * dtype.itemsize)
        yield start, part


class HeldVector:
    """The round-start global vector: in memory, or in a temporary file for a large model."""

    def __init__(self, vector: np.ndarray, *, spill: bool) -> None:
        self.dtype, self.size = vector.dtype, vector.size
        self._vector: np.ndarray | None = None
        self._fd: int | None = None
        if spill:
            self._fd, self._closer = _unnamed_file(self)
            _pwrite_all(self._fd, vector, 0)
        else:
            self._vector = vector

    @classmethod
    def of_weights(cls, layout: WeightLayout, weights: dict, *, keep: bool = False) -> HeldVector:
        """Hold a model's weights as the layout's flat vector, taking each tensor out of ``weights``.

        A vector of :data:`SPILL_BYTES` or more goes to disk a tensor at a time, so no flat copy of
        it is ever whole in memory; with ``keep`` (the caller still reads it) it stays in memory.
        """
        dtype = np.dtype(layout.dtype)
        if keep or layout.size * dtype.itemsize < SPILL_BYTES:
            return cls(layout.flatten(weights, consume=True), spill=False)
        layout.check(weights)
        held = cls(np.empty(0, dtype=dtype), spill=True)
        held.size = layout.size
        for tensor, (start, _stop) in zip(layout.tensors, layout.segments(), strict=True):
            value = weights.pop(tensor.name)
            _pwrite_all(held._fd, np.asarray(value, dtype=dtype).ravel(), start * dtype.itemsize)
            del value
        return held

    @property
    def spilled(self) -> bool:
        """Whether the vector waits on disk."""
        return self._fd is not None

    def subtract_from(self, out: np.ndarray) -> None:
        """``out -= global``, a chunk at a time from disk."""
        if self._vector is not None:
            np.subtract(out, self._vector, out=out)
            return
        for start, part in _read_chunks(self._fd, self.size, self.dtype):
            np.subtract(out[start : start + part.size], part, out=out[start : start + part.size])

    def load(self) -> np.ndarray:
        """The whole vector (read back from disk, for the apply or a readmission)."""
        if self._vector is not None:
            return self._vector
        out = np.empty(self.size, dtype=self.dtype)
        _pread_into(self._fd, out, 0)
        return out

    def close(self) -> None:
        """Free the file (or drop the reference)."""
        if self._fd is not None:
            self._closer()
            self._fd = None
        self._vector = None


class SpilledAggregate:
    """A round's aggregate written to an unnamed file slice by slice, as ``finish_round`` decodes it.

    It takes the assignments and the in-place scaling a mode's ``finish_round`` makes of the
    vector ``RoundContext.output()`` gives it; the round loop then adds it into the global
    vector a chunk at a time (:meth:`add_into`), so a large model's aggregate never sits in
    memory beside the contribution.
    """

    def __init__(self, size: int, dtype) -> None:
        self.size, self.dtype = size, np.dtype(dtype)
        self.shape = (size,)
        self._fd, self._closer = _unnamed_file(self)
        os.ftruncate(self._fd, size * self.dtype.itemsize)

    def __setitem__(self, key: slice, values) -> None:
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("a spilled aggregate takes contiguous slices")
        values = np.asarray(values, dtype=self.dtype).ravel()
        if values.size != stop - start:
            raise ValueError(f"{values.size} values for positions {start}:{stop}")
        _pwrite_all(self._fd, values, start * self.dtype.itemsize)

    def _chunks(self):
        return _read_chunks(self._fd, self.size, self.dtype)

    def __imul__(self, factor):
        factor = np.asarray(factor)
        for start, part in self._chunks():
            part *= factor if factor.ndim == 0 else factor[start : start + part.size]
            _pwrite_all(self._fd, part, start * self.dtype.itemsize)
        return self

    def add_into(self, out: np.ndarray) -> None:
        """``out += aggregate``, a chunk at a time."""
        for start, part in self._chunks():
            out[start : start + part.size] += part

    def load(self) -> np.ndarray:
        """The whole aggregate in memory (privacy, or a strategy that needs all of it)."""
        out = np.empty(self.size, dtype=self.dtype)
        _pread_into(self._fd, out, 0)
        return out

    def close(self) -> None:
        """Free the file."""
        self._closer()


def byte_pieces(layout: WeightLayout, weights, size: int):
    """The flat vector's bytes (in ``layout.dtype``) in pieces of ``size``, cut from the tensors.

    No flat copy of the model is made: one piece at a time is built.
    """
    piece = bytearray()
    for tensor in layout.tensors:
        data = memoryview(np.ascontiguousarray(weights[tensor.name], dtype=layout.dtype)).cast("B")
        offset = 0
        while offset < len(data):
            take = min(size - len(piece), len(data) - offset)
            piece += data[offset : offset + take]
            offset += take
            if len(piece) == size:
                yield bytes(piece)
                piece = bytearray()
        del data
    if piece or not layout.size:
        yield bytes(piece)
