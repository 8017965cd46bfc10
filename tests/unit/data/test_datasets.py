import time

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer

from confide.data import Federation, breast_cancer_feature_ranges, breast_cancer_federation, synthetic_lr
from confide.data.datasets import _parse_summary_ranges
from confide.errors import ConfideError, InvalidParameterError

# ---------------------------------------------------------------------- breast cancer


def _row_keys(X):
    return {row.tobytes() for row in X}


def test_published_ranges():
    names, lo, hi = breast_cancer_feature_ranges()
    assert len(names) == 30 and lo.shape == (30,) and hi.shape == (30,)
    assert names[0] == "mean radius" and names[10] == "radius error" and names[20] == "worst radius"
    assert (lo[0], hi[0]) == (6.981, 28.11)
    assert (lo[23], hi[23]) == (185.2, 4254.0)  # area (worst)
    assert (lo < hi).all()
    # the published ranges are a close, rounded description of the data
    raw = load_breast_cancer().data
    np.testing.assert_allclose(raw.min(axis=0), lo, atol=0.005)
    np.testing.assert_allclose(raw.max(axis=0), hi, rtol=0.01)


def test_parse_failures_are_loud():
    data = load_breast_cancer()
    names = [str(n) for n in data.feature_names]
    with pytest.raises(ConfideError, match="Summary Statistics"):
        _parse_summary_ranges("no table here", names)
    lines = data.DESCR.splitlines()
    dropped = "\n".join(line for line in lines if not line.startswith("area (worst)"))
    with pytest.raises(ConfideError, match="parsed 29 Min/Max rows, expected 30"):
        _parse_summary_ranges(dropped, names)
    with pytest.raises(ConfideError, match="expected"):
        _parse_summary_ranges(data.DESCR, names[::-1])


def test_iid_federation_shapes_and_split():
    fed = breast_cancer_federation(3, seed=0)
    assert isinstance(fed, Federation)
    assert len(fed.parts) == 3 and len(fed.feature_names) == 30
    Xt, yt = fed.test
    sizes = [X.shape[0] for X, _ in fed.parts]
    assert sum(sizes) + Xt.shape[0] == 569
    assert max(sizes) - min(sizes) <= 1
    for X, y in [*fed.parts, fed.test]:
        assert X.dtype == np.float64 and X.shape[1] == 30 and y.shape == (X.shape[0],)
        assert X.min() >= 0.0 and X.max() <= 1.0
        assert set(np.unique(y)) <= {0, 1}
    assert "3 parties" in fed.description and "iid" in fed.description
    # stratified: the test set has the data set's class balance (212 malignant / 357 benign)
    assert Xt.shape[0] == round(0.2 * 212) + round(0.2 * 357)
    assert (yt == 0).sum() == round(0.2 * 212)


def test_parties_and_test_are_disjoint_and_cover_the_data():
    fed = breast_cancer_federation(4, split="label_skew", seed=3)
    keys = [_row_keys(X) for X, _ in fed.parts] + [_row_keys(fed.test[0])]
    assert sum(len(k) for k in keys) == 569
    assert len(set().union(*keys)) == 569  # pairwise disjoint (the 569 scaled rows are distinct)


def test_scaling_uses_published_ranges():
    fed = breast_cancer_federation(2, seed=0)
    _, lo, hi = breast_cancer_feature_ranges()
    raw = load_breast_cancer()
    expected = np.clip((raw.data - lo) / (hi - lo), 0, 1)
    assert _row_keys(np.vstack([X for X, _ in fed.parts] + [fed.test[0]])) == _row_keys(expected)


def test_federation_is_deterministic_per_seed():
    a = breast_cancer_federation(3, split="label_skew", seed=1)
    b = breast_cancer_federation(3, split="label_skew", seed=1)
    c = breast_cancer_federation(3, split="label_skew", seed=2)
    for (Xa, ya), (Xb, yb) in zip(a.parts, b.parts, strict=True):
        np.testing.assert_array_equal(Xa, Xb)
        np.testing.assert_array_equal(ya, yb)
    np.testing.assert_array_equal(a.test[0], b.test[0])
    assert not np.array_equal(a.test[0], c.test[0])


def test_label_skew_really_skews():
    iid = breast_cancer_federation(4, seed=0)
    skewed = breast_cancer_federation(4, split="label_skew", skew=0.9, seed=0)
    rate = [y.mean() for _, y in skewed.parts]
    # parties 0 and 2 are malignant-heavy (label 0), parties 1 and 3 benign-heavy (label 1)
    assert max(rate[0], rate[2]) < 0.4 and min(rate[1], rate[3]) > 0.8
    assert max(y.mean() for _, y in iid.parts) - min(y.mean() for _, y in iid.parts) < 0.2
    for _, y in skewed.parts:
        assert (y == 0).sum() >= 10 and (y == 1).sum() >= 10


def test_label_skew_minimum_rows_per_class():
    fed = breast_cancer_federation(17, split="label_skew", skew=0.95, seed=0)
    for _, y in fed.parts:
        assert (y == 0).sum() >= 10 and (y == 1).sum() >= 10
    with pytest.raises(InvalidParameterError, match=r"^parties must be <= 17 for split='label_skew'"):
        breast_cancer_federation(18, split="label_skew")
    breast_cancer_federation(50)  # fine for iid


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"parties": 1}, r"parties must be in \[2, 50\], got 1"),
        ({"parties": 51}, r"parties must be in \[2, 50\], got 51"),
        ({"parties": 2.0}, "parties must be an integer"),
        ({"split": "dirichlet"}, "split must be 'iid' or 'label_skew'"),
        ({"skew": 0.4}, r"skew must be in \[0.5, 1\)"),
        ({"skew": 1.0}, r"skew must be in \[0.5, 1\)"),
        ({"test_fraction": 0.0}, r"test_fraction must be in \(0, 0.5\]"),
        ({"test_fraction": 0.6}, r"test_fraction must be in \(0, 0.5\]"),
        ({"test_fraction": float("nan")}, "test_fraction must be a finite"),
        ({"seed": -1}, "seed must be >= 0"),
    ],
)
def test_federation_bad_arguments(kwargs, message):
    with pytest.raises(InvalidParameterError, match=message):
        breast_cancer_federation(**kwargs)


# ---------------------------------------------------------------------- synthetic


def test_synthetic_dense_shard():
    Xtr, ytr, Xte, yte = synthetic_lr(1, 4, samples=4003, features=50, seed=0)
    assert Xtr.dtype == Xte.dtype == np.float32
    assert Xtr.shape == (900, 50) and Xte.shape == (100, 50)
    assert ytr.shape == (900,) and yte.shape == (100,)
    assert set(np.unique(ytr)) == {0, 1}
    last = synthetic_lr(3, 4, samples=4003, features=50, seed=0)
    assert last[0].shape[0] + last[2].shape[0] == 1003  # the last party takes the remainder
    # feature j has spread j^-0.6 around its per-party mean
    X = np.vstack([Xtr, Xte])
    np.testing.assert_allclose(X.std(axis=0), np.arange(1, 51) ** -0.6, rtol=0.15)


def test_synthetic_is_deterministic_per_seed_and_party():
    a = synthetic_lr(2, 5, samples=1000, features=20, seed=7)
    b = synthetic_lr(2, 5, samples=1000, features=20, seed=7)
    for x, z in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, z)
    other_party = synthetic_lr(3, 5, samples=1000, features=20, seed=7)
    other_seed = synthetic_lr(2, 5, samples=1000, features=20, seed=8)
    assert not np.array_equal(a[0], other_party[0])
    assert not np.array_equal(a[0], other_seed[0])
    # a shard depends on (seed, party) and its size only, not on how many other parties there are
    same_size = synthetic_lr(2, 10, samples=2000, features=20, seed=7)
    np.testing.assert_array_equal(a[0], same_size[0])


def test_synthetic_parties_differ():
    shards = [synthetic_lr(k, 3, samples=3000, features=30, alpha=1.0, beta=1.0) for k in range(3)]
    means = [np.vstack([s[0], s[2]]).mean(axis=0) for s in shards]
    # v_k ~ N(B_k, 1)^d is drawn per party, so the feature means differ
    assert np.abs(means[0] - means[1]).mean() > 0.2 and np.abs(means[1] - means[2]).mean() > 0.2
    for s in shards:
        assert set(np.unique(s[1])) == {0, 1}


def test_synthetic_sparse_shard():
    d, density = 20_000, 0.002
    Xtr, ytr, Xte, yte = synthetic_lr(0, 2, samples=4000, features=d, density=density, seed=1, test_fraction=0.25)
    for X in (Xtr, Xte):
        assert sp.issparse(X) and X.format == "csr" and X.dtype == np.float32
        assert X.has_canonical_format
    assert Xtr.shape == (1500, d) and Xte.shape == (500, d)
    nnz = Xtr.nnz + Xte.nnz
    assert abs(nnz / (2000 * d) - density) < 0.1 * density
    assert np.isfinite(Xtr.data).all() and (Xtr.data != 0).all()
    assert set(np.unique(ytr)) == {0, 1}
    again = synthetic_lr(0, 2, samples=4000, features=d, density=density, seed=1, test_fraction=0.25)
    assert (again[0] != Xtr).nnz == 0
    np.testing.assert_array_equal(again[1], ytr)
    other = synthetic_lr(1, 2, samples=4000, features=d, density=density, seed=1, test_fraction=0.25)
    assert (other[0] != Xtr).nnz > 0


def test_synthetic_sparse_full_density_and_no_test():
    Xtr, ytr, Xte, yte = synthetic_lr(0, 1, samples=50, features=8, density=1.0, test_fraction=0.0)
    assert Xtr.nnz == 50 * 8 and Xte.shape == (0, 8) and yte.shape == (0,)


def test_synthetic_labels_are_recentred_when_one_sided():
    # with many features v_k . W_k dominates the per-row noise: without recentring, one class only
    Xtr, ytr, Xte, yte = synthetic_lr(0, 1, samples=2000, features=2000, seed=0)
    y = np.concatenate([ytr, yte])
    assert y.mean() == pytest.approx(0.5, abs=0.01)


def test_synthetic_speed():
    t = time.perf_counter()
    Xtr, *_ = synthetic_lr(0, 1, samples=25_000, features=1_000)
    assert time.perf_counter() - t < 2.0
    t = time.perf_counter()
    Xs, *_ = synthetic_lr(0, 4, samples=20_000, features=100_000, density=0.001)
    assert time.perf_counter() - t < 2.0
    assert Xs.shape == (4_500, 100_000)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0, 0), {}, r"parties must be in \[1, 100000\]"),
        ((3, 3), {}, r"party must be in \[0, 2\], got 3"),
        ((-1, 3), {}, r"party must be in \[0, 2\], got -1"),
        ((0, 3), {"samples": 29}, r"samples must be in \[30, "),
        ((0, 3), {"features": 0}, r"features must be in \[1, "),
        ((0, 3), {"density": 0.0}, r"density must be in \(0, 1\]"),
        ((0, 3), {"density": 1.5}, r"density must be in \(0, 1\]"),
        ((0, 3), {"alpha": -1.0}, "alpha must be >= 0"),
        ((0, 3), {"beta": float("inf")}, "beta must be a finite"),
        ((0, 3), {"seed": 1.5}, "seed must be an integer"),
        ((0, 3), {"test_fraction": 0.7}, r"test_fraction must be in \[0, 0.5\]"),
        ((0, 1), {"samples": 100_000, "features": 100_000}, "pass density for a sparse shard"),
    ],
)
def test_synthetic_bad_arguments(args, kwargs, message):
    full = {"samples": 300, "features": 10, **kwargs}
    with pytest.raises(InvalidParameterError, match=message):
        synthetic_lr(*args, **full)


def test_text_documents_carry_their_class_keywords_and_are_dealt_without_overlap():
    from confide.data import text_federation

    federation = text_federation(3, samples=600, length=20, classes=3, vocabulary=300, seed=4)
    X_test, y_test = federation.test
    X = np.concatenate([part[0] for part in federation.parts] + [X_test])
    y = np.concatenate([part[1] for part in federation.parts] + [y_test])
    assert X.shape == (600, 20) and X.dtype == np.int64 and set(np.unique(y)) == {0, 1, 2}
    assert X.min() == 0 and X.max() < 300
    lengths = (X != 0).sum(axis=1)
    assert lengths.min() >= 10 and lengths.max() <= 20
    assert ((X != 0)[:, :-1] >= (X != 0)[:, 1:]).all()  # padding only at the end
    counts = np.stack([((X >= 1 + 4 * c) & (X < 5 + 4 * c)).sum(axis=1) for c in range(3)], axis=1)
    assert (counts[np.arange(600), y] == 2).all() and (counts.argmax(axis=1) == y).all()
    rows = np.concatenate(federation.part_rows)
    assert len(np.unique(rows)) == rows.size == 600 - len(y_test)
    again = text_federation(3, samples=600, length=20, classes=3, vocabulary=300, seed=4)
    assert (again.parts[1][0] == federation.parts[1][0]).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length": 3}, r"example_shape\[0\] \(the sequence length\) must be in \[4, "),
        ({"vocabulary": 9}, r"vocabulary must be in \[10, "),
        ({"classes": 1}, r"classes must be in \[2, 100\]"),
    ],
)
def test_text_bad_arguments_name_the_field(kwargs, message):
    from confide.data import text_federation

    with pytest.raises(InvalidParameterError, match=message):
        text_federation(2, **{"samples": 100, **kwargs})
