"""The lattice mode's checks on one process: a wrong summed key share is refused and named, a wrong sum refused."""

from __future__ import annotations

import numpy as np
import pytest

from confide import _native
from confide.crypto.fixedpoint import FixedPoint
from confide.errors import InvalidParameterError
from confide.privacy.distributed import grid_bits
from confide.protect.lattice import RING_DIMENSION, bad_decryption_shares, message_bits

PARTIES = ["hospital-a", "hospital-b", "hospital-c", "hospital-d"]
SEED = bytes(range(32))
Q = _native.LatticeRing(RING_DIMENSION, 16).modulus


def _sum_of(ring, words_of_parties):
    """The data plane's fold of packed words (mod q), from zero."""
    total = np.zeros(words_of_parties[0].size, dtype=np.uint64)
    for words in words_of_parties:
        ring.fold_packed(total, words)
    return total


def _round(threshold: int):
    """Four parties' words of slice 0 summed, and each party's summed key share (point, uint16)."""
    ring = _native.LatticeRing(RING_DIMENSION, 16)
    bits = message_bits(len(PARTIES))
    rng = np.random.default_rng(8)
    keys = [ring.new_key() for _ in PARTIES]
    shares = [key.shares(threshold, len(PARTIES)) for key in keys]
    values = [rng.integers(0, 1 << (bits - 3), size=3000, dtype=np.uint32) for _ in PARTIES]
    m = len(PARTIES)
    total = _sum_of(
        ring, [ring.encrypt_packed(SEED, 0, key, mine, bits, m) for key, mine in zip(keys, values, strict=True)]
    )
    assert total.size == 1500  # two values a word
    summed = {}
    for j, party in enumerate(PARTIES):
        share = np.zeros(RING_DIMENSION, dtype=np.uint16)
        for i in range(len(PARTIES)):
            _native.LatticeKeySum.add_shares(share, shares[i][j])
        summed[party] = (j + 1, share)
    expected = (sum(v.astype(np.uint64) for v in values) % (1 << bits)).astype(np.uint32)
    return ring, bits, total, summed, expected


def _key_sum(summed, names):
    points, shares = zip(*(summed[n] for n in names), strict=True)
    return _native.LatticeKeySum.reconstruct(list(points), list(shares), len(PARTIES))


def test_any_threshold_of_the_summed_shares_decrypt_and_a_wrong_one_is_named():
    ring, bits, total, summed, expected = _round(threshold=2)
    for names in (["hospital-a", "hospital-b"], ["hospital-c", "hospital-d"], ["hospital-a", "hospital-d"]):
        keys = _key_sum(summed, names)
        assert ring.residual_packed(SEED, 0, keys, total, bits, 4, 3000) == 0
        np.testing.assert_array_equal(ring.decrypt_packed(SEED, 0, keys, total, bits, 4, 3000), expected)
    point, share = summed["hospital-c"]
    wrong = share.copy()
    wrong[17] = (int(wrong[17]) + 1) % 65521  # one coefficient off by one
    summed["hospital-c"] = (point, wrong)
    keys = _key_sum(summed, ["hospital-a", "hospital-c"])
    assert ring.residual_packed(SEED, 0, keys, total, bits, 4, 3000) > 1000  # most words' errors are past the bound
    with pytest.raises(InvalidParameterError, match="decrypt with an error past the parties' bound 84"):
        ring.decrypt_packed(SEED, 0, keys, total, bits, 4, 3000)
    assert bad_decryption_shares(_residual(ring, bits, total), summed, 2, len(PARTIES)) == ["hospital-c"]


def _residual(ring, bits, total):
    return lambda keys: ring.residual_packed(SEED, 0, keys, total, bits, len(PARTIES), 2 * total.size)


def test_a_sum_that_is_not_of_the_parties_ciphertexts_blames_no_share():
    ring, bits, total, summed, _ = _round(threshold=3)
    forged = (total + np.random.default_rng(2).integers(0, Q, size=total.size, dtype=np.uint64)) % np.uint64(Q)
    assert bad_decryption_shares(_residual(ring, bits, forged), summed, 3, len(PARTIES)) is None
    # two wrong shares of four at threshold 3: no three right ones to tell them by
    rng = np.random.default_rng(6)
    for name in ("hospital-a", "hospital-b"):
        point, share = summed[name]
        noise = rng.integers(1, 65521, size=share.size)
        summed[name] = (point, ((share.astype(np.int64) + noise) % 65521).astype(np.uint16))
    assert bad_decryption_shares(_residual(ring, bits, total), summed, 3, len(PARTIES)) is None


@pytest.mark.parametrize("parties", [2, 3, 10, 200])
def test_sums_at_the_lane_limit_decrypt_exactly(parties):
    """m parties at full scale (every value at +bound or -bound) sum exactly; so does DP noise on the grid."""
    ring = _native.LatticeRing(RING_DIMENSION, 16)
    bits = message_bits(parties)
    fixed = FixedPoint(8.0, parties, bits)
    grid = grid_bits("lattice", bits=32, mask_bound=8.0, parties=parties, clip=0.5, noise=0.1, dimension=0)
    assert grid == fixed.fraction_bits
    rng = np.random.default_rng(parties)
    size = 5000
    keys = [ring.new_key() for _ in range(min(parties, 12))]  # up to 12 keys, reused: the sum is what is checked
    sign = rng.choice([-1.0, 1.0], size=size)
    # full scale, then a value on the grid at the tail: 6 deviations of a unit noise share
    values = [
        sign * 8.0 if p % 2 == 0 else np.rint(sign * rng.uniform(-6, 6, size) * 2.0**grid) / 2.0**grid
        for p in range(parties)
    ]
    values = [np.clip(v, -8.0, 8.0) for v in values]
    total = _sum_of(
        ring,
        [
            ring.encrypt_packed(SEED, 0, keys[p % len(keys)], fixed.encode(v), bits, parties)
            for p, v in enumerate(values)
        ],
    )
    key_sum = _native.LatticeKeySum.reconstruct(
        *_shares_of_sum([keys[p % len(keys)] for p in range(parties)], parties), parties
    )
    decoded = fixed.decode(ring.decrypt_packed(SEED, 0, key_sum, total, bits, parties, size))
    np.testing.assert_array_equal(decoded, sum(np.rint(v * fixed.scale) for v in values) / fixed.scale)


def _shares_of_sum(keys, parties):
    """Points and summed shares (threshold 2) of the keys as listed (a key listed twice counts twice)."""
    summed = [np.zeros(RING_DIMENSION, dtype=np.uint16) for _ in range(2)]
    for key in keys:
        shares = key.shares(2, 2)
        for j in range(2):
            _native.LatticeKeySum.add_shares(summed[j], shares[j])
    return [1, 2], summed


def test_the_aggregator_and_t_minus_1_parties_cannot_read_one_update():
    """Their whole view: every ciphertext, the key shares sent to the colluders, the key sum of all.

    Five parties at threshold 3; the aggregator and parties 1 and 2 pool everything they saw of
    a round and try to read party 3's update. Their two shares of its key rebuild something else
    (any interpolation through two points), and the key sum of everyone, less their own keys,
    leaves the sum of the three honest keys, not one: neither decrypts party 3's words. A third
    share of its key would (the threshold is exactly t).
    """
    ring = _native.LatticeRing(RING_DIMENSION, 16)
    parties, threshold, target = 5, 3, 3
    bits = message_bits(parties)
    rng = np.random.default_rng(11)
    keys = [ring.new_key() for _ in range(parties)]
    shares = [key.shares(threshold, parties) for key in keys]  # shares[i][j]: i's key, j's share (point j + 1)
    values = [rng.integers(0, 1 << (bits - 4), size=4096, dtype=np.uint32) for _ in range(parties)]
    words = [ring.encrypt_packed(SEED, 0, keys[i], values[i], bits, parties) for i in range(parties)]

    def residual(keys, total):
        return ring.residual_packed(SEED, 0, keys, total, bits, parties, 4096)

    colluders = [1, 2]

    def key_of(points_and_shares, count):
        points, chosen = zip(*points_and_shares, strict=True)
        return _native.LatticeKeySum.reconstruct(list(points), list(chosen), count)

    # Party 3's key from the colluders' two shares of it (as if the threshold were 2): not its key.
    guess = key_of([(j + 1, shares[target][j]) for j in colluders], 1)
    assert residual(guess, words[target]) > 1500  # of 2048 words
    # Everyone's key sum (the round's output) less what the colluders hold: three keys, not one.
    everyone = [(j + 1, _summed([shares[i][j] for i in range(parties)])) for j in range(threshold)]
    total = _sum_of(ring, words)
    assert residual(key_of(everyone, parties), total) == 0  # the sum is theirs to read
    rest = [(j + 1, _summed([shares[i][j] for i in range(parties) if i not in colluders])) for j in range(threshold)]
    assert residual(key_of(rest, 3), words[target]) > 1500
    # A third share of party 3's key is the threshold: it reads the update.
    exact = key_of([(j + 1, shares[target][j]) for j in (*colluders, 4)], 1)
    np.testing.assert_array_equal(
        ring.decrypt_packed(SEED, 0, exact, words[target], bits, parties, 4096), values[target]
    )


def _summed(shares):
    total = np.zeros(RING_DIMENSION, dtype=np.uint16)
    for share in shares:
        _native.LatticeKeySum.add_shares(total, share)
    return total


def test_packed_words_out_of_range_and_lane_overflows_are_named():
    ring = _native.LatticeRing(RING_DIMENSION, 16)
    key = ring.new_key()
    assert message_bits(3) == 24 and message_bits(10) == 21 and message_bits(200) == 15
    with pytest.raises(
        InvalidParameterError, match="message coefficient 1 is 16777216, at least the plaintext modulus 2"
    ):
        ring.encrypt_packed(SEED, 0, key, np.array([0, 1 << 24], dtype=np.uint32), 24, 3)
    with pytest.raises(InvalidParameterError, match="200 parties: the summed error can reach 4200"):
        ring.encrypt_packed(SEED, 0, key, np.zeros(4, dtype=np.uint32), 24, 200)
    total = np.zeros(2, dtype=np.uint64)
    with pytest.raises(InvalidParameterError, match=f"word 1 is {Q}, outside \\[0, q"):
        ring.fold_packed(total, np.array([1, Q], dtype=np.uint64))
    assert total.tolist() == [0, 0]


def test_the_public_polynomial_is_aes_ctr_under_a_shake128_key():
    """Known answer against the libraries the expansion comes from: SHAKE128 (hashlib) keys AES-128-CTR
    (OpenSSL, through ``cryptography``) from counter 0; 62-bit little-endian words under ``q`` are kept."""
    import hashlib

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    index = (5 << 24) | 1  # slice 5, block 1
    aes_key = hashlib.shake_128(b"confide-lattice/a62-aes/v1" + SEED + index.to_bytes(8, "little")).digest(16)
    stream = Cipher(algorithms.AES(aes_key), modes.CTR(bytes(16))).encryptor().update(bytes(8 * 4200))
    words = np.frombuffer(stream, dtype="<u8") & np.uint64((1 << 62) - 1)
    expected = words[words < np.uint64(Q)][:RING_DIMENSION]
    got = _native.LatticeRing(RING_DIMENSION, 16).public_poly_packed(SEED, index)
    np.testing.assert_array_equal(got, expected)
