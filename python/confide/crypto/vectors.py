"""Encrypted vectors as the vertical protocols move them (Hetero LR, Hetero NN).

The integer and Paillier plumbing both two-party protocols share: keys and their modulus,
ciphertext vectors from and to bytes (a peer's bytes are checked and a bad one is a
:class:`ProtocolError` naming where it came from), masks and their removal, fixed-width and
slot packing of integers, and encrypted dot products with unsigned and signed coefficients.
What a protocol does with them (its fixed-point scales, its messages) stays in the protocol.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from confide import _native
from confide.crypto import gpu
from confide.crypto.ints import centered, int_to_bytes
from confide.errors import ConfideError, InvalidParameterError, ProtocolError

__all__ = [
    "Meter",
    "byte_width",
    "decrypt_centered",
    "dot_u64",
    "elements",
    "from_elements",
    "generate_keypair",
    "mask_vector",
    "modulus",
    "pack_fixed",
    "pack_slots",
    "parse_public_key",
    "parse_vector",
    "positive_masks",
    "random_below",
    "raw_plaintexts",
    "signed_dot",
    "unmask",
    "unpack_fixed",
    "unpack_signed",
    "unpack_unsigned",
]

_BROKE = "a peer did not follow the protocol"


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


# -- keys -------------------------------------------------------------------------------------------
def generate_keypair(bits: int, *, precompute: bool = False) -> _native.DecryptionKey:
    """A fresh key pair; ``precompute`` fills the owner's fixed-base tables now, not on first use."""
    secret = _native.generate_keypair(bits)
    if precompute:
        secret.precompute()
    return secret


def modulus(key: _native.EncryptionKey) -> int:
    """The key's n."""
    return int.from_bytes(key.n_bytes(), "big")


def byte_width(key: _native.EncryptionKey) -> int:
    """Bytes of a value mod n, as :func:`pack_fixed` writes it."""
    return (key.bits + 7) // 8


def parse_public_key(data: Any, where: str) -> _native.EncryptionKey:
    """A peer's public key from its bytes."""
    if not isinstance(data, bytes) or not data:
        raise ProtocolError(f"{where}: no public key was sent")
    try:
        return _native.EncryptionKey.from_bytes(data)
    except (ConfideError, ValueError) as error:
        raise ProtocolError(f"{where}: the public key is invalid: {error}") from None


# -- vectors ---------------------------------------------------------------------------------------
def elements(vector: _native.CiphertextVector) -> list[bytes]:
    """The ciphertexts of a vector as big-endian integers."""
    return [vector.element_bytes(i) for i in range(len(vector))]


def from_elements(items: list[bytes], key: _native.EncryptionKey) -> _native.CiphertextVector:
    """A vector of the given ciphertexts (big-endian integers) under ``key``."""
    return _native.CiphertextVector.from_elements(items, key)


def raw_plaintexts(values: list[int], n: int) -> list[bytes]:
    """Big-endian bytes of each value mod n (the input of ``encrypt_raw``)."""
    return [int_to_bytes(value % n) for value in values]


def parse_vector(
    data: Any, key: _native.EncryptionKey, where: str, length: int | None = None, *, raw_only: bool = False
) -> _native.CiphertextVector:
    """A peer's ciphertext vector from its bytes; ``length`` and the raw encoding checked when given."""
    if not isinstance(data, bytes):
        raise ProtocolError(f"{where}: expected ciphertext bytes, got {type(data).__name__}")
    try:
        vector = _native.CiphertextVector.from_bytes(data, key)
    except (ConfideError, ValueError) as error:
        raise ProtocolError(f"{where}: {error}") from None
    if (raw_only and vector.encoding != "raw") or (length is not None and len(vector) != length):
        raise ProtocolError(
            f"{where}: expected {length if length is not None else 'some'} "
            f"{'raw ' if raw_only else ''}ciphertexts, got {len(vector)} ({vector.encoding})"
        )
    return vector


def decrypt_centered(
    secret: _native.DecryptionKey, vector: _native.CiphertextVector, n: int, threads: int
) -> list[int]:
    """The plaintexts of ``vector`` as signed integers in (-n/2, n/2]."""
    return [centered(int.from_bytes(b, "big"), n) for b in gpu.decrypt_raw(secret, vector, threads)]


# -- masks ------------------------------------------------------------------------------------------
def positive_masks(count: int, bits: int) -> list[int]:
    """Uniform in [2^(bits-1), 2^bits): x + R stays positive for any |x| < 2^(bits-1)."""
    return [secrets.randbits(bits - 1) | (1 << (bits - 1)) for _ in range(count)]


def random_below(count: int, bits: int) -> list[int]:
    """``count`` uniform integers in [0, 2^bits) from the OS CSPRNG."""
    size = (bits + 7) // 8
    data = os.urandom(size * count)
    excess = size * 8 - bits
    return [int.from_bytes(data[i * size : (i + 1) * size], "little") >> excess for i in range(count)]


def unmask(values: list[int], masks: list[int], n: int, where: str) -> list[int]:
    """Signed ``v - R mod n``; a result beyond 2^(k/2) means a peer broke the protocol."""
    clear = [centered(v - r, n) for v, r in zip(values, masks, strict=True)]
    limit = 1 << (n.bit_length() // 2)
    if any(abs(c) >= limit for c in clear):
        raise ProtocolError(f"{where}: an unmasked value is out of range ({_BROKE})")
    return clear


def mask_vector(
    vector: _native.CiphertextVector,
    masks: list[int],
    encryptor: _native.EncryptionKey | _native.DecryptionKey,
    n: int,
    threads: int,
) -> _native.CiphertextVector:
    """[[x + R]]: adds a fresh encryption of the masks (which also re-randomizes)."""
    return vector.add(gpu.encrypt_raw(encryptor, raw_plaintexts(masks, n), "fixed_base", threads), threads)


# -- packing ----------------------------------------------------------------------------------------
def pack_fixed(values: Iterable[int], width: int) -> bytes:
    """Non-negative integers (Python or numpy) as ``width`` big-endian bytes each, concatenated."""
    return b"".join(int(v).to_bytes(width, "big") for v in values)


def unpack_fixed(data: Any, width: int, count: int, where: str) -> list[int]:
    """The inverse of :func:`pack_fixed` for a peer's bytes (``count`` values expected)."""
    if not isinstance(data, bytes) or len(data) != width * count:
        size = len(data) if isinstance(data, bytes) else type(data).__name__
        raise ProtocolError(f"{where}: expected {count} values of {width} bytes, got {size}")
    return [int.from_bytes(data[i * width : (i + 1) * width], "big") for i in range(count)]


def pack_slots(rows: list[list[int]], width: int) -> list[int]:
    """``sum_i v_i 2^(width i)`` per row (signed v_i allowed: a negative slot borrows from the next)."""
    out = []
    for row in rows:
        acc = 0
        for v in reversed(row):
            acc = (acc << width) + v
        out.append(acc)
    return out


def unpack_signed(value: int, width: int, slots: int, where: str) -> list[int]:
    """The signed slots of a :func:`pack_slots` integer; anything left over is a protocol error."""
    mask, half, full = (1 << width) - 1, 1 << (width - 1), 1 << width
    out = []
    for _ in range(slots):
        low = value & mask
        if low >= half:
            low -= full
        out.append(low)
        value = (value - low) >> width
    if value != 0:
        raise ProtocolError(f"{where}: a packed value overflowed its slots ({_BROKE})")
    return out


def unpack_unsigned(value: int, width: int, slots: int, where: str) -> list[int]:
    """The non-negative slots of a packed integer; a negative value or a carry out is a protocol error."""
    if value < 0:
        raise ProtocolError(f"{where}: a packed value is negative ({_BROKE})")
    mask = (1 << width) - 1
    out = []
    for _ in range(slots):
        out.append(value & mask)
        value >>= width
    if value:
        raise ProtocolError(f"{where}: a packed value overflowed its slots ({_BROKE})")
    return out


# -- encrypted dot products -------------------------------------------------------------------------
def _dot_u64_fallback(vector: _native.CiphertextVector, matrix: np.ndarray, threads: int) -> _native.CiphertextVector:
    """out[r] = prod_i c_i^(matrix[r, i]), for use while the native kernel is missing.

    Element-wise native scalar products, then a pairwise tree of native additions.
    """
    key = vector.encryption_key
    rows, length = matrix.shape
    scaled = from_elements(elements(vector) * rows, key).mul_scalar_i64(
        np.ascontiguousarray(matrix.reshape(-1).astype(np.int64)), threads
    )
    current = elements(scaled)
    one = b"\x01"  # the trivial encryption of 0: the identity of ciphertext products
    while length > 1:
        if length % 2:
            current = [x for r in range(rows) for x in (*current[r * length : (r + 1) * length], one)]
            length += 1
        half = length // 2
        left = [current[r * length + i] for r in range(rows) for i in range(half)]
        right = [current[r * length + half + i] for r in range(rows) for i in range(half)]
        current = elements(from_elements(left, key).add(from_elements(right, key), threads))
        length = half
    return from_elements(current, key)


def dot_u64(vector: _native.CiphertextVector, matrix: np.ndarray, threads: int) -> _native.CiphertextVector:
    """Encrypted ``matrix @ m`` for unsigned integer rows (one output per row)."""
    matrix = np.ascontiguousarray(matrix, dtype=np.uint64)
    if matrix.ndim != 2 or matrix.shape[1] != len(vector) or matrix.shape[0] < 1:
        raise InvalidParameterError(f"matrix must have shape (rows >= 1, {len(vector)}), got {matrix.shape}")
    bits = max(1, int(matrix.max()).bit_length()) if matrix.size else 1
    if getattr(_native.CiphertextVector, "dot_u64", None) is not None:
        return vector.dot_u64(matrix, bits, threads)
    if bits > 63:
        raise InvalidParameterError(f"matrix entries must be below 2^63 for the fallback, got {bits} bits")
    return _dot_u64_fallback(vector, matrix, threads)


def signed_dot(vector: _native.CiphertextVector, coefficients: np.ndarray, threads: int) -> _native.CiphertextVector:
    """One ciphertext of ``sum_i coefficients[i] m_i`` for signed int64 coefficients."""
    positive = np.where(coefficients > 0, coefficients, 0).astype(np.uint64)
    negative = np.where(coefficients < 0, -coefficients, 0).astype(np.uint64)
    parts = elements(dot_u64(vector, np.stack([positive, negative]), threads))
    key = vector.encryption_key
    return from_elements([parts[0]], key).add(from_elements([parts[1]], key).negate(threads), threads)
