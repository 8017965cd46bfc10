import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.crypto import (
    BatchCryptCodec,
    EncryptedVector,
    FLBoosterCodec,
    daciq_alpha_factor,
    daciq_threshold,
    decrypt_packed,
    encrypt_packed,
    sum_encrypted,
)
from confide.errors import EncodingError, InvalidParameterError

ALPHA = 0.5


def party_values(rng: np.random.Generator, length: int) -> np.ndarray:
    """Values at the clipping extremes, beyond them, zeros and mixed signs."""
    choices = np.array([ALPHA, -ALPHA, 0.0, 3 * ALPHA, -3 * ALPHA])
    values = rng.choice(choices, size=length)
    mixed = rng.uniform(-ALPHA, ALPHA, size=length)
    return np.where(rng.random(length) < 0.3, mixed, values)


@settings(max_examples=12, deadline=None)
@given(parties=st.integers(1, 64), length=st.integers(1, 250), seed=st.integers(0, 2**32))
def test_packed_sums_decode_exactly(key, parties, length, seed):
    """Sums of m = 1..64 packed vectors decode to the exact sum of quantized values."""
    rng = np.random.default_rng(seed)
    codec = BatchCryptCodec(bits=16, max_parties=parties, alpha=ALPHA, seed=seed)
    vectors = [party_values(rng, length) for _ in range(parties)]
    encrypted = [encrypt_packed(v, codec, key, threads=2) for v in vectors]
    # Each party's own quantization, decoded alone, is the reference.
    singles = [decrypt_packed(e, key) for e in encrypted]
    total = decrypt_packed(sum_encrypted(encrypted), key)
    step = ALPHA / ((2**15 - 1) // parties)
    assert np.allclose(total, np.sum(singles, axis=0), rtol=0, atol=1e-9)
    clipped = np.clip(np.sum(vectors, axis=0) * 0 + np.sum(np.clip(vectors, -ALPHA, ALPHA), axis=0), None, None)
    assert np.all(np.abs(total - clipped) <= parties * step + 1e-12)


def test_all_64_party_counts_at_the_extremes(key):
    """Every m in 1..64: all parties at +alpha, all at -alpha, zeros: exact, no overflow."""
    for parties in range(1, 65):
        codec = BatchCryptCodec(bits=16, max_parties=parties, alpha=ALPHA, seed=parties)
        values = np.array([ALPHA, -ALPHA, 0.0, ALPHA, -ALPHA])
        one = encrypt_packed(values, codec, key, threads=2)
        total, overflow = decrypt_packed(sum_encrypted([one] * parties), key, return_overflow=True)
        q_c = (2**15 - 1) // parties
        assert overflow.size == 0
        assert np.array_equal(total * q_c / ALPHA, np.array([q_c, -q_c, 0, q_c, -q_c]) * parties)


def test_overflow_flags_fire_only_beyond_the_code_range(key):
    """More parties than declared overflow; the exact quantizer raises, positions are reported."""
    codec = BatchCryptCodec(bits=16, max_parties=3, alpha=1.0, seed=1)
    vector = encrypt_packed(np.array([1.0, -1.0, 0.25, 0.0]), codec, key)
    three = sum_encrypted([vector] * 3)
    assert decrypt_packed(three, key, return_overflow=True)[1].size == 0
    four = sum_encrypted([vector] * 4)
    values, overflow = decrypt_packed(four, key, return_overflow=True)
    assert overflow.tolist() == [0, 1]
    assert values[0] == pytest.approx(4.0, abs=1e-3)
    with pytest.raises(EncodingError, match="2 packed sums left the code range"):
        decrypt_packed(four, key)
    with pytest.raises(EncodingError, match="capacity of 4 summands"):
        decrypt_packed(sum_encrypted([vector] * 5), key)


def test_paper_quantizer_may_exceed_q_and_stays_exact(key):
    """BatchCrypt's own scaling can exceed Q by < m units; the decoder stays exact."""
    codec = BatchCryptCodec(bits=8, max_parties=3, alpha=1.0, quantizer="paper", seed=3)
    vector = encrypt_packed(np.ones(50), codec, key)
    values, overflow = decrypt_packed(sum_encrypted([vector] * 3), key, return_overflow=True)
    codes = np.rint(values * 127 / 3).astype(int)
    assert np.all(codes >= 126) and np.all(codes <= 129)
    assert set(overflow.tolist()) == {i for i, c in enumerate(codes) if abs(c) > 127}


def test_seeded_encoding_is_reproducible_and_dtypes_agree(key):
    """The same seed gives the same quantization for float32 and float64 input."""
    values = np.linspace(-1, 1, 333)
    codec = BatchCryptCodec(bits=12, max_parties=4, alpha=1.0, seed=42)
    a = decrypt_packed(encrypt_packed(values, codec, key), key)
    b = decrypt_packed(encrypt_packed(values.astype(np.float32), codec, key.encryption_key), key)
    c = decrypt_packed(encrypt_packed(values, codec, key, threads=1), key)
    assert np.allclose(a, b, atol=2 / 511) and np.array_equal(a, c)


def test_packed_wire_round_trip_keeps_codec_and_count(key):
    """Packed blocks carry codec parameters, length and summand count."""
    codec = BatchCryptCodec(bits=16, max_parties=16, alpha=0.1, seed=5)
    total = sum_encrypted([encrypt_packed(np.full(500, 0.01), codec, key) for _ in range(2)])
    data = total.to_bytes()
    again = EncryptedVector.from_bytes(data, key.encryption_key)
    assert again.to_bytes() == data and again.summed == 2 and again.length == 500
    assert np.allclose(decrypt_packed(again, key), 0.02, atol=1e-4)
    # 16-bit codes, 16 parties: 97 values per 512-byte ciphertext -> 5.28 bytes per value.
    assert codec.layout(2048) == (21, 97)
    assert total.num_ciphertexts == 6


def test_bad_packed_input_names_the_field(key):
    """NaN values, mismatched codecs and raw-only operations fail clearly."""
    codec = BatchCryptCodec(bits=16, max_parties=2, alpha=1.0)
    with pytest.raises(EncodingError, match=r"values\[2\] is not finite"):
        encrypt_packed(np.array([0.0, 1.0, np.nan]), codec, key)
    with pytest.raises(InvalidParameterError, match="bits.*2..=32"):
        encrypt_packed(np.zeros(3), BatchCryptCodec(bits=40), key)
    with pytest.raises(InvalidParameterError, match="alpha"):
        encrypt_packed(np.zeros(3), BatchCryptCodec(alpha=-1.0), key)
    a = encrypt_packed(np.zeros(3), codec, key)
    b = encrypt_packed(np.zeros(4), codec, key)
    with pytest.raises(InvalidParameterError, match="different encoding or length"):
        sum_encrypted([a, b])
    with pytest.raises(InvalidParameterError, match="only defined on raw"):
        a.negate()


def test_flbooster_codec_round_trip(key):
    """FLBooster packing sums within its quantization step (it needs the exact count)."""
    codec = FLBoosterCodec(bits=30, max_parties=4, alpha=1.0)
    vectors = [np.linspace(-1, 1, 200), np.linspace(1, -1, 200), np.full(200, 0.3)]
    total = sum_encrypted([encrypt_packed(v, codec, key) for v in vectors])
    assert np.allclose(decrypt_packed(total, key), np.sum(vectors, axis=0), atol=1e-8)
    assert codec.layout(2048) == (32, 63)


def test_daciq_threshold_uses_the_corrected_table():
    """alpha = A(b_eff) * sigma_hat with b_eff = r - ceil(log2 m)."""
    assert daciq_alpha_factor(24) == pytest.approx(7.4019)
    alpha = daciq_threshold(np.array([1.0, 0.5]), np.array([-1.0, -0.8]), 1000, bits=16, parties=10)
    sigma = 0.540208 * 2.0 / np.sqrt(2 * np.log(2000))
    assert alpha == pytest.approx(4.8877 * sigma)
    with pytest.raises(InvalidParameterError, match="maxima/minima"):
        daciq_threshold(np.array([1.0]), np.array([]), 10)
