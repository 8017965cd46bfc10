"""Vertical-FL ciphertext kernels: histogram, fold and dot against naive products mod n^2."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.crypto import BatchCryptCodec, encrypt_packed
from confide.errors import InvalidParameterError


def _ints(vector) -> list[int]:
    return [vector.ciphertext(i) for i in range(vector.num_ciphertexts)]


def _naive_histogram(cts, bins, rows, n_bins, n2):
    out = [1] * (bins.shape[0] * n_bins)
    for f in range(bins.shape[0]):
        for r in rows:
            cell = f * n_bins + int(bins[f, r])
            out[cell] = out[cell] * cts[r] % n2
    return out


@pytest.fixture(scope="module")
def samples(key):
    rng = np.random.default_rng(7)
    values = rng.integers(0, 2**40, 60)
    vector = key.encryption_key.encrypt(values)
    return values, vector, _ints(vector)


@pytest.mark.parametrize("n_bins", [2, 5, 256])
@pytest.mark.parametrize("threads", [1, 2])
def test_histogram_is_bit_identical_to_naive_products(key, samples, n_bins, threads):
    """Every bin equals the product of its rows' ciphertexts mod n^2; empty bins are 1."""
    values, vector, cts = samples
    n2 = key.encryption_key.n**2
    rng = np.random.default_rng(n_bins)
    bins = rng.integers(0, n_bins, (3, len(values)), dtype=np.uint8)
    rows = np.concatenate([rng.permutation(len(values))[:45], [3, 3]]).astype(np.uint32)
    hist = vector.histogram(bins, rows, n_bins, threads=threads)
    assert hist.num_ciphertexts == 3 * n_bins and hist.encoding == "raw"
    assert _ints(hist) == _naive_histogram(cts, bins, rows, n_bins, n2)
    sums = np.zeros(3 * n_bins, dtype=np.int64)
    for f in range(3):
        np.add.at(sums, f * n_bins + bins[f, rows].astype(np.int64), values[rows])
    assert np.array_equal(key.decrypt(hist, threads=threads), sums)


def test_histogram_of_no_rows_is_all_ones(key, samples):
    _, vector, _ = samples
    hist = vector.histogram(np.zeros((2, 60), np.uint8), np.zeros(0, np.uint32), 4)
    assert _ints(hist) == [1] * 8
    assert vector.histogram(np.zeros((0, 60), np.uint8), np.arange(5, dtype=np.uint32), 4).num_ciphertexts == 0


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_histogram_any_shape(key, samples, data):
    values, vector, cts = samples
    n2 = key.encryption_key.n**2
    features = data.draw(st.integers(0, 4))
    n_bins = data.draw(st.integers(1, 9))
    bins = np.array(
        data.draw(st.lists(st.integers(0, n_bins - 1), min_size=features * 60, max_size=features * 60)), dtype=np.uint8
    ).reshape(features, 60)
    rows = np.array(data.draw(st.lists(st.integers(0, 59), max_size=80)), dtype=np.uint32)
    assert _ints(vector.histogram(bins, rows, n_bins)) == _naive_histogram(cts, bins, rows, n_bins, n2)


def test_histogram_errors_name_the_field(key, samples):
    _, vector, _ = samples
    bins = np.zeros((2, 60), np.uint8)
    rows = np.arange(60, dtype=np.uint32)
    with pytest.raises(InvalidParameterError, match="n_bins.*1..=256"):
        vector.histogram(bins, rows, 0)
    with pytest.raises(InvalidParameterError, match="n_bins"):
        vector.histogram(bins, rows, 257)
    with pytest.raises(InvalidParameterError, match="n_bins"):
        vector.histogram(bins, rows, -1)
    bad = bins.copy()
    bad[1, 7] = 9
    with pytest.raises(InvalidParameterError, match=r"bins\[1, 7\] = 9 must be < n_bins = 4 \(feature 1, row 7\)"):
        vector.histogram(bad, rows, 4)
    assert vector.histogram(bad, rows[:7], 4).num_ciphertexts == 8  # row 7 not selected: never read
    with pytest.raises(InvalidParameterError, match=r"rows\[2\] = 60 must be < 60"):
        vector.histogram(bins, np.array([0, 1, 60], np.uint32), 4)
    with pytest.raises(InvalidParameterError, match="bins.*59 elements, expected 60"):
        vector.histogram(np.zeros((2, 59), np.uint8), rows, 4)
    with pytest.raises(InvalidParameterError, match="bins must be a 2-dimensional array"):
        vector.histogram(np.zeros(60, np.uint8), rows, 4)
    with pytest.raises(InvalidParameterError, match="bins values must be in"):
        vector.histogram(np.full((2, 60), -1), rows, 4)
    with pytest.raises(InvalidParameterError, match="integer numpy array"):
        vector.histogram(bins.astype(np.float64), rows, 4)
    with pytest.raises(InvalidParameterError, match="C-contiguous"):
        vector._native.histogram(np.asfortranarray(bins), rows, 4)
    packed = encrypt_packed(np.zeros(10), BatchCryptCodec(bits=8, max_parties=2), key)
    with pytest.raises(InvalidParameterError, match="only defined on raw ciphertexts"):
        packed.histogram(bins[:, :1], rows[:1], 4)
    with pytest.raises(InvalidParameterError, match="threads"):
        vector.histogram(bins, rows, 4, threads=1000)


@pytest.mark.parametrize(("count", "width", "per"), [(40, 125, 16), (7, 64, 3), (5, 30, 1), (3, 100, 8)])
def test_fold_packs_slots(key, count, width, per):
    """Dec(fold) = sum_j m_j 2^(width j), byte-identical to Horner on Python ints."""
    rng = np.random.default_rng(count)
    values = [int(v) for v in rng.integers(0, 2 ** min(width - 8, 62), count)]
    vector = key.encrypt_integers(values)
    public = key.encryption_key
    n2 = public.n**2
    folded = vector.fold(width, per, threads=2)
    assert folded.num_ciphertexts == -(-count // per)
    cts = _ints(vector)
    expected = []
    for g in range(0, count, per):
        group = cts[g : g + per]
        acc = group[-1]
        for c in reversed(group[:-1]):
            acc = pow(acc, 2**width, n2) * c % n2
        expected.append(acc)
    assert _ints(folded) == expected
    plain = key.decrypt_integers(folded)
    for k, g in enumerate(range(0, count, per)):
        assert plain[k] == sum(m << (width * j) for j, m in enumerate(values[g : g + per]))


def test_fold_errors_name_the_field(key, samples):
    _, vector, _ = samples
    with pytest.raises(InvalidParameterError, match="width.*1..=1024"):
        vector.fold(0, 4)
    with pytest.raises(InvalidParameterError, match="width"):
        vector.fold(1025, 1)
    with pytest.raises(InvalidParameterError, match="width"):
        vector.fold(-3, 1)
    with pytest.raises(InvalidParameterError, match="per"):
        vector.fold(8, 0)
    with pytest.raises(InvalidParameterError, match=r"per \* width = 16 \* 128 must be < key bits - 1 = 2047"):
        vector.fold(128, 16)
    assert vector.fold(127, 16).num_ciphertexts == 4


@pytest.mark.parametrize(("rows", "bits"), [(4, 20), (3, 64), (2, 1)])
def test_dot_is_bit_identical_to_naive_powers(key, samples, rows, bits):
    """out[j] = prod_i c_i^A[j,i] mod n^2 and decrypts to sum_i A[j,i] m_i mod n."""
    values, vector, cts = samples
    public = key.encryption_key
    n, n2 = public.n, public.n**2
    rng = np.random.default_rng(bits)
    top = 2**bits - 1
    matrix = rng.integers(0, top, (rows, len(values)), dtype=np.uint64, endpoint=True)
    matrix[0] = 0
    matrix[1, :5] = top
    out = vector.dot(matrix, bits, threads=2)
    assert out.num_ciphertexts == rows
    expected = []
    for j in range(rows):
        acc = 1
        for c, a in zip(cts, matrix[j].tolist(), strict=True):
            acc = acc * pow(c, a, n2) % n2
        expected.append(acc)
    assert expected[0] == 1
    assert _ints(out) == expected
    plain = key.decrypt_integers(out)
    for j in range(rows):
        assert plain[j] == sum(a * int(m) for a, m in zip(matrix[j].tolist(), values, strict=True)) % n


def test_dot_errors_name_the_field(key, samples):
    _, vector, _ = samples
    matrix = np.ones((2, 60), np.uint64)
    with pytest.raises(InvalidParameterError, match="bits.*1..=64"):
        vector.dot(matrix, 0)
    with pytest.raises(InvalidParameterError, match="bits"):
        vector.dot(matrix, 65)
    bad = matrix.copy()
    bad[1, 2] = 256
    with pytest.raises(
        InvalidParameterError, match=r"matrix\[1, 2\] = 256 must be < 2\^bits = 2\^8 \(row 1, column 2\)"
    ):
        vector.dot(bad, 8)
    with pytest.raises(InvalidParameterError, match="matrix.*61 elements, expected 60"):
        vector.dot(np.ones((2, 61), np.uint64), 8)
    with pytest.raises(InvalidParameterError, match="matrix values must be in"):
        vector.dot(-np.ones((2, 60), np.int64), 8)
    with pytest.raises(InvalidParameterError, match="C-contiguous"):
        vector._native.dot_u64(np.asfortranarray(matrix), 8)
    assert vector.dot(np.zeros((0, 60), np.uint64), 8).num_ciphertexts == 0
