"""Key-homomorphic RLWE sums, the primitives of lattice aggregation (docs/crypto.md, "Lattice aggregation").

One round (the ``lattice`` protection mode runs the same protocol on two values a coefficient,
:mod:`confide.protect.lattice`; these are the mod-``q`` primitives, with a plaintext modulus):

1. every party draws a fresh :class:`RoundKey`, encrypts its integer vector under it with the
   round's public seed (:meth:`RoundKey.encrypt`: only the ciphertext travels), and sends each
   other party its Shamir share of the key (:meth:`RoundKey.shares`; sealed to the recipient);
2. the aggregator adds the ciphertexts (:func:`fold`), knowing nothing that decrypts;
3. every party adds the shares it received (:func:`add_shares`; Shamir over ``F_65521``, uint16)
   from the parties whose ciphertexts made the sum; any
   ``threshold`` of those summed shares rebuild the *sum* of those parties' keys
   (:func:`key_sum`), which decrypts the summed vector (:func:`decrypt`) and nothing else.

Values are signed integers (a quantized update); they travel as residues mod ``2^plaintext_bits``
and decode centred, so a sum must stay within ``±2^(plaintext_bits - 1)``: the lanes need headroom
for the parties' sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from confide import _native
from confide.errors import InvalidParameterError

__all__ = ["LatticeParams", "RoundKey", "add_shares", "decrypt", "fold", "key_sum"]


@dataclass(frozen=True)
class LatticeParams:
    """Ring dimension and plaintext bits (the lane width, headroom for the sum included)."""

    n: int = 4096
    plaintext_bits: int = 24

    def ring(self) -> _native.LatticeRing:
        """The native ring (its checks name the field and the limit), built once per parameter set."""
        return _ring(self.n, self.plaintext_bits)


@lru_cache(maxsize=8)
def _ring(n: int, plaintext_bits: int) -> _native.LatticeRing:
    return _native.LatticeRing(n, plaintext_bits)


def _residues(values: np.ndarray, bits: int) -> np.ndarray:
    values = np.asarray(values)
    if values.dtype.kind not in "iu":
        raise InvalidParameterError(f"values must be integers (a quantized update), got {values.dtype}")
    half = 1 << (bits - 1)
    if values.size and (int(values.max()) >= half or int(values.min()) < -half):
        raise InvalidParameterError(f"values must lie in [-2^{bits - 1}, 2^{bits - 1}) for {bits}-bit lanes")
    return (values.astype(np.int64) & ((1 << bits) - 1)).astype(np.uint64)


class RoundKey:
    """One party's fresh key for one round."""

    def __init__(self, params: LatticeParams) -> None:
        self.params = params
        self._ring = params.ring()
        self._key = self._ring.new_key()

    def encrypt(self, seed: bytes, values: np.ndarray) -> np.ndarray:
        """The ciphertext of signed ``values`` under this key and the round's ``seed`` (uint64, whole blocks)."""
        return self._ring.encrypt(seed, self._key, _residues(values, self.params.plaintext_bits))

    def shares(self, threshold: int, parties: int) -> list[np.ndarray]:
        """Shamir shares of the key for the parties 1..``parties`` (``threshold`` rebuild it; uint16)."""
        return self._key.shares(threshold, parties)


def fold(total: np.ndarray, ciphertext: np.ndarray) -> None:
    """The aggregator's sum of ciphertexts mod ``q``, in place."""
    _native.LatticeRing.fold(total, ciphertext)


def add_shares(total: np.ndarray, share: np.ndarray) -> None:
    """A party's sum of the key shares it received, in place (in ``F_65521``)."""
    _native.LatticeKeySum.add_shares(total, share)


def key_sum(points: Sequence[int], summed_shares: Sequence[np.ndarray], parties: int) -> _native.LatticeKeySum:
    """The sum of ``parties`` keys from ``threshold`` or more summed shares (their 1-based points)."""
    return _native.LatticeKeySum.reconstruct(list(points), list(summed_shares), parties)


def decrypt(
    params: LatticeParams, seed: bytes, keys: _native.LatticeKeySum, total: np.ndarray, length: int
) -> np.ndarray:
    """The signed sum of the vectors ``total`` adds (int64, ``length`` values)."""
    residues = params.ring().decrypt(seed, keys, total, length).astype(np.int64)
    bits = params.plaintext_bits
    return np.where(residues >= 1 << (bits - 1), residues - (1 << bits), residues)
