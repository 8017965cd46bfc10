"""Threshold Paillier with distributed key generation: t of m parties decrypt, no one holds the key.

The key is made by the m parties together (no dealer), as a protocol over an abstract
:class:`Channel`, so the same code runs in a test harness and over the aggregator's relay.
Numbered steps follow algorithms.md §1.12; every step is semi-honest (a party that deviates
during key generation is caught only where a check below says so), and every partial
decryption after it carries a proof, so a party that lies at decryption time is named.

1. **Modulus** (Boneh-Franklin, batched). Each party draws additive shares p_i, q_i of K
   candidate pairs (party 1's shares are 3 mod 4 plus a public offset that fixes the top two
   bits, the others' 0 mod 4, so p = sum p_i is 3 mod 4 and N = pq has exactly k bits). BGW over
   a prime field P > 2^k with polynomials of degree d = floor((m-1)/2), plus a random sharing of
   zero of degree 2d, reveals N = pq and nothing else (honest majority: privacy against d
   colluders). Public N are trial-divided by the primes below 4096; survivors get the
   Boneh-Franklin biprimality test with public-coin g (Jacobi(g|N) = 1): party 1 publishes
   g^((N - p_1 - q_1 + 1)/4), the others g^((p_i + q_i)/4), and N passes when the quotient is
   +-1 mod N, 40 times. The expected number of candidates is about (ln 2^(k/2) / 2)^2: ~126,000
   at k = 2048 (no distributed sieving yet), which is why candidates travel in batches.
2. **Secret** s = beta * phi(N), with phi(N) = N - sum(p_i + q_i) + 1 additively shared and
   beta = sum beta_i random: the cross products beta_i * phi_j are computed pairwise with a
   throw-away Paillier key of party i (Gilboa-style: j answers E_i(beta_i)^phi_j * E_i(r) and
   keeps -r, r statistically hiding by 128 bits), giving integer additive shares s_i of s.
   theta = s mod N is revealed through pairwise-cancelling masks, so only the sum is seen.
3. **Threshold sharing.** Each party shares s_i with an integer polynomial of degree t-1
   (coefficients 128 bits above the secret's size) and publishes Feldman commitments
   v^coefficient mod N^2 for a public-coin square v. A received share that does not match its
   commitments names the sender. d_j = sum_i f_i(j); every verification key
   v_j = v^(Delta * d_j) (Delta = m!) is computed from the commitments, so no party can lie
   about its own.

Decryption of c: party j sends c_j = c^(2 Delta d_j) mod N^2 with a proof (Fiat-Shamir,
batched over a vector with 128-bit random coefficients) that log_(C^4) C_j^2 = log_v v_j; any t
partials combine with integer Lagrange coefficients lambda_j = Delta * prod j'/(j'-j) to
c^(4 Delta^2 s) = 1 + 4 Delta^2 theta m N mod N^2, so m = L(.) / (4 Delta^2 theta) mod N.

Costs on this 2-core AVX-512 IFMA host (2048-bit N): a partial decryption raises a ciphertext
to a ~4,400-bit exponent mod N^2 (no CRT: nobody knows p and q), eight ciphertexts per
IFMA exponentiation: 1.6 ms per ciphertext against 0.24 ms for the CRT decryption of
``paillier``, 1.9 ms with the proof (Pippenger's multi-exponentiation for the batch weights);
checking a proof costs 0.3 ms per ciphertext. benchmarks/threshold_bench.py measures rounds
and key generation.
"""

from __future__ import annotations

import hashlib
import math
import queue
import secrets
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import gmpy2
import numpy as np

from confide import _native
from confide.crypto import EncryptedVector, EncryptionKey, gpu
from confide.crypto.ints import int_to_bytes
from confide.errors import EncodingError, InvalidParameterError, ProtocolError

__all__ = [
    "Channel",
    "CheatingPartyError",
    "LocalChannels",
    "PartialDecryption",
    "ThresholdKey",
    "ThresholdPublicKey",
    "check_threshold",
    "combine_partials",
    "deal_threshold_keys",
    "decrypt_packed_threshold",
    "encrypt_integers",
    "generate_locally",
    "generate_threshold_key",
    "partial_decrypt",
    "verify_partial",
]

#: Statistical security parameter (bits) of masks, integer sharing and proofs.
KAPPA = 128
#: Biprimality repetitions (error <= 2^-BIPRIME_TESTS for a non-biprime N).
BIPRIME_TESTS = 40
#: Candidate batches before the key generation gives up (expected: ~126,000 candidates at k = 2048).
MAX_MODULUS_BATCHES = 2000
#: Public N are trial-divided by the primes below this bound before the biprimality test.
TRIAL_BOUND = 4096
_PRIMORIAL = math.prod(p for p in range(3, TRIAL_BOUND) if gmpy2.is_prime(p))
_DOMAIN = b"confide-threshold-paillier-v1"


class CheatingPartyError(ProtocolError):
    """A party's message failed its check (share vs commitment, or partial decryption proof)."""

    def __init__(self, party: int | str, detail: str) -> None:
        super().__init__(f"party {party}: {detail}")
        self.party = party
        self.detail = detail

    def __reduce__(self):
        return (type(self), (self.party, self.detail))


class Channel(Protocol):
    """How one party of the key generation reaches the others (1-based indices)."""

    index: int
    parties: int

    def send(self, to: int, tag: str, payload: bytes) -> None:
        """A payload only party ``to`` can read."""

    def broadcast(self, tag: str, payload: bytes) -> None:
        """The same payload to every other party."""

    def recv(self, sender: int, tag: str) -> bytes:
        """What ``sender`` sent (or broadcast) under ``tag``."""


class LocalChannels:
    """Channels between m parties in one process (threads): simulations, tests and benchmarks.

    ``received[j]`` lists every payload party j received, in order: party j's view.
    """

    def __init__(self, parties: int, timeout: float = 3600.0) -> None:
        self.parties = parties
        self.timeout = timeout
        self.received: dict[int, list[bytes]] = {i: [] for i in range(1, parties + 1)}
        self._boxes: dict = {}
        self._lock = threading.Lock()

    def _box(self, key) -> queue.Queue:
        with self._lock:
            return self._boxes.setdefault(key, queue.Queue())

    def channel(self, index: int) -> _LocalChannel:
        """Party ``index``'s end (1-based)."""
        return _LocalChannel(self, index)


class _LocalChannel:
    def __init__(self, hub: LocalChannels, index: int) -> None:
        self.hub, self.index, self.parties = hub, index, hub.parties

    def send(self, to: int, tag: str, payload: bytes) -> None:
        self.hub._box((to, self.index, tag)).put(payload)

    def broadcast(self, tag: str, payload: bytes) -> None:
        for to in range(1, self.parties + 1):
            if to != self.index:
                self.send(to, tag, payload)

    def recv(self, sender: int, tag: str) -> bytes:
        try:
            payload = self.hub._box((self.index, sender, tag)).get(timeout=self.hub.timeout)
        except queue.Empty:
            raise ProtocolError(f"party {sender} sent nothing under {tag!r} within {self.hub.timeout:g} s") from None
        self.hub.received[self.index].append(payload)
        return payload


def generate_locally(parties: int, threshold: int, *, bits: int = 2048, batch: int = 2048) -> list[ThresholdKey]:
    """Every party's key from one run of the distributed generation, each party in a thread."""
    hub = LocalChannels(parties)
    keys: dict[int, ThresholdKey] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            keys[index] = generate_threshold_key(hub.channel(index), bits=bits, threshold=threshold, batch=batch)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(1, parties + 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [keys[i] for i in range(1, parties + 1)]


def check_threshold(parties: int, threshold: int, *, dealer: bool = False) -> None:
    """Clear errors for a (t, m) the protocol cannot run."""
    if not isinstance(parties, int) or parties < 2:
        raise InvalidParameterError(f"parties must be at least 2, got {parties}")
    if not isinstance(threshold, int) or threshold < 2:
        raise InvalidParameterError(
            f"threshold must be at least 2 (with 1 any single party could decrypt alone), got {threshold}"
        )
    if threshold > parties:
        raise InvalidParameterError(f"threshold ({threshold}) must not exceed the number of parties ({parties})")
    if not dealer and threshold > (parties + 1) // 2:
        raise InvalidParameterError(
            f"threshold ({threshold}) must be at most (parties + 1) // 2 = {(parties + 1) // 2} for key generation "
            f"without a dealer: the modulus is computed by BGW, which needs an honest majority, so with "
            f"{parties} parties it hides p and q from at most {(parties - 1) // 2} colluders"
        )


# --------------------------------------------------------------------------- encoding


def _width(value_bits: int) -> int:
    return (value_bits + 7) // 8


def _pack(values: Iterable[int], width: int) -> bytes:
    return b"".join(int(v).to_bytes(width, "big") for v in values)


def _unpack(data: bytes, width: int, count: int, what: str) -> list[int]:
    if len(data) != width * count:
        raise ProtocolError(f"{what}: expected {count} values of {width} bytes, got {len(data)} bytes")
    return [int.from_bytes(data[i * width : (i + 1) * width], "big") for i in range(count)]


def _pack_signed(values: Iterable[int]) -> bytes:
    out = []
    for value in values:
        value = int(value)
        raw = int_to_bytes(abs(value))
        out.append(struct.pack("<BI", value < 0, len(raw)) + raw)
    return struct.pack("<I", len(out)) + b"".join(out)


def _unpack_signed(data: bytes, what: str) -> list[int]:
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


def _coin(label: bytes, *parts: int | bytes, bits: int) -> int:
    """Public-coin integer of ``bits`` bits from SHAKE-256 over the label and parts."""
    h = hashlib.shake_256(_DOMAIN + label)
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
        return head + _pack_signed([self.n, self.theta, self.v, *self.verification_keys])

    @classmethod
    def from_bytes(cls, data: bytes) -> ThresholdPublicKey:
        """Inverse of :meth:`to_bytes`."""
        if len(data) < 5:
            raise ProtocolError("threshold public key: truncated")
        parties, threshold, dealer = struct.unpack_from("<HHB", data, 0)
        values = _unpack_signed(data[5:], "threshold public key")
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
    width = _width(bits)
    n2 = n * n
    counter = 0
    while True:
        x = _coin(b"h", n, counter, bits=bits + 64) % n
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


# --------------------------------------------------------------------------- key generation


def _field_prime(bits: int) -> int:
    return int(gmpy2.next_prime(1 << (bits + 8)))


def _lagrange_at_zero(points: Sequence[int], prime: int) -> list[int]:
    out = []
    for j in points:
        num, den = 1, 1
        for k in points:
            if k != j:
                num = num * k % prime
                den = den * (k - j) % prime
        out.append(num * pow(den, -1, prime) % prime)
    return out


def _shamir(secret: int, degree: int, prime: int, points: int) -> list[int]:
    """Shares f(1..points) of a random polynomial of ``degree`` with f(0) = secret (mod prime)."""
    coefficients = [secret] + [secrets.randbelow(prime) for _ in range(degree)]
    out = []
    for x in range(1, points + 1):
        value = 0
        for c in reversed(coefficients):
            value = (value * x + c) % prime
        out.append(value)
    return out


def _candidate_shares(index: int, parties: int, half: int, count: int) -> tuple[list[int], list[int]]:
    """Additive shares of ``count`` candidate p (or q): 3 mod 4 in sum, top two bits fixed by party 1."""
    span = (1 << (half - 2)) // parties // 4
    offset = (1 << (half - 1)) + (1 << (half - 2))

    def draw() -> int:
        share = 4 * secrets.randbelow(span)
        return share + offset + 3 if index == 1 else share

    return [draw() for _ in range(count)], [draw() for _ in range(count)]


def _biprime_base(n: int, test: int) -> int:
    counter = 0
    while True:
        g = _coin(b"biprime", n, test, counter, bits=n.bit_length() + 64) % n
        if g > 1 and gmpy2.jacobi(g, n) == 1:
            return g
        counter += 1


def _biprime_value(index: int, n: int, p: int, q: int, g: int) -> int:
    exponent = (n - p - q + 1) // 4 if index == 1 else (p + q) // 4
    return int(gmpy2.powmod(g, exponent, n))


def _biprime_passes(values: Sequence[int], n: int) -> bool:
    rest = 1
    for value in values[1:]:
        rest = rest * value % n
    if math.gcd(rest, n) != 1:
        return False
    quotient = values[0] * pow(rest, -1, n) % n
    return quotient in (1, n - 1)


def _find_modulus(channel: Channel, bits: int, batch: int) -> tuple[int, int, int]:
    """(N, p_i, q_i): step 1 of the module docstring."""
    me, m = channel.index, channel.parties
    degree = (m - 1) // 2
    prime = _field_prime(bits)
    width = _width(prime.bit_length())
    nwidth = _width(bits)
    lagrange = _lagrange_at_zero(list(range(1, m + 1)), prime)
    others = [j for j in range(1, m + 1) if j != me]
    round_number = 0
    while True:
        round_number += 1
        if round_number > MAX_MODULUS_BATCHES:
            raise ProtocolError(
                f"no biprime modulus after {MAX_MODULUS_BATCHES} batches of {batch} candidates (about "
                f"{30 * 2048 // batch} are expected at 2048 bits): a party is deviating from the key generation"
            )
        tag = f"dkg/modulus/{round_number}"
        ps, qs = _candidate_shares(me, m, bits // 2, batch)
        outgoing: dict[int, list[int]] = {j: [] for j in range(1, m + 1)}
        for p, q in zip(ps, qs, strict=True):
            sp = _shamir(p, degree, prime, m)
            sq = _shamir(q, degree, prime, m)
            sz = _shamir(0, 2 * degree, prime, m)
            for j in range(1, m + 1):
                outgoing[j] += (sp[j - 1], sq[j - 1], sz[j - 1])
        for j in others:
            channel.send(j, tag + "/shares", _pack(outgoing[j], width))
        received = {me: outgoing[me]}
        for j in others:
            received[j] = _unpack(channel.recv(j, tag + "/shares"), width, 3 * batch, f"modulus shares from {j}")
        products = []
        for k in range(batch):
            sp = sum(received[j][3 * k] for j in received) % prime
            sq = sum(received[j][3 * k + 1] for j in received) % prime
            sz = sum(received[j][3 * k + 2] for j in received) % prime
            products.append((sp * sq + sz) % prime)
        channel.broadcast(tag + "/products", _pack(products, width))
        all_products = {me: products}
        for j in others:
            all_products[j] = _unpack(channel.recv(j, tag + "/products"), width, batch, f"modulus products from {j}")
        moduli = []
        for k in range(batch):
            n = sum(lagrange[j - 1] * all_products[j][k] for j in range(1, m + 1)) % prime
            if n.bit_length() != bits:
                raise ProtocolError(f"candidate modulus {k} of round {round_number} has {n.bit_length()} bits")
            moduli.append(n)
        survivors = [k for k, n in enumerate(moduli) if math.gcd(n, _PRIMORIAL) == 1]
        for tests in (1, BIPRIME_TESTS):
            if not survivors:
                break
            first = 0 if tests == 1 else 1
            mine = []
            for k in survivors:
                for test in range(first, tests):
                    g = _biprime_base(moduli[k], test)
                    mine.append(_biprime_value(me, moduli[k], ps[k], qs[k], g))
            step = f"{tag}/biprime/{tests}"
            channel.broadcast(step, _pack(mine, nwidth))
            count = len(survivors) * (tests - first)
            values = {me: mine}
            for j in others:
                values[j] = _unpack(channel.recv(j, step), nwidth, count, f"biprimality values from {j}")
            passed = []
            for position, k in enumerate(survivors):
                ok = all(
                    _biprime_passes(
                        [values[j][position * (tests - first) + r] for j in range(1, m + 1)],
                        moduli[k],
                    )
                    for r in range(tests - first)
                )
                if ok:
                    passed.append(k)
            survivors = passed
        if survivors:
            k = survivors[0]
            return moduli[k], ps[k], qs[k]


def _temporary_paillier(bits: int) -> tuple[int, int]:
    """(n, lambda) of a throw-away Paillier key for the pairwise products (step 2)."""
    while True:
        p = int(gmpy2.next_prime(secrets.randbits(bits // 2) | (1 << (bits // 2 - 1))))
        q = int(gmpy2.next_prime(secrets.randbits(bits // 2) | (1 << (bits // 2 - 1))))
        n = p * q
        if p != q and math.gcd(n, (p - 1) * (q - 1)) == 1:
            return n, (p - 1) * (q - 1)


def _encrypt_temporary(n: int, value: int) -> int:
    n2 = n * n
    while True:
        r = secrets.randbelow(n)
        if r > 1 and math.gcd(r, n) == 1:
            break
    return (1 + value * n) * int(gmpy2.powmod(r, n, n2)) % n2


def _share_secret(channel: Channel, bits: int, n: int, p: int, q: int) -> tuple[int, int]:
    """(s_i, theta): step 2 of the module docstring."""
    me, m = channel.index, channel.parties
    others = [j for j in range(1, m + 1) if j != me]
    phi = n - p - q + 1 if me == 1 else -(p + q)
    beta = secrets.randbelow(n)
    product_bits = 2 * bits + 2
    temp_bits = product_bits + KAPPA + 64
    temp_n, temp_lambda = _temporary_paillier(temp_bits)
    temp_n2 = temp_n * temp_n
    channel.broadcast("dkg/secret/offer", _pack_signed([temp_n, _encrypt_temporary(temp_n, beta)]))
    masks_out = {j: secrets.randbelow(n) for j in others}
    kept = 0
    for j in others:
        offer = _unpack_signed(channel.recv(j, "dkg/secret/offer"), f"product offer from {j}")
        if len(offer) != 2 or offer[0].bit_length() < temp_bits - 2:
            raise CheatingPartyError(j, "product offer must hold a large enough modulus and one ciphertext")
        their_n, ciphertext = offer
        their_n2 = their_n * their_n
        mask = secrets.randbits(product_bits + KAPPA) | (1 << (product_bits + KAPPA))
        kept -= mask
        answer = int(gmpy2.powmod(ciphertext, phi, their_n2)) * _encrypt_temporary(their_n, mask) % their_n2
        channel.send(j, "dkg/secret/answer", _pack_signed([answer, masks_out[j]]))
    share = beta * phi + kept
    masks_in = 0
    for j in others:
        answer = _unpack_signed(channel.recv(j, "dkg/secret/answer"), f"product answer from {j}")
        if len(answer) != 2:
            raise CheatingPartyError(j, "product answer must hold one ciphertext and one mask")
        plain = (int(gmpy2.powmod(answer[0], temp_lambda, temp_n2)) - 1) // temp_n
        plain = plain * pow(temp_lambda, -1, temp_n) % temp_n
        share += plain
        masks_in += answer[1]
    masked = (share + sum(masks_out.values()) - masks_in) % n
    channel.broadcast("dkg/secret/theta", _pack_signed([masked]))
    theta = masked
    for j in others:
        values = _unpack_signed(channel.recv(j, "dkg/secret/theta"), f"theta part from {j}")
        if len(values) != 1:
            raise CheatingPartyError(j, "theta part must be one value")
        theta += values[0]
    theta %= n
    if math.gcd(theta, n) != 1:
        raise ProtocolError("theta shares a factor with N: start the key generation again")
    del temp_lambda
    return share, theta


def _share_threshold(channel: Channel, n: int, share: int, threshold: int) -> tuple[int, int, tuple[int, ...]]:
    """(d_i, v, verification keys): step 3 of the module docstring."""
    me, m = channel.index, channel.parties
    others = [j for j in range(1, m + 1) if j != me]
    n2 = n * n
    delta = math.factorial(m)
    v = pow(_coin(b"v", n, bits=2 * n.bit_length() + 64) % n2, 2, n2)
    secret_bits = 2 * n.bit_length() + KAPPA + 4 + m.bit_length()
    coefficient_bits = secret_bits + KAPPA + 2 * delta.bit_length()
    coefficients = [share] + [secrets.randbits(coefficient_bits) for _ in range(threshold - 1)]
    commitments = [int(gmpy2.powmod(v, c, n2)) for c in coefficients]
    channel.broadcast("dkg/threshold/commitments", _pack_signed(commitments))

    def evaluate(x: int) -> int:
        value = 0
        for c in reversed(coefficients):
            value = value * x + c
        return value

    for j in others:
        channel.send(j, "dkg/threshold/share", _pack_signed([evaluate(j)]))
    all_commitments = {me: commitments}
    total = evaluate(me)
    for j in others:
        theirs = _unpack_signed(channel.recv(j, "dkg/threshold/commitments"), f"commitments from {j}")
        if len(theirs) != threshold:
            raise CheatingPartyError(j, f"sent {len(theirs)} commitments, expected {threshold}")
        all_commitments[j] = theirs
        received = _unpack_signed(channel.recv(j, "dkg/threshold/share"), f"threshold share from {j}")
        if len(received) != 1:
            raise CheatingPartyError(j, "threshold share must be one value")
        if int(gmpy2.powmod(v, received[0], n2)) != _committed(theirs, me, n2):
            raise CheatingPartyError(j, "its threshold share does not match its commitments")
        total += received[0]
    keys = []
    for index in range(1, m + 1):
        value = 1
        for j in range(1, m + 1):
            value = value * _committed(all_commitments[j], index, n2) % n2
        keys.append(int(gmpy2.powmod(value, delta, n2)))
    return total, v, tuple(keys)


def _committed(commitments: Sequence[int], x: int, n2: int) -> int:
    value = 1
    for power, commitment in enumerate(commitments):
        value = value * int(gmpy2.powmod(commitment, x**power, n2)) % n2
    return value


def generate_threshold_key(channel: Channel, *, bits: int = 2048, threshold: int, batch: int = 2048) -> ThresholdKey:
    """Run the whole key generation as party ``channel.index`` of ``channel.parties``."""
    check_threshold(channel.parties, threshold)
    if bits % 2 or bits < 64:
        raise InvalidParameterError(f"bits must be even and at least 64, got {bits}")
    n, p, q = _find_modulus(channel, bits, batch)
    share, theta = _share_secret(channel, bits, n, p, q)
    del p, q
    d, v, keys = _share_threshold(channel, n, share, threshold)
    public = ThresholdPublicKey(n, channel.parties, threshold, theta, v, keys)
    return ThresholdKey(public, channel.index, d)


def deal_threshold_keys(parties: int, threshold: int, *, bits: int = 2048) -> list[ThresholdKey]:
    """Every party's share, made by one dealer who sees p and q (a fallback, labelled ``dealer``).

    The dealer knows the whole key while it runs; the distributed generation never puts it
    anywhere. Same sharing, proofs and decryption as :func:`generate_threshold_key`.
    """
    check_threshold(parties, threshold, dealer=True)
    if bits % 2 or bits < 64:
        raise InvalidParameterError(f"bits must be even and at least 64, got {bits}")
    while True:
        p = int(gmpy2.next_prime(secrets.randbits(bits // 2) | (3 << (bits // 2 - 2))))
        q = int(gmpy2.next_prime(secrets.randbits(bits // 2) | (3 << (bits // 2 - 2))))
        n = p * q
        if p != q and n.bit_length() == bits and math.gcd(n, (p - 1) * (q - 1)) == 1:
            break
    phi = (p - 1) * (q - 1)
    while True:
        beta = secrets.randbelow(n)
        theta = beta * phi % n
        if math.gcd(theta, n) == 1:
            break
    n2 = n * n
    delta = math.factorial(parties)
    v = pow(_coin(b"v", n, bits=2 * bits + 64) % n2, 2, n2)
    secret = beta * phi
    coefficient_bits = secret.bit_length() + KAPPA + 2 * delta.bit_length()
    coefficients = [secret] + [secrets.randbits(coefficient_bits) for _ in range(threshold - 1)]
    shares = [sum(c * x**power for power, c in enumerate(coefficients)) for x in range(1, parties + 1)]
    keys = tuple(int(gmpy2.powmod(v, delta * d, n2)) for d in shares)
    public = ThresholdPublicKey(n, parties, threshold, theta, v, keys, dealer=True)
    return [ThresholdKey(public, j, d) for j, d in enumerate(shares, start=1)]


def encrypt_integers(public: ThresholdPublicKey, values: Sequence[int]) -> list[int]:
    """Plain Paillier encryptions (g = N + 1) as integers, for small test keys."""
    return [_encrypt_temporary(public.n, int(value) % public.n) for value in values]


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
        width = _width(2 * n.bit_length())
        head = struct.pack("<HI", self.index, len(self.values))
        return head + _pack(self.values, width) + _pack_signed([self.challenge, self.response])

    @classmethod
    def from_bytes(cls, data: bytes, n: int) -> PartialDecryption:
        """Inverse of :meth:`to_bytes` (values are range-checked)."""
        width = _width(2 * n.bit_length())
        if len(data) < 6:
            raise ProtocolError("partial decryption: truncated")
        index, count = struct.unpack_from("<HI", data, 0)
        end = 6 + width * count
        values = _unpack(data[6:end], width, count, "partial decryption")
        n2 = n * n
        if any(not 0 < value < n2 for value in values):
            raise ProtocolError("partial decryption: a value is outside (0, N^2)")
        proof = _unpack_signed(data[end:], "partial decryption proof")
        if len(proof) != 2:
            raise ProtocolError("partial decryption proof must hold a challenge and a response")
        return cls(index, tuple(values), proof[0], proof[1])


def _ciphertexts(vector: EncryptedVector) -> list[int]:
    return [vector.ciphertext(i) for i in range(vector.num_ciphertexts)]


def _batch_weights(public: ThresholdPublicKey, index: int, ciphertexts: Sequence[int], partials: Sequence[int]):
    width = _width(2 * public.bits)
    h = hashlib.sha256(_DOMAIN + b"weights" + public.n.to_bytes(_width(public.bits), "big"))
    h.update(struct.pack("<HI", index, len(ciphertexts)))
    h.update(_pack(ciphertexts, width))
    h.update(_pack(partials, width))
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
    return _coin(b"proof", public.n, index, *elements, bits=KAPPA)


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
            magnitude = abs(exponent).to_bytes(_width(abs(exponent).bit_length()), "big")
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
    width = _width(public.bits)
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
