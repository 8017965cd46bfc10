"""Partial decryptions with proofs, their verification and combination (t of m decrypt)."""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import gmpy2
import numpy as np

from confide import _native
from confide.crypto import EncryptedVector, gpu
from confide.crypto.threshold.channel import CheatingPartyError
from confide.crypto.threshold.keys import (
    DOMAIN,
    KAPPA,
    ThresholdKey,
    ThresholdPublicKey,
    pack_signed,
    public_coin,
    unpack_signed,
    value_bytes,
)
from confide.crypto.vectors import pack_fixed, unpack_fixed
from confide.errors import EncodingError, InvalidParameterError, ProtocolError

# --------------------------------------------------------------------------- decryption


@dataclass(frozen=True)
class PartialDecryption:
    """Party ``index``'s c_k^(2 Delta d_j) for every ciphertext of one vector, with its proof."""

    index: int
    values: tuple[int, ...]
    challenge: int
    response: int

    def to_bytes(self, n: int) -> bytes:
        """Wire form: index, count, the values at 2k bits, then the proof."""
        width = value_bytes(2 * n.bit_length())
        head = struct.pack("<HI", self.index, len(self.values))
        return head + pack_fixed(self.values, width) + pack_signed([self.challenge, self.response])

    @classmethod
    def from_bytes(cls, data: bytes, n: int) -> PartialDecryption:
        """Inverse of :meth:`to_bytes` (values are range-checked)."""
        width = value_bytes(2 * n.bit_length())
        if len(data) < 6:
            raise ProtocolError("partial decryption: truncated")
        index, count = struct.unpack_from("<HI", data, 0)
        end = 6 + width * count
        values = unpack_fixed(data[6:end], width, count, "partial decryption")
        n2 = n * n
        if any(not 0 < value < n2 for value in values):
            raise ProtocolError("partial decryption: a value is outside (0, N^2)")
        proof = unpack_signed(data[end:], "partial decryption proof")
        if len(proof) != 2:
            raise ProtocolError("partial decryption proof must hold a challenge and a response")
        return cls(index, tuple(values), proof[0], proof[1])


def _ciphertexts(vector: EncryptedVector) -> list[int]:
    return [vector.ciphertext(i) for i in range(vector.num_ciphertexts)]


def _batch_weights(public: ThresholdPublicKey, index: int, ciphertexts: Sequence[int], partials: Sequence[int]):
    width = value_bytes(2 * public.bits)
    h = hashlib.sha256(DOMAIN + b"weights" + public.n.to_bytes(value_bytes(public.bits), "big"))
    h.update(struct.pack("<HI", index, len(ciphertexts)))
    h.update(pack_fixed(ciphertexts, width))
    h.update(pack_fixed(partials, width))
    stream = hashlib.shake_256(h.digest()).digest(16 * len(ciphertexts))
    return [int.from_bytes(stream[16 * k : 16 * k + 16], "big") | 1 for k in range(len(ciphertexts))]


def _aggregate(values: Sequence[int], weights: Sequence[int], modulus: int) -> int:
    """The product of values[k]^weights[k] mod modulus, by Pippenger's buckets (the weights are public).

    About K + 2^(c+1) products per c-bit window instead of K separate exponentiations: for
    K = 1,000 ciphertexts and 128-bit weights, ~25,000 products against ~190,000.
    """
    count = len(values)
    if count != len(weights):
        raise ValueError("values and weights differ in length")
    bits = max((int(w).bit_length() for w in weights), default=0)
    if not count or not bits:
        return 1
    c = max(1, min(8, (count.bit_length() - 1)))
    mask = (1 << c) - 1
    m = gmpy2.mpz(modulus)
    bases = [gmpy2.mpz(v) for v in values]
    acc = gmpy2.mpz(1)
    for window in reversed(range(-(-bits // c))):
        for _ in range(c):
            acc = acc * acc % m
        buckets: dict[int, gmpy2.mpz] = {}
        shift = window * c
        for base, weight in zip(bases, weights, strict=True):
            digit = (weight >> shift) & mask
            if digit:
                held = buckets.get(digit)
                buckets[digit] = base if held is None else held * base % m
        running, total = gmpy2.mpz(1), gmpy2.mpz(1)
        for digit in range(mask, 0, -1):
            held = buckets.get(digit)
            if held is not None:
                running = running * held % m
            total = total * running % m
        acc = acc * total % m
    return int(acc)


def _challenge(public: ThresholdPublicKey, index: int, *elements: int) -> int:
    return public_coin(b"proof", public.n, index, *elements, bits=KAPPA)


def partial_decrypt(
    key: ThresholdKey, vector: EncryptedVector | Sequence[int], *, threads: int = 0
) -> PartialDecryption:
    """c^(2 Delta d_j) for every ciphertext and the batched proof.

    An :class:`EncryptedVector` runs on the native engine (``threads`` cores); a list of
    ciphertexts as integers (small test keys) runs on gmpy2.
    """
    public = key.public
    n2 = public.n_squared
    exponent = 2 * public.delta * key.share
    if isinstance(vector, EncryptedVector):
        if vector.encryption_key != public.encryption_key():
            raise InvalidParameterError("vector is not encrypted under this threshold key")
        values = gpu.power(vector.encryption_key._native, vector._native, exponent)  # None: not on a GPU
        if values is None:
            magnitude = abs(exponent).to_bytes(value_bytes(abs(exponent).bit_length()), "big")
            native = vector._native.power(magnitude, exponent < 0, threads)
            values = [int.from_bytes(native.element_bytes(i), "big") for i in range(len(native))]
        ciphertexts = _ciphertexts(vector)
    else:
        ciphertexts = [int(c) for c in vector]
        values = [int(gmpy2.powmod(c, exponent, n2)) for c in ciphertexts]
    weights = _batch_weights(public, key.index, ciphertexts, values)
    base = int(gmpy2.powmod(_aggregate(ciphertexts, weights, n2), 4, n2))
    target = int(gmpy2.powmod(_aggregate(values, weights, n2), 2, n2))
    secret = public.delta * key.share
    nonce = secrets.randbits(abs(secret).bit_length() + 2 * KAPPA)
    a = int(gmpy2.powmod(base, nonce, n2))
    b = int(gmpy2.powmod(public.v, nonce, n2))
    challenge = _challenge(public, key.index, base, target, public.verification_keys[key.index - 1], a, b)
    return PartialDecryption(key.index, tuple(values), challenge, nonce + challenge * secret)


def verify_partial(
    public: ThresholdPublicKey, vector: EncryptedVector | Sequence[int], partial: PartialDecryption
) -> None:
    """Raise :class:`CheatingPartyError` naming ``partial.index`` when its proof fails."""
    index = partial.index
    if not 1 <= index <= public.parties:
        raise ProtocolError(f"partial decryption from party index {index}, expected 1..{public.parties}")
    ciphertexts = _ciphertexts(vector) if isinstance(vector, EncryptedVector) else [int(c) for c in vector]
    if len(partial.values) != len(ciphertexts):
        raise CheatingPartyError(index, f"sent {len(partial.values)} partial decryptions for {len(ciphertexts)}")
    n2 = public.n_squared
    weights = _batch_weights(public, index, ciphertexts, partial.values)
    base = int(gmpy2.powmod(_aggregate(ciphertexts, weights, n2), 4, n2))
    target = int(gmpy2.powmod(_aggregate(partial.values, weights, n2), 2, n2))
    key = public.verification_keys[index - 1]
    e, z = partial.challenge, partial.response
    try:
        a = int(gmpy2.powmod(base, z, n2)) * int(gmpy2.powmod(target, -e, n2)) % n2
        b = int(gmpy2.powmod(public.v, z, n2)) * int(gmpy2.powmod(key, -e, n2)) % n2
    except ZeroDivisionError:
        raise CheatingPartyError(index, "its partial decryption is not invertible mod N^2") from None
    if _challenge(public, index, base, target, key, a, b) != e:
        raise CheatingPartyError(index, "its partial decryption does not match its verification key (proof fails)")


def combine_partials(
    public: ThresholdPublicKey, partials: Sequence[PartialDecryption], count: int | None = None
) -> list[int]:
    """Plaintexts (in [0, N)) from t verified partial decryptions of the same vector."""
    chosen = {p.index: p for p in partials}
    if len(chosen) < public.threshold:
        raise ProtocolError(
            f"threshold decryption needs {public.threshold} partial decryptions from distinct parties, "
            f"got {len(chosen)} (from {sorted(chosen)})"
        )
    indices = sorted(chosen)[: public.threshold]
    lengths = {len(chosen[j].values) for j in indices}
    if len(lengths) != 1 or (count is not None and lengths != {count}):
        raise ProtocolError(f"partial decryptions hold different numbers of values: {sorted(lengths)}")
    n, n2, delta = public.n, public.n_squared, public.delta
    coefficients = {}
    for j in indices:
        num, den = delta, 1
        for k in indices:
            if k != j:
                num *= k
                den *= k - j
        coefficients[j] = 2 * num // den
    scale = pow(4 * delta * delta * public.theta % n, -1, n)
    out = []
    for position in range(lengths.pop()):
        value = 1
        for j in indices:
            value = value * int(gmpy2.powmod(chosen[j].values[position], coefficients[j], n2)) % n2
        out.append((value - 1) // n * scale % n)
    return out


def decrypt_packed_threshold(
    public: ThresholdPublicKey, vector: EncryptedVector, partials: Sequence[PartialDecryption]
) -> np.ndarray:
    """Float sums of a packed vector from t verified partial decryptions (overflow is an error)."""
    plaintexts = combine_partials(public, partials, vector.num_ciphertexts)
    width = value_bytes(public.bits)
    values, overflow = vector._native.decode_plaintexts([p.to_bytes(width, "big") for p in plaintexts])
    if overflow.size and vector._native.quantizer == "exact_bound":
        raise EncodingError(
            f"{overflow.size} packed sums left the code range (first at index {int(overflow[0])}): "
            "more parties than max_parties, or a faulty party"
        )
    return values


def _native_check() -> None:  # pragma: no cover - import-time guard
    if not hasattr(_native.CiphertextVector, "power"):
        raise ImportError("confide._native is older than this module: rebuild it (make setup)")


_native_check()
