"""Fixed-point gradients packed into Paillier plaintexts (G and H per row; classes per row)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from confide.errors import InvalidParameterError, ProtocolError
from confide.vertical.secureboost.params import FIELD_BITS, MIN_PRECISION_BITS, SecureBoostParams


# -- fixed point ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GHPacking:
    """Fixed-point form of one tree's gradients: G = g·2^p + offset·2^p >= 0, H = h·2^p >= 0.

    ``offset`` is a power of two at least |min g|, so that ``offset·2^p`` is an integer and
    ``sum G - count·offset·2^p`` is exactly the sum of the rounded g·2^p. ``precision`` is chosen so
    that a sum over all ``rows`` rows stays below 2^62 in both fields.
    """

    precision: int
    offset_log2: int
    rows: int

    @classmethod
    def choose(cls, g: np.ndarray, h: np.ndarray) -> GHPacking:
        """The packing for one tree's g and h (refused if the fields cannot hold them)."""
        rows = len(g)
        low = float(-g.min()) if len(g) else 0.0
        offset_log2 = max(0, math.ceil(math.log2(low))) if low > 0 else 0
        span = float(g.max()) + 2.0**offset_log2 if len(g) else 1.0
        top = max(span, float(h.max()) if len(h) else 1.0, 1.0)
        precision = FIELD_BITS - 1 - rows.bit_length() - math.ceil(math.log2(top))
        if precision < MIN_PRECISION_BITS:
            raise InvalidParameterError(
                f"gradients span {span:.3g} over {rows} rows: too wide for the {FIELD_BITS}-bit packed fields "
                f"(precision would be {precision} bits, at least {MIN_PRECISION_BITS} needed); rescale the labels"
            )
        return cls(precision=precision, offset_log2=offset_log2, rows=rows)

    @property
    def offset_int(self) -> int:
        """offset·2^precision, an exact integer."""
        return 1 << (self.offset_log2 + self.precision)

    def encode(self, g: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The non-negative integers G, H of each row."""
        scale = float(2**self.precision)
        G = np.rint(g * scale).astype(np.int64) + self.offset_int
        H = np.rint(h * scale).astype(np.int64)
        if (G < 0).any() or (H < 0).any():
            raise ProtocolError("gradient packing produced a negative field (offset chosen wrongly)")
        return G, H

    def to_float(self, G_sum: np.ndarray, H_sum: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sums of G, H over ``counts`` rows -> sums of g, h (exact integers, then one rounding)."""
        scale = float(2**self.precision)
        g = (G_sum - counts.astype(np.int64) * self.offset_int).astype(np.float64) / scale
        return g, H_sum.astype(np.float64) / scale

    def plaintexts(self, G: np.ndarray, H: np.ndarray) -> list[bytes]:
        """``G << 62 | H`` as 16-byte big-endian plaintexts."""
        G = G.astype(np.uint64)
        hi = G >> np.uint64(64 - FIELD_BITS)
        lo = ((G & np.uint64((1 << (64 - FIELD_BITS)) - 1)) << np.uint64(FIELD_BITS)) | H.astype(np.uint64)
        raw = np.stack([hi, lo], axis=1).astype(">u8").tobytes()
        return [raw[i : i + 16] for i in range(0, len(raw), 16)]

    def to_dict(self) -> dict:
        """Fields as a mapping."""
        return asdict(self)


def packed_plaintexts(encoded: list[tuple[np.ndarray, np.ndarray]]) -> list[bytes]:
    """One plaintext per row holding every class's ``G << 62 | H``, class k at bit ``124 k``."""
    fields = 2 * FIELD_BITS
    size = (fields * len(encoded) + 7) // 8
    out = []
    for row in zip(*(zip(G.tolist(), H.tolist(), strict=True) for G, H in encoded), strict=True):
        value = 0
        for k, (g, h) in enumerate(row):
            value |= ((g << FIELD_BITS) | h) << (fields * k)
        out.append(value.to_bytes(size, "big"))
    return out


def pack_this_round(params: SecureBoostParams, history: list[dict], rows: int) -> bool:
    """Whether a multi-class round encrypts a row's classes together (``pack_classes``).

    Packing saves (K - 1) encryptions per row and round; it costs decryptions, because a folded
    ciphertext then holds ``slots / K`` cells instead of ``slots``. "auto" weighs the two with
    the previous round's measured seconds per encryption and per decryption and its cell count.
    """
    K = params.classes
    if K < 2 or params.pack_classes == "never" or params.cells_per_ciphertext(K) < 1:
        return False
    if params.pack_classes == "always":
        return True
    previous = history[-K:] if len(history) >= K else []
    encryptions = rows * (1 if previous and previous[0].get("packed_classes") else K)
    encrypt_s = sum(e.get("encrypt_s", 0.0) for e in previous)
    decrypt_s = sum(v for e in previous for name, v in e.items() if name.endswith("_decrypt_s"))
    decrypted = sum(v for e in previous for name, v in e.items() if name.endswith("_decrypted"))
    cells = sum(v for e in previous for name, v in e.items() if name.endswith("_cells"))
    if not previous or not encrypt_s or not decrypted:
        return False
    extra = cells * (1 / params.cells_per_ciphertext(K) - 1 / params.slots) * decrypt_s / decrypted
    return (K - 1) * rows * encrypt_s / encryptions > extra
