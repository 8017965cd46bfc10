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

import os
import tempfile
import weakref

import numpy as np

from confide.errors import InvalidParameterError

__all__ = ["ROUND_FACTOR", "SPILL_BYTES", "HeldVector", "check_memory_limit", "resident_bytes"]

#: Global vectors of at least this many bytes wait on disk during a round.
SPILL_BYTES = 64 * 1024 * 1024
#: Values read back at once.
_CHUNK = 1 << 20
#: What a round may add to a party's process, in model sizes (docs/models.md: about 2, and 3 as
#: the bound a memory limit is checked against).
ROUND_FACTOR = 3


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


class HeldVector:
    """The round-start global vector: in memory, or in a temporary file for a large model."""

    def __init__(self, vector: np.ndarray, *, spill: bool) -> None:
        self.dtype, self.size = vector.dtype, vector.size
        self._vector: np.ndarray | None = None
        self._fd: int | None = None
        if spill:
            descriptor, name = tempfile.mkstemp(prefix="confide-global-")
            os.unlink(name)  # unnamed: the system frees it when the descriptor closes, or the process dies
            self._fd = descriptor
            self._closer = weakref.finalize(self, os.close, descriptor)
            view = memoryview(np.ascontiguousarray(vector)).cast("B")
            offset = 0
            while offset < len(view):
                offset += os.pwrite(descriptor, view[offset:], offset)
        else:
            self._vector = vector

    @classmethod
    def of(cls, vector: np.ndarray, *, keep: bool = False) -> HeldVector:
        """Hold ``vector``: on disk when it is large, unless ``keep`` (the caller still reads it)."""
        return cls(vector, spill=not keep and vector.nbytes >= SPILL_BYTES)

    @property
    def spilled(self) -> bool:
        """Whether the vector waits on disk."""
        return self._fd is not None

    def _read_into(self, out: np.ndarray, start: int) -> None:
        view = memoryview(out).cast("B")
        offset, position = 0, start * self.dtype.itemsize
        while offset < len(view):
            read = os.preadv(self._fd, [view[offset:]], position + offset)
            if read <= 0:
                raise OSError(f"the held global vector ended after {position + offset} bytes")
            offset += read

    def subtract_from(self, out: np.ndarray) -> None:
        """``out -= global``, a chunk at a time from disk."""
        if self._vector is not None:
            np.subtract(out, self._vector, out=out)
            return
        chunk = np.empty(min(_CHUNK, self.size), dtype=self.dtype)
        for start in range(0, self.size, _CHUNK):
            part = chunk[: min(_CHUNK, self.size - start)]
            self._read_into(part, start)
            np.subtract(out[start : start + part.size], part, out=out[start : start + part.size])

    def load(self) -> np.ndarray:
        """The whole vector (read back from disk, for the apply or a readmission)."""
        if self._vector is not None:
            return self._vector
        out = np.empty(self.size, dtype=self.dtype)
        self._read_into(out, 0)
        return out

    def close(self) -> None:
        """Free the file (or drop the reference)."""
        if self._fd is not None:
            self._closer()
            self._fd = None
        self._vector = None
