"""Small Paillier helpers shared by the vertical protocols (Hetero LR, Hetero NN)."""

from __future__ import annotations

import time

from confide import _native
from confide.crypto.ints import int_to_bytes

__all__ = ["Meter", "elements", "raw_plaintexts"]


class Meter:
    """Accumulates the seconds spent in crypto sections (``with meter: ...``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> Meter:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._start


def raw_plaintexts(values: list[int], n: int) -> list[bytes]:
    """Big-endian bytes of each value mod n (the input of ``encrypt_raw``)."""
    return [int_to_bytes(value % n) for value in values]


def elements(vector: _native.CiphertextVector) -> list[bytes]:
    """The ciphertexts of a vector as big-endian integers."""
    return [vector.element_bytes(i) for i in range(len(vector))]
