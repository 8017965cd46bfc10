"""Fuzz target: ``confide.protect.verify.unpack_tags``, the verification tags a peer relays each round.

A tag message is ``"CVT1", slices, width, (16-byte digest, width x u64)*``; the receiver knows
how many slices and fields to expect. Here the expectation is read from the message itself
(bounded), so near-valid inputs reach the per-slice parsing; a malformed message must be a
:class:`VerificationError`, never a ``struct.error`` or an ``IndexError``.
"""

from __future__ import annotations

import struct

import _common

with _common.instrumented(__name__):
    from confide.protect.verify import VerificationError, pack_tags, unpack_tags

ALLOWED = (VerificationError,)


def fuzz_one(data: bytes) -> None:
    """Unpack ``data`` as the message it declares to be; what unpacks packs back to the same bytes."""
    slices, width = struct.unpack_from("<II", data, 4) if len(data) >= 12 else (1, 2)
    slices, width = min(slices, 64), min(width, 8)
    rows = unpack_tags(data, slices, width)
    assert pack_tags(rows, width) == data


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
