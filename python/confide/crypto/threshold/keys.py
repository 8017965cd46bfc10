"""Threshold keys (public and a party's share), the protocol's constants and its message encodings."""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import gmpy2

from confide.crypto import EncryptionKey
from confide.crypto.ints import int_to_bytes
from confide.errors import ProtocolError

#: Statistical security parameter (bits) of masks, integer sharing and proofs.
KAPPA = 128
#: Biprimality repetitions (error <= 2^-BIPRIME_TESTS for a non-biprime N).
BIPRIME_TESTS = 40
#: Candidate batches before the key generation gives up (expected: ~126,000 candidates at k = 2048).
MAX_MODULUS_BATCHES = 2000
#: Public N are trial-divided by the odd primes below this bound before the biprimality test.
TRIAL_BOUND = 4096
PRIMORIAL = math.prod(p for p in range(3, TRIAL_BOUND) if gmpy2.is_prime(p))
#: Then those left by the primes from TRIAL_BOUND to this one: 0.3 ms a modulus against the
#: biprimality test's 2048-bit exponentiation (~6 ms a party), and it drops 56% of the survivors.
WIDE_TRIAL_BOUND = 1 << 18
WIDE_PRIMORIAL = gmpy2.primorial(WIDE_TRIAL_BOUND) // gmpy2.primorial(TRIAL_BOUND)
DOMAIN = b"confide-threshold-paillier-v1"
# --------------------------------------------------------------------------- encoding


def value_bytes(value_bits: int) -> int:
    """Bytes of an integer of ``value_bits`` bits."""
    return (value_bits + 7) // 8


def pack_signed(values: Iterable[int]) -> bytes:
    """Signed integers of any size as bytes: a count, then per value its sign, length and magnitude."""
    out = []
    for value in values:
        value = int(value)
        raw = int_to_bytes(abs(value))
        out.append(struct.pack("<BI", value < 0, len(raw)) + raw)
    return struct.pack("<I", len(out)) + b"".join(out)


def unpack_signed(data: bytes, what: str) -> list[int]:
    """The inverse of :func:`pack_signed` for a peer's bytes; anything malformed is a protocol error."""
    try:
        (count,) = struct.unpack_from("<I", data, 0)
        offset, out = 4, []
        for _ in range(count):
            negative, length = struct.unpack_from("<BI", data, offset)
            offset += 5
            if offset + length > len(data):
                raise ProtocolError(f"{what}: truncated")
            value = int.from_bytes(data[offset : offset + length], "big")
            out.append(-value if negative else value)
            offset += length
    except struct.error:
        raise ProtocolError(f"{what}: truncated") from None
    if offset != len(data):
        raise ProtocolError(f"{what}: {len(data) - offset} trailing bytes")
    return out


def public_coin(label: bytes, *parts: int | bytes, bits: int) -> int:
    """Public-coin integer of ``bits`` bits from SHAKE-256 over the label and parts."""
    h = hashlib.shake_256(DOMAIN + label)
    for part in parts:
        data = part if isinstance(part, bytes) else int_to_bytes(int(part))
        h.update(struct.pack("<I", len(data)) + data)
    return int.from_bytes(h.digest((bits + 7) // 8), "big") >> (-bits % 8)


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class ThresholdPublicKey:
    """What every party (and the aggregator) may know: N, the threshold, theta and the proof keys."""

    n: int
    parties: int
    threshold: int
    theta: int
    v: int
    verification_keys: tuple[int, ...]
    dealer: bool = False

    @property
    def delta(self) -> int:
        """Delta = m!."""
        return math.factorial(self.parties)

    @property
    def n_squared(self) -> int:
        """N^2."""
        return self.n * self.n

    @property
    def bits(self) -> int:
        """Modulus size."""
        return self.n.bit_length()

    def encryption_key(self) -> EncryptionKey:
        """The Paillier public key (g = N + 1, DJN randomizer base from a public coin)."""
        return _public_key(self.n)

    def to_bytes(self) -> bytes:
        """Wire form (every party derives the same from the key generation; kept for checkpoints)."""
        head = struct.pack("<HHB", self.parties, self.threshold, self.dealer)
        return head + pack_signed([self.n, self.theta, self.v, *self.verification_keys])

    @classmethod
    def from_bytes(cls, data: bytes) -> ThresholdPublicKey:
        """Inverse of :meth:`to_bytes`."""
        if len(data) < 5:
            raise ProtocolError("threshold public key: truncated")
        parties, threshold, dealer = struct.unpack_from("<HHB", data, 0)
        values = unpack_signed(data[5:], "threshold public key")
        if len(values) != 3 + parties:
            raise ProtocolError(f"threshold public key: {len(values) - 3} verification keys for {parties} parties")
        n, theta, v, *keys = values
        return cls(n, parties, threshold, theta, v, tuple(keys), bool(dealer))


@dataclass(frozen=True)
class ThresholdKey:
    """One party's share d_j of the decryption exponent, with the public key."""

    public: ThresholdPublicKey
    index: int
    share: int

    def __repr__(self) -> str:
        return f"ThresholdKey(index={self.index}, t={self.public.threshold}, m={self.public.parties}, share=<redacted>)"

    def __reduce__(self):
        raise TypeError("ThresholdKey cannot be pickled: it holds a share of the decryption key")


def _public_key(n: int) -> EncryptionKey:
    """Native public key for N: h = -x^2 mod N (x a public coin), h_s = h^N mod N^2."""
    bits = n.bit_length()
    width = value_bytes(bits)
    n2 = n * n
    counter = 0
    while True:
        x = public_coin(b"h", n, counter, bits=bits + 64) % n
        if x > 1 and math.gcd(x, n) == 1:
            break
        counter += 1
    h = (-x * x) % n
    h_s = int(gmpy2.powmod(h, n, n2))
    scheme = b"paillier-djn-v1"
    body = scheme + n.to_bytes(width, "big") + h_s.to_bytes(2 * width, "big")
    key_id = hashlib.sha256(body).digest()[:16]
    data = (
        bytes([len(scheme)])
        + scheme
        + struct.pack(">H", bits)
        + n.to_bytes(width, "big")
        + h_s.to_bytes(2 * width, "big")
        + struct.pack(">H", (bits + 1) // 2)
        + key_id
    )
    return EncryptionKey.from_bytes(data)
