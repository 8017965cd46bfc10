"""Signed fixed point in the ring Z_{2^32}: how the masking modes carry real values.

A sum of ``parties`` values, each at most ``bound`` in magnitude, must not wrap around the 32-bit
ring. :class:`FixedPoint` picks the most fraction bits f with ``parties * (bound * 2^f + 1/2) <
2^31``, so the decoded sum is exact up to one rounding per party. The masking protocols
(:mod:`confide.protect.masking`) encode with it, and differential privacy's planning
(:mod:`confide.privacy.distributed`) asks it how much room the noise has; it sits in ``crypto``
so both use the one rule without one of them importing the other.
"""

from __future__ import annotations

import math

import numpy as np

from confide.errors import EncodingError

__all__ = ["FixedPoint"]


class FixedPoint:
    """Signed fixed point in Z_{2^bits} (32 by default) for sums of ``parties`` values bounded by ``bound``.

    ``bits`` below 32: the lattice mode's messages, whose ring is narrower than a word (the
    encodings are still uint32 words, holding residues mod ``2^bits``).
    """

    def __init__(self, bound: float, parties: int, bits: int = 32) -> None:
        if not math.isfinite(bound) or bound < 0:
            raise EncodingError(f"bound must be finite and >= 0, got {bound}")
        if not 2 <= bits <= 32:
            raise EncodingError(f"bits must be in [2, 32], got {bits}")
        bound = max(bound, 2.0**-20)
        top = 2 ** (bits - 1) - 1
        # Each encoding is round(x * 2^f), up to B * 2^f + 1/2 in magnitude; m of them must stay below 2^(bits-1).
        room = top / parties - 0.5
        self.fraction_bits = min(40, math.floor(math.log2(room / bound))) if room > 0 else -1
        if self.fraction_bits >= 0 and parties * (bound * 2.0**self.fraction_bits + 0.5) > top:
            self.fraction_bits -= 1
        if self.fraction_bits < 0:
            raise EncodingError(
                f"values up to {bound:g} from {parties} parties do not fit a {bits}-bit ring "
                f"(bound * parties must be < 2^{bits - 1})"
            )
        self.scale = float(2**self.fraction_bits)
        self.bound = bound
        self.bits = bits

    def encode(self, values: np.ndarray) -> np.ndarray:
        """uint32 words of ``values`` (|values| <= bound), residues mod ``2^bits``."""
        scaled = np.rint(np.clip(np.asarray(values, dtype=np.float64), -self.bound, self.bound) * self.scale)
        words = scaled.astype(np.int64)
        if self.bits < 32:
            words &= (1 << self.bits) - 1
        return words.astype(np.uint32)

    def decode(self, words: np.ndarray) -> np.ndarray:
        """Float64 values of a sum of encodings."""
        if self.bits == 32:
            return words.view(np.int32).astype(np.float64) / self.scale
        # residues mod 2^bits, moved to the top of the word: as int32 they are the signed values
        # times 2^(32 - bits), exactly (one pass less than a compare and a subtraction)
        shift = 32 - self.bits
        top = np.left_shift(np.asarray(words, dtype=np.uint32), np.uint32(shift))
        return top.view(np.int32).astype(np.float64) / (self.scale * 2.0**shift)
