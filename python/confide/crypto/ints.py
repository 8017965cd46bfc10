"""Integers as the Paillier code moves them: minimal big-endian bytes, and the centered lift mod n.

Plaintexts and key parts are non-negative integers; on the wire and at the native boundary
they are big-endian bytes of the fewest bytes that hold them (at least one: zero is one zero
byte). A signed value ``v`` travels as ``v mod n``; :func:`centered` takes it back into
``(-n/2, n/2]``, which is exact while ``|v| < n/2``.
"""

from __future__ import annotations

__all__ = ["centered", "int_to_bytes"]


def int_to_bytes(value: int) -> bytes:
    """Big-endian bytes of the non-negative ``value``, as few as hold it (at least one)."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def centered(value: int, n: int) -> int:
    """``value mod n`` in ``(-n/2, n/2]``: the signed integer that an encrypted ``v mod n`` stood for."""
    value %= n
    return value - n if value > n // 2 else value
