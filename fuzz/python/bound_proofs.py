"""Fuzz target: ``_native.bound_verify``, the range proofs a peer relays each round (protection.prove_bound).

A proof message is ``"CBP1", count, bits, (u32 length, proof, commitments)*`` per 64 values,
then with ``protection.l2_bound`` a norm proof (``"CBN1", count, bound, ...``); the receiver knows
how many values, bits and what bound to expect. Here they are read from the message itself
(bounded), so near-valid inputs reach the proofs, and each input is checked without a norm bound
and with the one it declares. Whatever the bytes, the answer is commitments
or a reason (never a panic, never commitments with a reason); what verifies re-verifies the same.
"""

from __future__ import annotations

import struct

import _common

with _common.instrumented(__name__):
    from confide import _native

ALLOWED = ()
CONTEXT = b"confide-bound-v1 fuzz"


def fuzz_one(data: bytes) -> None:
    """Verify ``data`` as the message it declares to be; an accepted one gives 32 bytes a value."""
    count, bits = struct.unpack_from("<II", data, 4) if len(data) >= 12 else (1, 16)
    count, bits = min(count, 256), min(bits, 40)
    at = data.find(b"CBN1", 12)
    declared = int.from_bytes(data[at + 8 : at + 16], "little") if 0 <= at <= len(data) - 16 else 1
    for l2 in (None, declared):
        points, why = _native.bound_verify(CONTEXT, data, count, bits, True, l2)
        assert bool(points) != bool(why) or (count == 0 and not why), (len(points), why)
        if not why:
            assert len(points) == 32 * count
            assert _native.bound_verify(CONTEXT, data, count, bits, False, l2) == (points, "")


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
