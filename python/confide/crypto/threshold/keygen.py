"""Distributed key generation (steps 1-3 of the package docstring), and a dealer for tests and demos."""

from __future__ import annotations

import math
import operator
import secrets
import threading
from collections.abc import Sequence

import gmpy2
import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from confide.crypto.threshold.channel import Channel, CheatingPartyError, LocalChannels, check_threshold
from confide.crypto.threshold.keys import (
    BIPRIME_TESTS,
    KAPPA,
    MAX_MODULUS_BATCHES,
    PRIMORIAL,
    WIDE_PRIMORIAL,
    ThresholdKey,
    ThresholdPublicKey,
    pack_signed,
    public_coin,
    unpack_signed,
    value_bytes,
)
from confide.crypto.vectors import pack_fixed, unpack_fixed
from confide.errors import InvalidParameterError, ProtocolError


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


def _randoms_below(bound: int, count: int) -> list[int]:
    """``count`` integers in [0, bound) from one read of the OS generator (2^-128 from uniform)."""
    width = (bound.bit_length() + KAPPA + 7) // 8
    raw = secrets.token_bytes(width * count)
    return [int.from_bytes(raw[i * width : (i + 1) * width], "little") % bound for i in range(count)]


def _shares(values: Sequence[int], degree: int, modulus: int, points: int) -> list[list[int]]:
    """Shamir shares of every value: ``out[j - 1][k]`` is f_k(j), f_k random of ``degree``, f_k(0) = values[k].

    Over the prime field of the biprimality step. The sieve's sharing over Z_M is
    :func:`_rns_shares`, in residues modulo each prime of M.
    """
    count = len(values)
    coefficients = _randoms_below(modulus, degree * count)
    out = []
    for x in range(1, points + 1):
        evaluated = []
        for k, secret in enumerate(values):
            value = 0
            for c in reversed(coefficients[k * degree : (k + 1) * degree]):
                value = (value * x + c) % modulus
            evaluated.append((value * x + secret) % modulus)
        out.append(evaluated)
    return out


def _sieve_primes(half: int, parties: int) -> tuple[int, ...]:
    """The primes of M: those above ``parties``, ascending, while their product stays within half of p's bits.

    Candidates p are drawn coprime to M (step 1's sieving). Half of p's bits: the other half is
    the parties' random multiples of 4M. The primes up to ``parties`` are left to the trial
    division of N: Shamir sharing modulo a prime needs the prime above the party count (the
    points 1..m must be distinct and nonzero modulo it).
    """
    primes: list[int] = []
    product, prime = 1, parties
    while True:
        prime = int(gmpy2.next_prime(prime))
        if (product * prime).bit_length() > half // 2:
            return tuple(primes)
        primes.append(prime)
        product *= prime


def expected_candidates(bits: int, parties: int, *, sieve: bool = True) -> float:
    """Expected candidate pairs (p, q) before both are prime: (ln 2^(k/2) * prod(1 - 1/r) / 2)^2 over r | M."""
    density = math.prod(1 - 1 / r for r in _sieve_primes(bits // 2, parties)) if sieve else 1.0
    return (math.log(2) * bits / 2 * density / 2) ** 2


def _random_bytes(size: int) -> bytes:
    """``size`` bytes of AES-256-CTR keystream under a fresh key from the OS generator (a cryptographic PRG)."""
    encryptor = Cipher(algorithms.AES(secrets.token_bytes(32)), modes.CTR(secrets.token_bytes(16))).encryptor()
    return encryptor.update(bytes(size)) + encryptor.finalize()


def _residues(primes: np.ndarray, shape: tuple[int, ...], *, units: bool = False) -> np.ndarray:
    """Uniform residues modulo each prime (the last axis), 2^-112 from uniform; ``units``: nonzero ones.

    128 random bits per residue, reduced as hi * 2^64 + lo.
    """
    bound = primes - 1 if units else primes
    raw = np.frombuffer(_random_bytes(16 * math.prod(shape)), dtype=np.uint64).reshape(*shape, 2)
    bound64 = bound.astype(np.uint64)
    wrap = np.array([(1 << 64) % b for b in bound.tolist()], dtype=np.uint64)
    value = ((raw[..., 0] % bound64) * wrap + raw[..., 1] % bound64) % bound64
    return value.astype(np.int64) + (1 if units else 0)


def _rns_shares(values: np.ndarray, degree: int, primes: np.ndarray, points: int) -> np.ndarray:
    """Shamir shares of residue vectors (count, P): ``out[j - 1]`` = f(j) modulo each prime, f(0) = values.

    Horner's rule, reduced only when the next step could pass 2^62 (residues are below 2^16).
    """
    coefficients = _residues(primes, (degree, *values.shape))
    top = int(primes.max())
    out = np.empty((points, *values.shape), dtype=np.int64)
    for x in range(1, points + 1):
        acc, bound = np.zeros_like(values), 0
        for c in coefficients[::-1]:
            if (bound + top) * x >= 1 << 62:
                acc %= primes
                bound = top
            acc = (acc + c) * x
            bound = (bound + top) * x
        out[x - 1] = (acc + values) % primes
    return out


def _sieved_units(channel: Channel, tag: str, primes: Sequence[int], count: int) -> list[int]:
    """My additive shares (mod M) of ``count`` products a = a_1 * ... * a_m of random units of Z_M.

    Each party draws its a_i from Z_M* and shares it (degree d = floor((m-1)/2)); products of two
    sharings have degree 2d < m and are brought back to degree d by resharing (BGW), pairwise, so
    ceil(log2 m) - 1 exchanges follow the first. The last product, plus a random sharing of zero
    of degree 2d, is turned into additive shares with the Lagrange coefficients at 0. a is a unit
    of Z_M, so p = a (mod M) has no prime factor of M; nobody learns a.

    Values mod M are held as residues modulo each prime of M (the Chinese remainder theorem), so
    the arithmetic is numpy's on small integers and a uniform unit of Z_M is a uniform nonzero
    residue modulo each prime; they travel as 16-bit residues, and are put together at the end.
    """
    me, m = channel.index, channel.parties
    degree = (m - 1) // 2
    q = np.asarray(primes, dtype=np.int64)
    if int(q.max()) >= 1 << 16:
        raise InvalidParameterError(f"sieve primes must stay below 2^16, got {int(q.max())}")
    others = [j for j in range(1, m + 1) if j != me]
    lagrange = np.array(
        [
            [coefficient % r for r in primes]
            for coefficient in _lagrange_at_zero(list(range(1, m + 1)), math.prod(primes))
        ],
        dtype=np.int64,
    )

    def exchange(step: str, shares: np.ndarray, rows: int) -> dict[int, np.ndarray]:
        for j in others:
            channel.send(j, step, shares[j - 1].astype("<u2").tobytes())
        got = {me: shares[me - 1]}
        for j in others:
            payload = channel.recv(j, step)
            if len(payload) != 2 * rows * len(primes):
                raise CheatingPartyError(
                    j, f"sent {len(payload)} bytes of sieve residues, expected {2 * rows * len(primes)}"
                )
            got[j] = np.frombuffer(payload, dtype="<u2").astype(np.int64).reshape(rows, len(primes)) % q
        return got

    units = _residues(q, (count, len(primes)), units=True)
    zero = _rns_shares(np.zeros_like(units), 2 * degree, q, m)
    received = exchange(f"{tag}/sieve/0", np.concatenate([_rns_shares(units, degree, q, m), zero], axis=1), 2 * count)
    level = [received[j][:count] for j in range(1, m + 1)]
    zero_share = sum(received[j][count:] for j in received) % q
    step = 0
    while len(level) > 2:
        step += 1
        pairs = len(level) // 2
        products = np.concatenate([level[2 * i] * level[2 * i + 1] % q for i in range(pairs)])
        got = exchange(f"{tag}/sieve/{step}", _rns_shares(products, degree, q, m), pairs * count)
        reduced = sum(lagrange[j - 1] * got[j] % q for j in got) % q
        level = [reduced[i * count : (i + 1) * count] for i in range(pairs)] + level[2 * pairs :]
    mine = lagrange[me - 1] * ((level[0] * level[1] + zero_share) % q) % q
    modulus = math.prod(primes)
    basis = [(modulus // r) * pow(modulus // r, -1, r) for r in primes]
    return [sum(map(operator.mul, row, basis)) % modulus for row in mine.tolist()]


def _candidate_shares(
    channel: Channel, tag: str, half: int, count: int, primes: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Additive shares of ``count`` candidates p and q: 3 mod 4, coprime to M, top two bits set.

    p_i = 4 (u b_i mod M) + 4 M r_i, plus, at party 1, c + 2^(half-1) + 2^(half-2), where b_i
    are the additive shares of a unit a of Z_M (M the product of ``primes``), u = 1/4 mod M and
    c = 3 mod 4, c = -offset mod M: so p = a (mod M) and p = 3 (mod 4). The r_i leave p below
    2^(half-1) + 2^(half-1). With no primes (M = 1) this is the plain draw of Boneh-Franklin.
    """
    me, m = channel.index, channel.parties
    modulus = math.prod(primes)
    span = (1 << (half - 2)) // (4 * modulus * m) - 2
    if span < 1:
        raise InvalidParameterError(
            f"bits too small for the sieve: 2^{half - 2} against M of {modulus.bit_length()} bits"
        )
    offset = (1 << (half - 1)) + (1 << (half - 2))
    quarter = pow(4, -1, modulus) if modulus > 1 else 0
    fixed = 3 + 4 * ((-offset - 3) * quarter % modulus) + offset if me == 1 else 0
    units = _sieved_units(channel, tag, primes, 2 * count) if primes else [0] * (2 * count)
    masks = _randoms_below(span, 2 * count)
    shares = [4 * (quarter * b % modulus) + 4 * modulus * r + fixed for b, r in zip(units, masks, strict=True)]
    return shares[:count], shares[count:]


def _biprime_base(n: int, test: int) -> int:
    counter = 0
    while True:
        g = public_coin(b"biprime", n, test, counter, bits=n.bit_length() + 64) % n
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


def _find_modulus(channel: Channel, bits: int, batch: int, *, sieve: bool = True) -> tuple[int, int, int]:
    """(N, p_i, q_i): step 1 of the module docstring (``sieve=False``: no distributed sieving)."""
    me, m = channel.index, channel.parties
    degree = (m - 1) // 2
    prime = _field_prime(bits)
    width = value_bytes(prime.bit_length())
    nwidth = value_bytes(bits)
    lagrange = _lagrange_at_zero(list(range(1, m + 1)), prime)
    sieve_primes = _sieve_primes(bits // 2, m) if sieve else ()
    others = [j for j in range(1, m + 1) if j != me]
    round_number = 0
    while True:
        round_number += 1
        if round_number > MAX_MODULUS_BATCHES:
            raise ProtocolError(
                f"no biprime modulus after {MAX_MODULUS_BATCHES} batches of {batch} candidates (about "
                f"{math.ceil(expected_candidates(bits, m, sieve=sieve) / batch)} are expected): a party is deviating "
                "from the key generation"
            )
        tag = f"dkg/modulus/{round_number}"
        ps, qs = _candidate_shares(channel, tag, bits // 2, batch, sieve_primes)
        sp, sq = _shares(ps, degree, prime, m), _shares(qs, degree, prime, m)
        sz = _shares([0] * batch, 2 * degree, prime, m)
        outgoing = {
            j: [v for k in range(batch) for v in (sp[j - 1][k], sq[j - 1][k], sz[j - 1][k])] for j in range(1, m + 1)
        }
        for j in others:
            channel.send(j, tag + "/shares", pack_fixed(outgoing[j], width))
        received = {me: outgoing[me]}
        for j in others:
            received[j] = unpack_fixed(channel.recv(j, tag + "/shares"), width, 3 * batch, f"modulus shares from {j}")
        if round_number > 1:
            # Everyone started this batch, so everyone has the last one: about 30 batches of
            # megabytes each would otherwise pile up in every process and in the relay.
            channel.release(f"dkg/modulus/{round_number - 1}/")
        products = []
        for k in range(batch):
            sp = sum(received[j][3 * k] for j in received) % prime
            sq = sum(received[j][3 * k + 1] for j in received) % prime
            sz = sum(received[j][3 * k + 2] for j in received) % prime
            products.append((sp * sq + sz) % prime)
        channel.broadcast(tag + "/products", pack_fixed(products, width))
        all_products = {me: products}
        for j in others:
            all_products[j] = unpack_fixed(
                channel.recv(j, tag + "/products"), width, batch, f"modulus products from {j}"
            )
        moduli = []
        for k in range(batch):
            n = sum(lagrange[j - 1] * all_products[j][k] for j in range(1, m + 1)) % prime
            if n.bit_length() != bits:
                raise ProtocolError(f"candidate modulus {k} of round {round_number} has {n.bit_length()} bits")
            moduli.append(n)
        survivors = [k for k, n in enumerate(moduli) if math.gcd(n, PRIMORIAL) == 1]
        survivors = [k for k in survivors if gmpy2.gcd(WIDE_PRIMORIAL % moduli[k], moduli[k]) == 1]
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
            channel.broadcast(step, pack_fixed(mine, nwidth))
            count = len(survivors) * (tests - first)
            values = {me: mine}
            for j in others:
                values[j] = unpack_fixed(channel.recv(j, step), nwidth, count, f"biprimality values from {j}")
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
    channel.broadcast("dkg/secret/offer", pack_signed([temp_n, _encrypt_temporary(temp_n, beta)]))
    masks_out = {j: secrets.randbelow(n) for j in others}
    kept = 0
    offers = {j: channel.recv(j, "dkg/secret/offer") for j in others}
    channel.release("dkg/modulus/")  # every party found the modulus: the last batch is spent too
    for j in others:
        offer = unpack_signed(offers[j], f"product offer from {j}")
        if len(offer) != 2 or offer[0].bit_length() < temp_bits - 2:
            raise CheatingPartyError(j, "product offer must hold a large enough modulus and one ciphertext")
        their_n, ciphertext = offer
        their_n2 = their_n * their_n
        mask = secrets.randbits(product_bits + KAPPA) | (1 << (product_bits + KAPPA))
        kept -= mask
        answer = int(gmpy2.powmod(ciphertext, phi, their_n2)) * _encrypt_temporary(their_n, mask) % their_n2
        channel.send(j, "dkg/secret/answer", pack_signed([answer, masks_out[j]]))
    share = beta * phi + kept
    masks_in = 0
    for j in others:
        answer = unpack_signed(channel.recv(j, "dkg/secret/answer"), f"product answer from {j}")
        if len(answer) != 2:
            raise CheatingPartyError(j, "product answer must hold one ciphertext and one mask")
        plain = (int(gmpy2.powmod(answer[0], temp_lambda, temp_n2)) - 1) // temp_n
        plain = plain * pow(temp_lambda, -1, temp_n) % temp_n
        share += plain
        masks_in += answer[1]
    masked = (share + sum(masks_out.values()) - masks_in) % n
    channel.broadcast("dkg/secret/theta", pack_signed([masked]))
    theta = masked
    for j in others:
        values = unpack_signed(channel.recv(j, "dkg/secret/theta"), f"theta part from {j}")
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
    v = pow(public_coin(b"v", n, bits=2 * n.bit_length() + 64) % n2, 2, n2)
    secret_bits = 2 * n.bit_length() + KAPPA + 4 + m.bit_length()
    coefficient_bits = secret_bits + KAPPA + 2 * delta.bit_length()
    coefficients = [share] + [secrets.randbits(coefficient_bits) for _ in range(threshold - 1)]
    commitments = [int(gmpy2.powmod(v, c, n2)) for c in coefficients]
    channel.broadcast("dkg/threshold/commitments", pack_signed(commitments))

    def evaluate(x: int) -> int:
        value = 0
        for c in reversed(coefficients):
            value = value * x + c
        return value

    for j in others:
        channel.send(j, "dkg/threshold/share", pack_signed([evaluate(j)]))
    all_commitments = {me: commitments}
    total = evaluate(me)
    for j in others:
        theirs = unpack_signed(channel.recv(j, "dkg/threshold/commitments"), f"commitments from {j}")
        if len(theirs) != threshold:
            raise CheatingPartyError(j, f"sent {len(theirs)} commitments, expected {threshold}")
        all_commitments[j] = theirs
        received = unpack_signed(channel.recv(j, "dkg/threshold/share"), f"threshold share from {j}")
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
    v = pow(public_coin(b"v", n, bits=2 * bits + 64) % n2, 2, n2)
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
