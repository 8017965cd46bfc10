"""A SecureBoost guest's trees in XGBoost's JSON format: XGBoost scores as the federated model does."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from confide.errors import InvalidParameterError
from confide.vertical.estimators import SecureBoostClassifier, SecureBoostRegressor
from confide.vertical.secureboost.xgboost_json import guest_trees_json

xgb = pytest.importorskip("xgboost")

X, Y = load_breast_cancer(return_X_y=True)
NAMES = [f"f{i}" for i in range(10)]


def _xgboost_scores(model, tmp_path, X_guest) -> np.ndarray:
    path = tmp_path / "model.json"
    path.write_text(json.dumps(guest_trees_json(model, NAMES)))
    booster = xgb.Booster(model_file=str(path))
    return booster.predict(xgb.DMatrix(X_guest.astype(np.float32), feature_names=NAMES))


@pytest.mark.parametrize("kind", ["classifier", "regressor"])
def test_xgboost_scores_guest_only_trees_as_the_federated_model(tmp_path, kind):
    # The host's one column is constant: it never splits, so every split is the guest's.
    parts = {"guest": X[:, :10], "host": np.zeros((len(X), 1))}
    if kind == "classifier":
        model = SecureBoostClassifier(max_depth=3, learning_rate=0.3).fit(parts, Y)
        expected = model.predict_proba(parts)[:, 1]
    else:
        model = SecureBoostRegressor(max_depth=3, learning_rate=0.3).fit(parts, X[:, 12])
        expected = model.predict(parts)
    got = _xgboost_scores(model.guest_model, tmp_path, parts["guest"])
    # XGBoost compares float32 features with float32 thresholds; the federated model in float64.
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert len(model.guest_model.trees) >= 3


def test_trees_that_split_on_a_hosts_feature_are_refused_saying_why():
    parts = {"guest": X[:, :2], "host": X[:, 2:12]}
    model = SecureBoostClassifier(max_depth=3, learning_rate=0.3).fit(parts, Y)
    with pytest.raises(InvalidParameterError, match=r"split\(s\) of the model are on hosts' features \(host\)"):
        guest_trees_json(model.guest_model, NAMES[:2])


def test_multi_class_trees_export_one_per_class_and_round(tmp_path):
    parts = {"guest": X[:, :10], "host": np.zeros((len(X), 1))}
    labels = (X[:, 0] > 12).astype(int) + (X[:, 0] > 16)  # three classes by radius
    model = SecureBoostClassifier(max_depth=2, learning_rate=0.3).fit(parts, labels)
    assert model.params.objective == "multi:softprob" and len(model.guest_model.trees) % 3 == 0
    path = tmp_path / "multi.json"
    path.write_text(json.dumps(guest_trees_json(model.guest_model, NAMES)))
    got = xgb.Booster(model_file=str(path)).predict(xgb.DMatrix(parts["guest"].astype(np.float32), feature_names=NAMES))
    assert got.shape == (len(X), 3)
    np.testing.assert_allclose(got, model.predict_proba(parts), rtol=1e-5, atol=1e-5)
