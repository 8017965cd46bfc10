"""Fuzz target: ``confide.protect.base.unpack_parts``, decrypted shares relayed between parties.

The parts of a decrypted aggregate come back from a peer as ``count, (index, length, float32
values)*``; a malformed message must be a :class:`ProtocolError`, never a ``struct.error``.
"""

from __future__ import annotations

import _common

with _common.instrumented(__name__):
    from confide.errors import ProtocolError
    from confide.protect.base import pack_parts, unpack_parts

ALLOWED = (ProtocolError,)


def fuzz_one(data: bytes) -> None:
    """Unpack ``data``; what unpacks packs back to the same bytes (indices sorted, no repeats)."""
    parts = unpack_parts(data)
    if len(parts) == int.from_bytes(data[:4], "little"):
        indices = [int.from_bytes(data[off : off + 4], "little") for off in _offsets(data)]
        if indices == sorted(set(indices)):
            assert pack_parts(parts) == data


def _offsets(data: bytes) -> list[int]:
    offsets, offset = [], 4
    for _ in range(int.from_bytes(data[:4], "little")):
        offsets.append(offset)
        offset += 8 + 4 * int.from_bytes(data[offset + 4 : offset + 8], "little")
    return offsets


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
