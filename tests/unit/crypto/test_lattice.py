"""Lattice aggregation primitives through the native module: a round with a dropout, in one process."""

from __future__ import annotations

import numpy as np
import pytest

from confide.crypto.lattice import LatticeParams, RoundKey, add_shares, decrypt, fold, key_sum
from confide.errors import InvalidParameterError


def test_a_round_with_a_dropout_decrypts_the_sum_of_the_parties_that_sent_and_nothing_less():
    params = LatticeParams(n=1024, plaintext_bits=20)
    rng = np.random.default_rng(3)
    parties, threshold, length = 5, 3, 3000
    seed = bytes(range(32))
    keys = [RoundKey(params) for _ in range(parties)]
    updates = [rng.integers(-30_000, 30_000, size=length) for _ in range(parties)]
    shares = [k.shares(threshold, parties) for k in keys]  # shares[i][j]: party i's share for party j
    sent = [0, 1, 3, 4]  # party 2 drops before its ciphertext arrives
    total = np.zeros(params.ring().encrypted_length(length), dtype=np.uint64)
    for i in sent:
        ciphertext = keys[i].encrypt(seed, updates[i])
        assert ciphertext.dtype == np.uint64 and ciphertext.size == 3072  # three blocks of 1024
        fold(total, ciphertext)
    summed = []
    for j in range(parties):
        mine = np.zeros(1024, dtype=np.uint16)
        for i in sent:
            assert shares[i][j].dtype == np.uint16 and shares[i][j].max() < 65521
            add_shares(mine, shares[i][j])
        summed.append(mine)
    expected = sum(updates[i] for i in sent)
    for chosen in ([0, 1, 2], [1, 3, 4], [0, 2, 3, 4]):
        keys_sum = key_sum([j + 1 for j in chosen], [summed[j] for j in chosen], len(sent))
        np.testing.assert_array_equal(decrypt(params, seed, keys_sum, total, length), expected)
    # fewer than the threshold: another polynomial, which decrypts noise
    wrong = key_sum([1, 2], summed[:2], len(sent))
    assert (decrypt(params, seed, wrong, total, length) == expected).mean() < 0.01
    assert "secret" in repr(keys[0]._key) and "secret" in repr(wrong)


def test_bad_input_names_the_field_and_the_limit():
    params = LatticeParams(n=1024, plaintext_bits=8)
    key = RoundKey(params)
    with pytest.raises(InvalidParameterError, match=r"values must lie in \[-2\^7, 2\^7\)"):
        key.encrypt(bytes(32), np.array([128]))
    with pytest.raises(InvalidParameterError, match="values must be integers"):
        key.encrypt(bytes(32), np.array([0.5]))
    with pytest.raises(InvalidParameterError, match="seed.*must be 32 bytes, got 3"):
        key.encrypt(b"abc", np.array([1]))
    with pytest.raises(InvalidParameterError, match="ring dimension 1000: must be a power of two"):
        LatticeParams(n=1000).ring()
    with pytest.raises(InvalidParameterError, match="threshold 4 of 3 parties"):
        key.shares(4, 3)
    with pytest.raises(InvalidParameterError, match="threshold 2 of 40000 parties: needs .* <= 32760"):
        key.shares(2, 40_000)
    with pytest.raises(InvalidParameterError, match="share coefficient 65521 is not below 65521"):
        add_shares(np.zeros(3, dtype=np.uint16), np.array([0, 65521, 0], dtype=np.uint16))
