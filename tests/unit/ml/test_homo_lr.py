import time

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from confide.data import breast_cancer_federation
from confide.errors import InvalidParameterError
from confide.ml import HomoLR


@pytest.fixture(scope="module")
def cancer():
    fed = breast_cancer_federation(3, seed=0)
    X = np.vstack([X for X, _ in fed.parts])
    y = np.concatenate([y for _, y in fed.parts])
    return X, y, fed.test[0], fed.test[1]


def _toy(n=300, d=8, seed=1, dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    w = rng.standard_normal(d)
    y = (X @ w + 0.3 * rng.standard_normal(n) > 0).astype(np.int64)
    return X, y


def test_breast_cancer_auc_matches_sklearn(cancer):
    X, y, Xt, yt = cancer
    model = HomoLR(learning_rate=0.5, batch_size=32, seed=0).fit(X, y, epochs=50)
    auc = roc_auc_score(yt, model.predict_proba(Xt)[:, 1])
    ref = LogisticRegression(max_iter=5000).fit(X, y)
    ref_auc = roc_auc_score(yt, ref.predict_proba(Xt)[:, 1])
    assert auc >= 0.98
    assert abs(auc - ref_auc) <= 0.01
    assert model.n_features_in_ == 30
    assert model.coef_.dtype == np.float64 and model.coef_.shape == (30,)


def test_predictions_are_consistent(cancer):
    X, y, Xt, _ = cancer
    model = HomoLR(learning_rate=0.5, batch_size=32).fit(X, y, epochs=5)
    proba = model.predict_proba(Xt)
    assert proba.shape == (Xt.shape[0], 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    z = model.decision_function(Xt)
    np.testing.assert_allclose(z, Xt @ model.coef_ + model.intercept_)
    np.testing.assert_array_equal(model.predict(Xt), (proba[:, 1] > 0.5).astype(int))
    assert set(np.unique(model.predict(Xt))) <= {0, 1}


def test_loss_decreases_and_matches_formula():
    X, y = _toy()
    model = HomoLR(learning_rate=0.2, batch_size=16, l2=0.01)
    model.initialize(X.shape[1])
    assert model.loss(X, y) == pytest.approx(np.log(2))
    loss = model.local_train(X, y, epochs=5)
    assert loss < 0.5
    z = X @ model.coef_ + model.intercept_
    expected = np.mean(np.logaddexp(0, z) - y * z) + 0.005 * model.coef_ @ model.coef_
    assert loss == pytest.approx(expected, rel=1e-12)


def test_loss_is_stable_for_huge_logits():
    model = HomoLR()
    model.set_weights([1000.0, 0.0])
    X = np.array([[1.0], [-1.0]])
    assert model.loss(X, [1, 0]) == pytest.approx(0.0, abs=1e-12)
    assert model.loss(X, [0, 1]) == pytest.approx(1000.0)
    np.testing.assert_array_equal(model.predict_proba(X), [[0.0, 1.0], [1.0, 0.0]])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sparse_and_dense_agree(dtype):
    X, y = _toy(dtype=dtype)
    X[np.abs(X) < 0.8] = 0  # make it genuinely sparse
    Xs = sp.csr_matrix(X)
    dense, sparse = HomoLR(batch_size=32, l2=0.01, seed=3), HomoLR(batch_size=32, l2=0.01, seed=3)
    for m in (dense, sparse):
        m.initialize(X.shape[1])
    loss_d = dense.local_train(X, y, epochs=3)
    loss_s = sparse.local_train(Xs, y, epochs=3)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(sparse.get_weights(), dense.get_weights(), rtol=tol, atol=tol)
    assert loss_s == pytest.approx(loss_d, rel=tol)
    np.testing.assert_allclose(sparse.predict_proba(Xs), dense.predict_proba(X), rtol=tol, atol=tol)
    # csr_array, and other sparse formats (converted to CSR, never densified), work too
    np.testing.assert_allclose(sparse.decision_function(sp.csr_array(Xs)), dense.decision_function(X), atol=tol)
    np.testing.assert_allclose(sparse.decision_function(Xs.tocoo()), dense.decision_function(X), atol=tol)


def test_local_train_is_deterministic_per_seed():
    X, y = _toy()
    runs = []
    for seed in (7, 7, 8):
        m = HomoLR(learning_rate=0.3, batch_size=10, seed=seed)
        m.initialize(X.shape[1])
        m.local_train(X, y)
        m.local_train(X, y, epochs=2)
        runs.append(m.get_weights())
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_local_train_starts_from_set_weights():
    X, y = _toy()
    a, b = HomoLR(seed=1), HomoLR(seed=1)
    a.initialize(X.shape[1])
    a.local_train(X, y, epochs=2)
    b.set_weights(a.get_weights())
    np.testing.assert_array_equal(b.get_weights(), a.get_weights())
    a.local_train(X, y)
    b.local_train(X, y)
    assert not np.array_equal(a.get_weights(), b.get_weights())  # different generator positions
    w = a.get_weights()
    w[0] = 123.0  # get_weights is a copy
    assert a.get_weights()[0] != 123.0


def test_local_train_keeps_float32():
    X, y = _toy(n=1000, d=50, dtype=np.float32)
    m = HomoLR(batch_size=64)
    m.initialize(50)
    loss = m.local_train(X, y, epochs=2)
    assert isinstance(loss, float) and loss < 0.6
    assert m.get_weights().dtype == np.float64
    assert X.dtype == np.float32


def test_local_train_speed_dense_and_sparse():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((25_000, 1_000), dtype=np.float32)
    y = (X[:, 0] > 0).astype(np.int8)
    m = HomoLR(batch_size=256)
    m.initialize(1_000)
    t = time.perf_counter()
    m.local_train(X, y, epochs=5)
    assert time.perf_counter() - t < 1.0
    n, d, k = 5_000, 100_000, 100
    indptr = np.arange(0, n * k + 1, k)
    Xs = sp.csr_matrix((rng.random(n * k, dtype=np.float32), rng.integers(0, d, n * k), indptr), shape=(n, d))
    ys = rng.integers(0, 2, n)
    m = HomoLR(batch_size=256)
    m.initialize(d)
    t = time.perf_counter()
    m.local_train(Xs, ys, epochs=1)
    assert time.perf_counter() - t < 1.0


def test_save_load_round_trip(tmp_path, cancer):
    X, y, Xt, _ = cancer
    m = HomoLR(learning_rate=0.25, local_epochs=3, batch_size=17, l2=0.001, seed=5).fit(X, y, epochs=2)
    path = tmp_path / "model.bin"
    m.save(path)
    assert path.exists()  # written at exactly the given path
    m2 = HomoLR.load(path)
    np.testing.assert_array_equal(m2.get_weights(), m.get_weights())
    assert repr(m2) == repr(m)
    np.testing.assert_array_equal(m2.predict_proba(Xt), m.predict_proba(Xt))
    # a loaded model restarts its generator from seed
    fresh = HomoLR(learning_rate=0.25, local_epochs=3, batch_size=17, l2=0.001, seed=5)
    fresh.set_weights(m.get_weights())
    fresh.local_train(X, y)
    m2.local_train(X, y)
    np.testing.assert_array_equal(m2.get_weights(), fresh.get_weights())


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a model")
    with pytest.raises(InvalidParameterError, match="path"):
        HomoLR.load(bad)
    other = tmp_path / "other.npz"
    np.savez(other, weights=np.zeros(3))
    with pytest.raises(InvalidParameterError, match="not a saved HomoLR"):
        HomoLR.load(other)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"learning_rate": 0}, "learning_rate"),
        ({"learning_rate": -1}, "learning_rate"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"learning_rate": "fast"}, "learning_rate"),
        ({"local_epochs": 0}, "local_epochs"),
        ({"local_epochs": 1.5}, "local_epochs"),
        ({"batch_size": -1}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"l2": -0.1}, "l2"),
        ({"l2": float("inf")}, "l2"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_hyper_parameters(kwargs, field):
    with pytest.raises(InvalidParameterError, match=field):
        HomoLR(**kwargs)


def test_bad_labels():
    X, y = _toy(n=20, d=3)
    m = HomoLR()
    m.initialize(3)
    with pytest.raises(InvalidParameterError, match=r"^y must be binary"):
        m.local_train(X, np.where(y == 1, 1, -1))
    with pytest.raises(InvalidParameterError, match=r"^y must have one label per row"):
        m.local_train(X, y[:-1])
    with pytest.raises(InvalidParameterError, match=r"^y must be 1-D"):
        m.local_train(X, np.stack([y, y], axis=1))
    with pytest.raises(InvalidParameterError, match=r"^y must be binary"):
        m.loss(X, np.full(20, np.nan))
    with pytest.raises(InvalidParameterError, match=r"^y must hold"):
        m.fit(X, np.array(["a"] * 20))
    m.local_train(X, y.astype(bool))  # bool and float 0/1 labels are fine
    m.local_train(X, y.astype(np.float32).reshape(-1, 1))


def test_bad_features():
    X, y = _toy(n=20, d=3)
    m = HomoLR()
    with pytest.raises(InvalidParameterError, match="not initialized"):
        m.local_train(X, y)
    with pytest.raises(InvalidParameterError, match="not initialized"):
        m.predict(X)
    m.initialize(3)
    with pytest.raises(InvalidParameterError, match="X must have n_features_in_ = 3"):
        m.local_train(X[:, :2], y)
    with pytest.raises(InvalidParameterError, match="X must be 2-D"):
        m.predict(X[0])
    bad = X.copy()
    bad[0, 0] = np.inf
    with pytest.raises(InvalidParameterError, match="X must be finite"):
        m.local_train(bad, y)
    with pytest.raises(InvalidParameterError, match="X must be finite"):
        m.local_train(sp.csr_matrix(bad), y)
    with pytest.raises(InvalidParameterError, match="epochs must be >= 1"):
        m.local_train(X, y, epochs=0)
    with pytest.raises(InvalidParameterError, match="n_features must be in"):
        m.initialize(0)


def test_bad_weights():
    m = HomoLR()
    m.initialize(4)
    with pytest.raises(InvalidParameterError, match=r"weights must have length n_features \+ 1 = 5, got 4"):
        m.set_weights(np.zeros(4))
    with pytest.raises(InvalidParameterError, match="weights must be finite"):
        m.set_weights([0, 0, np.nan, 0, 0])
    with pytest.raises(InvalidParameterError, match="weights must be finite"):
        m.set_weights([0, 0, 0, np.inf, 0])
    with pytest.raises(InvalidParameterError, match="weights must be 1-D"):
        m.set_weights(np.zeros((5, 1)))
    with pytest.raises(InvalidParameterError, match="weights must be"):
        m.set_weights(["a", "b", "c", "d", "e"])
    fresh = HomoLR()
    with pytest.raises(InvalidParameterError, match="weights must have length in"):
        fresh.set_weights([1.0])
    fresh.set_weights([1.0, 2.0, 3.0])  # an uninitialised model takes d from the length
    assert fresh.n_features_in_ == 2 and fresh.intercept_ == 3.0
    np.testing.assert_array_equal(fresh.coef_, [1.0, 2.0])


def test_divergence_is_reported_and_leaves_the_model_unchanged():
    X = np.array([[1e300, -1e300], [-1e300, 1e300]])
    m = HomoLR(learning_rate=1e10)
    m.set_weights([0.5, 0.25, 0.125])
    with pytest.raises(InvalidParameterError, match="learning_rate"):
        m.local_train(X, [0, 1], epochs=3)
    np.testing.assert_array_equal(m.get_weights(), [0.5, 0.25, 0.125])


def test_batch_size_zero_is_one_full_batch_step_per_epoch():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] > 0).astype(float)
    full = HomoLR(learning_rate=0.5, batch_size=0, local_epochs=3, seed=1)
    whole = HomoLR(learning_rate=0.5, batch_size=200, local_epochs=3, seed=1)
    full.initialize(3)
    whole.initialize(3)
    full.local_train(X, y)
    whole.local_train(X, y)
    assert np.allclose(full.get_weights(), whole.get_weights(), rtol=0, atol=1e-14)
