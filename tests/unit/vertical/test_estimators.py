"""The scikit-learn-style estimators run the real protocols, one thread per party."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, make_regression
from sklearn.metrics import r2_score, roc_auc_score

from confide.errors import InvalidParameterError
from confide.vertical.estimators import HeteroLogisticRegression, SecureBoostClassifier, SecureBoostRegressor


@pytest.fixture(scope="module")
def breast():
    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(2).permutation(len(y))
    X, y = X[order], y[order]
    split = 450
    return ({"bank": X[:split, :10], "shop": X[:split, 10:]}, y[:split]), (
        {"bank": X[split:, :10], "shop": X[split:, 10:]},
        y[split:],
    )


def test_secureboost_classifier_fits_predicts_and_round_trips_its_parts(breast, tmp_path):
    (train, y), (test, y_test) = breast
    model = SecureBoostClassifier(n_trees=3, max_depth=3).fit(train, y, guest="bank")
    proba = model.predict_proba(test)
    assert proba.shape == (len(y_test), 2)
    assert roc_auc_score(y_test, proba[:, 1]) > 0.97
    assert set(model.predict(test)) <= {0, 1}
    loaded = SecureBoostClassifier.from_parts(model.save_parts(tmp_path))
    np.testing.assert_array_equal(loaded.predict_proba(test), proba)


@pytest.mark.slow
def test_secureboost_classifier_takes_multiclass_labels_from_the_data(tmp_path):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    keep = y < 4  # four classes keep the test quick
    X, y = X[keep][:400], y[keep][:400]
    parts = {"clinic": X[:300, :32], "lab": X[:300, 32:]}
    model = SecureBoostClassifier(n_trees=2, max_depth=3).fit(parts, y[:300], guest="clinic")
    assert model.params.objective == "multi:softprob" and model.params.num_class == 4
    held_out = {"clinic": X[300:, :32], "lab": X[300:, 32:]}
    proba = model.predict_proba(held_out)
    assert proba.shape == (100, 4) and np.allclose(proba.sum(axis=1), 1.0)
    assert np.mean(model.predict(held_out) == y[300:]) > 0.85
    loaded = SecureBoostClassifier.from_parts(model.save_parts(tmp_path))
    np.testing.assert_array_equal(loaded.predict_proba(held_out), proba)


def test_secureboost_regressor():
    X, y = make_regression(n_samples=400, n_features=8, noise=5.0, random_state=0)
    parts = {"g": X[:, :3], "h": X[:, 3:]}
    model = SecureBoostRegressor(n_trees=5, max_depth=3, learning_rate=0.5).fit(parts, y)
    assert r2_score(y, model.predict(parts)) > 0.6


@pytest.mark.slow
def test_hetero_logistic_regression(breast):
    (train, y), (test, y_test) = breast
    model = HeteroLogisticRegression(epochs=3, batch_size=64).fit(train, y, guest="bank")
    assert roc_auc_score(y_test, model.predict_proba(test)[:, 1]) > 0.98


def test_estimator_input_errors(breast):
    (train, y), _ = breast
    with pytest.raises(InvalidParameterError, match="at least two"):
        SecureBoostClassifier().fit({"bank": train["bank"]}, y)
    with pytest.raises(InvalidParameterError, match="same rows"):
        SecureBoostClassifier().fit({"bank": train["bank"], "shop": train["shop"][:10]}, y)
    with pytest.raises(InvalidParameterError, match="unknown SecureBoost parameters"):
        SecureBoostClassifier(depth=3)
    with pytest.raises(InvalidParameterError, match="not fitted"):
        SecureBoostClassifier().predict(train)


@pytest.mark.slow
def test_the_documented_route_aligns_own_tables_with_psi_then_fits(tmp_path):
    """docs/vertical.md, "In one process, with your own tables"."""
    from confide.vertical import psi
    from confide.vertical.channel import LocalChannel, run_parties

    X, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(5)
    bank_rows = np.sort(rng.choice(len(y), 500, replace=False))
    shop_rows = rng.permutation(rng.choice(len(y), 520, replace=False))
    bank_ids = [f"client-{i}" for i in bank_rows]
    shop_ids = [f"client-{i}" for i in shop_rows]
    X_bank, y_bank, X_shop = X[bank_rows, :10], y[bank_rows], X[shop_rows, 10:]

    ids = {"bank": bank_ids, "shop": shop_ids}
    channels = LocalChannel.group(["bank", "shop"])
    rows = run_parties(
        {
            p: (
                lambda p=p: psi.intersect(
                    channels[p], ids[p], role="guest" if p == "bank" else "host", guest="bank", hosts=["shop"],
                    session="align",
                )
            )
            for p in ids
        }
    )  # fmt: skip
    assert [bank_ids[i] for i in rows["bank"]] == [shop_ids[i] for i in rows["shop"]]
    parts = {"bank": X_bank[rows["bank"]], "shop": X_shop[rows["shop"]]}
    model = SecureBoostClassifier(n_trees=5, max_depth=3).fit(parts, y_bank[rows["bank"]], guest="bank")
    assert roc_auc_score(y_bank[rows["bank"]], model.predict_proba(parts)[:, 1]) > 0.97
    assert {r["party"] for r in model.feature_importance()} <= {"guest", "shop"}
    assert set(model.save_parts(tmp_path / "parts")) == {"bank", "shop"}
