"""Paillier keys, packed encryption and homomorphic sums over the Rust core.

The common path, a party encrypting its update and the parties decrypting the sum::

    import numpy as np
    from confide.crypto import BatchCryptCodec, DecryptionKey, decrypt_packed, encrypt_packed, sum_encrypted

    key = DecryptionKey.generate(2048)            # leader party; others import it
    codec = BatchCryptCodec(bits=16, max_parties=3, alpha=0.5)
    parts = [encrypt_packed(np.full(1000, 0.1, np.float32), codec, key) for _ in range(3)]
    total = sum_encrypted(parts)                  # what the aggregator computes
    decrypt_packed(total, key)                    # ~0.3 everywhere

Numbers enter and leave as numpy arrays; the native work runs with the GIL
released on ``threads`` threads (0 = one per core). Secret keys never appear in
``repr`` and cannot be pickled: :meth:`DecryptionKey.export_secret` is the one,
explicit way out. See docs/crypto.md for the math, the bounds and the threat model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from confide import _native
from confide.crypto import gpu
from confide.crypto.ints import int_to_bytes
from confide.errors import EncodingError, InvalidParameterError

__all__ = [
    "BatchCryptCodec",
    "DecryptionKey",
    "EncryptedVector",
    "EncryptionKey",
    "FLBoosterCodec",
    "ENGINE",
    "GMP_VERSION",
    "daciq_alpha_factor",
    "daciq_threshold",
    "decrypt_packed",
    "encrypt_packed",
    "sum_encrypted",
]

GMP_VERSION: str = _native.GMP_VERSION
#: The engine that runs modular arithmetic: "avx512-ifma" (8-lane AVX-512 IFMA) or "gmp".
#: Set CONFIDE_DISABLE_IFMA=1 before import to force "gmp".
ENGINE: str = _native.engine()
Randomizer = Literal["fixed_base", "classical"]


def _int_bytes(value: int, field: str) -> bytes:
    if not isinstance(value, int) or value < 0:
        raise InvalidParameterError(f"{field} must be a non-negative int, got {value!r}")
    return int_to_bytes(value)


class EncryptionKey:
    """A Paillier public key (g = n + 1, DJN fixed-base randomness)."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.EncryptionKey) -> None:
        self._native = native

    @property
    def bits(self) -> int:
        """Bit length of n."""
        return self._native.bits

    @property
    def key_id(self) -> str:
        """Hex key id: SHA-256(scheme, n, h_s) truncated to 16 bytes."""
        return self._native.key_id

    @property
    def n(self) -> int:
        """The public modulus n."""
        return int.from_bytes(self._native.n_bytes(), "big")

    @property
    def ciphertext_bytes(self) -> int:
        """Bytes per ciphertext on the wire (2k/8)."""
        return self._native.ciphertext_bytes

    def to_bytes(self) -> bytes:
        """Canonical wire bytes (algorithms.md §1.9)."""
        return self._native.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> EncryptionKey:
        """Parse and validate wire bytes (the key id must match n and h_s)."""
        return cls(_native.EncryptionKey.from_bytes(data))

    def precompute(self) -> int:
        """Build the fixed-base table now instead of at first use; returns its size in bytes."""
        return self._native.precompute()

    def encrypt(
        self, values: np.ndarray, *, randomizer: Randomizer = "fixed_base", threads: int = 0
    ) -> EncryptedVector:
        """Encrypt signed int64 values one per ciphertext (signed window |v| < n/3)."""
        return EncryptedVector(self._native.encrypt_i64(_as_int64(values), randomizer, threads))

    def encrypt_integers(
        self, plaintexts: list[int], *, randomizer: Randomizer = "fixed_base", threads: int = 0
    ) -> EncryptedVector:
        """Encrypt raw plaintexts 0 <= m < n given as Python ints (not a hot path)."""
        raw = [_int_bytes(m, "plaintexts") for m in plaintexts]
        return EncryptedVector(self._native.encrypt_raw(raw, randomizer, threads))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EncryptionKey) and self._native == other._native

    def __hash__(self) -> int:
        return hash(self._native)

    def __repr__(self) -> str:
        return f"EncryptionKey(bits={self.bits}, key_id={self.key_id})"

    def __reduce__(self):
        return (EncryptionKey.from_bytes, (self.to_bytes(),))


class DecryptionKey:
    """A Paillier private key. Never shown by ``repr`` and never pickled."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.DecryptionKey) -> None:
        self._native = native

    @classmethod
    def generate(cls, bits: int = 2048) -> DecryptionKey:
        """Generate a key pair from the OS CSPRNG; ``bits`` is 2048, 3072 or 4096."""
        return cls(_native.generate_keypair(bits))

    @classmethod
    def from_primes(cls, p: int, q: int, encryption_key: EncryptionKey | None = None) -> DecryptionKey:
        """Rebuild from p and q (for example a python-paillier key).

        Without ``encryption_key`` a fresh DJN element h_s is drawn, giving a new key id;
        ciphertexts made by anyone under n = p*q still decrypt.
        """
        native_public = encryption_key._native if encryption_key is not None else None
        return cls(_native.DecryptionKey.from_primes(_int_bytes(p, "p"), _int_bytes(q, "q"), native_public))

    @property
    def encryption_key(self) -> EncryptionKey:
        """The public half."""
        return EncryptionKey(self._native.encryption_key)

    def export_secret(self) -> bytes:
        """Explicit export of the secret key (public key, p, q). Protect these bytes."""
        return self._native.to_secret_bytes()

    @classmethod
    def import_secret(cls, data: bytes) -> DecryptionKey:
        """Inverse of :meth:`export_secret`."""
        return cls(_native.DecryptionKey.from_secret_bytes(data))

    def primes(self) -> tuple[int, int]:
        """Return the secret factors (p, q), for interoperability; handle as a secret."""
        p, q = self._native.primes_bytes()
        return int.from_bytes(p, "big"), int.from_bytes(q, "big")

    def precompute(self) -> int:
        """Build the CRT fixed-base tables now; returns their size in bytes."""
        return self._native.precompute()

    def encrypt(
        self, values: np.ndarray, *, randomizer: Randomizer = "fixed_base", threads: int = 0
    ) -> EncryptedVector:
        """Key-holder (CRT) encryption of signed int64 values, one per ciphertext."""
        return EncryptedVector(self._native.encrypt_i64(_as_int64(values), randomizer, threads))

    def encrypt_integers(
        self, plaintexts: list[int], *, randomizer: Randomizer = "fixed_base", threads: int = 0
    ) -> EncryptedVector:
        """Key-holder encryption of raw plaintexts 0 <= m < n."""
        raw = [_int_bytes(m, "plaintexts") for m in plaintexts]
        return EncryptedVector(self._native.encrypt_raw(raw, randomizer, threads))

    def decrypt(self, vector: EncryptedVector, *, threads: int = 0) -> np.ndarray:
        """Decrypt a raw vector to signed int64 values."""
        return self._native.decrypt_i64(_native_vector(vector), threads)

    def decrypt_integers(self, vector: EncryptedVector, *, threads: int = 0) -> list[int]:
        """Decrypt to raw plaintexts in [0, n) as Python ints."""
        return [int.from_bytes(b, "big") for b in self._native.decrypt_raw(_native_vector(vector), threads)]

    def __repr__(self) -> str:
        public = self._native.encryption_key
        return f"DecryptionKey(bits={public.bits}, key_id={public.key_id}, secret=<redacted>)"

    def __reduce__(self):
        raise TypeError("DecryptionKey cannot be pickled: use export_secret() and protect the bytes")


@dataclass(frozen=True)
class BatchCryptCodec:
    """BatchCrypt packing (algorithms.md §2).

    Parameters
    ----------
    bits : int (default: 16)
        Quantization width r, sign included (2..32).
    max_parties : int (default: 16)
        Number m of party vectors that will be summed; sets ceil(log2 m) carry bits.
    alpha : float (default: 1.0)
        Clipping threshold; use :func:`daciq_threshold` to pick it per layer.
    quantizer : {"exact_bound", "paper"} (default: "exact_bound")
        "exact_bound" scales by floor(Q/m)/alpha so a sum of m vectors never overflows;
        "paper" scales by Q/(m*alpha) as BatchCrypt's code does.
    seed : int or None (default: None)
        Seed of the stochastic rounding (reproducible runs); None draws one from the OS.
    """

    bits: int = 16
    max_parties: int = 16
    alpha: float = 1.0
    quantizer: Literal["exact_bound", "paper"] = "exact_bound"
    seed: int | None = None
    kind = "batchcrypt"

    def layout(self, key_bits: int = 2048) -> tuple[int, int]:
        """(slot bits, slots per ciphertext) for a key of ``key_bits`` bits."""
        return _native.codec_layout_of(self.kind, self.bits, self.max_parties, self.alpha, key_bits, self.quantizer)


@dataclass(frozen=True)
class FLBoosterCodec:
    """FLBooster unsigned offset packing (algorithms.md §3), kept for comparison.

    Parameters
    ----------
    bits : int (default: 30)
        Quantization width r (1..48).
    max_parties : int (default: 4)
        Number p of summed vectors; sets ceil(log2 p) zero bits per slot.
    alpha : float (default: 1.0)
        Fixed clipping bound.
    """

    bits: int = 30
    max_parties: int = 4
    alpha: float = 1.0
    quantizer = "exact_bound"
    seed = None
    kind = "flbooster"

    def layout(self, key_bits: int = 2048) -> tuple[int, int]:
        """(slot bits, slots per ciphertext) for a key of ``key_bits`` bits."""
        return _native.codec_layout_of(self.kind, self.bits, self.max_parties, self.alpha, key_bits)


Codec = BatchCryptCodec | FLBoosterCodec


class EncryptedVector:
    """Ciphertexts under one key: raw (one value each) or packed by a codec."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.CiphertextVector) -> None:
        self._native = native

    @property
    def encoding(self) -> str:
        """``"raw"``, ``"batchcrypt"`` or ``"flbooster"``."""
        return self._native.encoding

    @property
    def length(self) -> int:
        """Number of values represented."""
        return self._native.length

    @property
    def num_ciphertexts(self) -> int:
        """Number of ciphertexts."""
        return len(self._native)

    @property
    def summed(self) -> int:
        """How many party vectors were summed into this one."""
        return self._native.summed

    @property
    def key_id(self) -> str:
        """Key id of the encryption key."""
        return self._native.key_id

    @property
    def encryption_key(self) -> EncryptionKey:
        """The key the ciphertexts belong to."""
        return EncryptionKey(self._native.encryption_key)

    @property
    def rerandomized(self) -> bool:
        """Whether the ciphertexts were re-randomized after their last operation."""
        return self._native.rerandomized

    def __len__(self) -> int:
        return self.length

    def __add__(self, other: EncryptedVector) -> EncryptedVector:
        return sum_encrypted([self, other])

    def rerandomize(self, *, threads: int = 0) -> EncryptedVector:
        """Multiply every ciphertext by a fresh encryption of zero."""
        return EncryptedVector(self._native.rerandomize(threads))

    def negate(self, *, threads: int = 0) -> EncryptedVector:
        """Raw vectors only: [[-a]]."""
        return EncryptedVector(self._native.negate(threads))

    def mul_scalar(self, scalars: np.ndarray, *, threads: int = 0) -> EncryptedVector:
        """Raw vectors only: [[a_i * s_i]] for int64 scalars."""
        return EncryptedVector(self._native.mul_scalar_i64(_as_int64(scalars), threads))

    def add_plain(self, values: np.ndarray, *, threads: int = 0) -> EncryptedVector:
        """Raw vectors only: [[a_i + v_i]] for int64 values."""
        return EncryptedVector(self._native.add_plain_i64(_as_int64(values), threads))

    def histogram(self, bins: np.ndarray, rows: np.ndarray, n_bins: int, *, threads: int = 0) -> EncryptedVector:
        """Raw vectors only: per-feature bin sums (SecureBoost gradient histograms).

        ``bins`` is an (F, N) array of bin indices in [0, n_bins) with N = ``num_ciphertexts``;
        the result holds F * n_bins ciphertexts, feature-major: entry ``f * n_bins + b`` is the
        sum of element r over the ``rows`` r with ``bins[f, r] == b`` (an empty bin is the
        ciphertext 1, an encryption of 0). Re-randomize before sending it to the key holder,
        who knows the inputs.
        """
        return EncryptedVector(
            self._native.histogram(
                _as_unsigned(bins, np.uint8, "bins", 2), _as_unsigned(rows, np.uint32, "rows", 1), n_bins, threads
            )
        )

    def fold(self, width: int, per: int, *, threads: int = 0) -> EncryptedVector:
        """Raw vectors only: pack ``per`` consecutive ciphertexts into one, ``width`` bits a slot.

        Group j0..j(k-1) becomes sum_j m_j * 2**(width * j), the first value in the lowest slot;
        exact while every m_j < 2**width. ``per * width`` must be below the key size minus 1.
        """
        return EncryptedVector(self._native.fold(width, per, threads))

    def dot(self, matrix: np.ndarray, bits: int, *, threads: int = 0) -> EncryptedVector:
        """Raw vectors only: encrypted matrix-vector product with unsigned exponents.

        ``matrix`` is (F, N) with entries in [0, 2**bits), N = ``num_ciphertexts``; entry j of the
        result encrypts sum_i matrix[j, i] * m_i mod n (bucket method, far faster than scalars).
        """
        return EncryptedVector(self._native.dot_u64(_as_unsigned(matrix, np.uint64, "matrix", 2), bits, threads))

    def ciphertext(self, index: int) -> int:
        """Ciphertext ``index`` as a Python int (for interoperability)."""
        return int.from_bytes(self._native.element_bytes(index), "big")

    @classmethod
    def from_ciphertexts(cls, ciphertexts: list[int], key: EncryptionKey) -> EncryptedVector:
        """Build a raw vector from ciphertext integers (each checked 0 < c < n^2)."""
        return cls(
            _native.CiphertextVector.from_elements([_int_bytes(c, "ciphertexts") for c in ciphertexts], key._native)
        )

    def to_bytes(self) -> bytes:
        """Canonical wire bytes: header, codec parameters, big-endian ciphertexts."""
        return self._native.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, key: EncryptionKey) -> EncryptedVector:
        """Parse and validate wire bytes under ``key``."""
        return cls(_native.CiphertextVector.from_bytes(data, key._native))

    def __repr__(self) -> str:
        return (
            f"EncryptedVector(encoding={self.encoding}, length={self.length}, "
            f"ciphertexts={self.num_ciphertexts}, summed={self.summed}, key_id={self.key_id})"
        )


def encrypt_packed(
    values: np.ndarray, codec: Codec, key: EncryptionKey | DecryptionKey, *, threads: int = 0
) -> EncryptedVector:
    """Clip, quantize, pack and encrypt a float vector.

    With a :class:`DecryptionKey` (every party holds the shared key in ``paillier`` mode)
    the faster CRT encryption runs; with an :class:`EncryptionKey` the public-key path.
    """
    array = np.asarray(values)
    if array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float64)
    array = np.ascontiguousarray(array.reshape(-1))
    native = key._native
    holder = isinstance(key, DecryptionKey)
    public = native.encryption_key if holder else native
    _, slots = _native.codec_layout_of(
        codec.kind, codec.bits, codec.max_parties, float(codec.alpha), public.bits, codec.quantizer
    )
    arguments = (array, codec.kind, codec.bits, codec.max_parties, float(codec.alpha), codec.quantizer, codec.seed)
    hook = gpu.encrypt_hook(native, holder, -(-array.size // max(1, slots)))
    if hook is not None:
        try:
            return EncryptedVector(native.encrypt_packed(*arguments, threads, hook))
        except gpu.GpuUnavailable as exc:  # named in the report, then the CPU engine runs the batch
            gpu.note_fallback(str(exc))
    return EncryptedVector(native.encrypt_packed(*arguments, threads))


def sum_encrypted(vectors: list[EncryptedVector], *, threads: int = 0) -> EncryptedVector:
    """Homomorphic sum (ciphertext products mod n^2) of vectors under one key and codec."""
    if not vectors:
        raise InvalidParameterError("vectors must hold at least one EncryptedVector, got 0")
    return EncryptedVector(_native.CiphertextVector.sum([_native_vector(v) for v in vectors], threads))


def decrypt_packed(
    vector: EncryptedVector, key: DecryptionKey, *, threads: int = 0, return_overflow: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Decrypt, unpack and dequantize a (summed) packed vector to float64 sums.

    Overflow positions are sums outside the code range [-Q, Q]. With the default
    "exact_bound" quantizer that cannot happen for honest parties, so it raises
    :class:`EncodingError` unless ``return_overflow`` asks for the positions instead.
    """
    native_vector = _native_vector(vector)
    hook = gpu.decrypt_hook(key._native, len(native_vector))
    values = None
    if hook is not None:
        try:
            values, overflow = key._native.decrypt_packed(native_vector, threads, hook)
        except gpu.GpuUnavailable as exc:
            gpu.note_fallback(str(exc))
    if values is None:
        values, overflow = key._native.decrypt_packed(native_vector, threads)
    if return_overflow:
        return values, overflow
    if overflow.size and vector._native.quantizer == "exact_bound":
        raise EncodingError(
            f"{overflow.size} packed sums left the code range (first at index {int(overflow[0])}): "
            f"more parties than max_parties, or a faulty party"
        )
    return values


def daciq_threshold(
    maxima: np.ndarray,
    minima: np.ndarray,
    elements: int,
    *,
    bits: int = 16,
    parties: int | None = None,
    effective_bits: bool = True,
) -> float:
    """DACIQ clipping threshold for one layer (algorithms.md §2.6).

    ``maxima``/``minima`` hold each party's max and min of the layer, ``elements`` its size.
    """
    maxima = np.ascontiguousarray(maxima, dtype=np.float64).reshape(-1)
    minima = np.ascontiguousarray(minima, dtype=np.float64).reshape(-1)
    return _native.daciq_threshold(
        maxima, minima, elements, bits, parties if parties is not None else maxima.size, effective_bits
    )


def daciq_alpha_factor(bits: int) -> float:
    """A(b) of the corrected dACIQ table (sigma = 1)."""
    return _native.daciq_alpha_factor(bits)


def _as_int64(values: np.ndarray) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind not in "iu":
        raise InvalidParameterError(f"values must be an integer numpy array, got dtype {array.dtype}")
    return np.ascontiguousarray(array.reshape(-1), dtype=np.int64)


def _as_unsigned(values: np.ndarray, dtype: type, field: str, ndim: int) -> np.ndarray:
    """A C-contiguous array of ``dtype``; integer input only, range-checked before the cast."""
    array = np.asarray(values)
    if array.ndim != ndim:
        raise InvalidParameterError(f"{field} must be a {ndim}-dimensional array, got shape {array.shape}")
    if array.dtype == dtype:
        return np.ascontiguousarray(array)
    if array.dtype.kind not in "iu":
        raise InvalidParameterError(f"{field} must be an integer numpy array, got dtype {array.dtype}")
    if array.size and (int(array.min()) < 0 or int(array.max()) > np.iinfo(dtype).max):
        raise InvalidParameterError(f"{field} values must be in [0, {np.iinfo(dtype).max}]")
    return np.ascontiguousarray(array, dtype=dtype)


def _native_vector(vector: EncryptedVector) -> _native.CiphertextVector:
    if not isinstance(vector, EncryptedVector):
        raise InvalidParameterError(f"expected an EncryptedVector, got {type(vector).__name__}")
    return vector._native
