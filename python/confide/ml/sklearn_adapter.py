"""A scikit-learn linear estimator with ``partial_fit`` behind the model seam.

Weights are the estimator's ``coef_`` and ``intercept_`` (``sgd/coef``, ``sgd/intercept``; one
layer, one dACIQ threshold). A round runs ``epochs`` passes of ``partial_fit`` over the party's
rows in the round's seeded order, from the global weights. Works with ``SGDClassifier``,
``SGDRegressor``, ``Perceptron`` and ``PassiveAggressiveClassifier``::

    from sklearn.linear_model import SGDClassifier
    from confide.ml.sklearn_adapter import SklearnModel

    def federated_model():                     # model.entry: "my_model.py:federated_model"
        return SklearnModel(SGDClassifier(loss="log_loss", alpha=1e-4))

FedProx's proximal pull ``w <- w - eta mu (w - w_global)`` (``eta`` the estimator's ``eta0``) runs
after every pass, since ``partial_fit`` exposes no per-step hook.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.base import FitConfig, FitResult, Weights, classification_metrics

__all__ = ["SklearnModel"]


class SklearnModel:
    """``partial_fit`` + ``coef_``/``intercept_`` as a :class:`FederatedModel`."""

    def __init__(self, estimator: Any, *, epochs: int = 1) -> None:
        if not hasattr(estimator, "partial_fit"):
            raise InvalidParameterError(
                f"SklearnModel needs an estimator with partial_fit, got {type(estimator).__name__}"
            )
        self.estimator = estimator
        self.epochs = int(epochs)
        self.classes: np.ndarray | None = None
        self._regression = (
            not hasattr(estimator, "classes_")
            and not hasattr(estimator, "predict_proba")
            and "Regressor" in type(estimator).__name__
        )

    def build(self, example_shape: tuple[int, ...], classes: int) -> None:
        """Zero weights for ``example_shape = (d,)`` and ``classes`` labels."""
        if len(example_shape) != 1:
            raise InvalidParameterError(f"SklearnModel takes rows of features, got examples of shape {example_shape}")
        d = example_shape[0]
        if self._regression or not classes:
            self.estimator.coef_ = np.zeros(d)
            self.estimator.intercept_ = np.zeros(1)
            return
        self.classes = np.arange(classes)
        rows = 1 if classes == 2 else classes
        self.estimator.classes_ = self.classes
        self.estimator.coef_ = np.zeros((rows, d))
        self.estimator.intercept_ = np.zeros(rows)

    def get_weights(self) -> Weights:
        """``sgd/coef`` and ``sgd/intercept``."""
        return {
            "sgd/coef": np.array(self.estimator.coef_, dtype=np.float64),
            "sgd/intercept": np.array(self.estimator.intercept_, dtype=np.float64),
        }

    def set_weights(self, weights: Weights) -> None:
        """Assign them."""
        self.estimator.coef_ = np.array(weights["sgd/coef"], dtype=np.float64)
        self.estimator.intercept_ = np.array(weights["sgd/intercept"], dtype=np.float64)

    def fit(self, X: Any, y: np.ndarray, config: FitConfig) -> FitResult:
        """``epochs`` passes of ``partial_fit`` in the round's order."""
        rng = np.random.default_rng(list(config.seed))
        X, y = np.asarray(X), np.asarray(y)
        for _ in range(config.epochs or self.epochs):
            order = rng.permutation(len(y))
            if self.classes is not None:
                self.estimator.partial_fit(X[order], y[order], classes=self.classes)
            else:
                self.estimator.partial_fit(X[order], y[order])
            if config.proximal_mu > 0 and config.global_weights is not None:
                pull = min(1.0, float(getattr(self.estimator, "eta0", 0.01) or 0.01) * config.proximal_mu)
                for name, attribute in (("sgd/coef", "coef_"), ("sgd/intercept", "intercept_")):
                    value = getattr(self.estimator, attribute)
                    setattr(self.estimator, attribute, value - pull * (value - config.global_weights[name]))
        return FitResult(num_examples=len(y), metrics={})

    def predict(self, X: Any) -> np.ndarray:
        """Probabilities where the estimator gives them (P(label = 1) if binary), else its prediction."""
        X = np.asarray(X)
        if self.classes is not None and hasattr(self.estimator, "predict_proba"):
            try:
                probabilities = self.estimator.predict_proba(X)
            except AttributeError:  # e.g. SGDClassifier with a loss that has no probabilities
                return np.asarray(self.estimator.decision_function(X), dtype=np.float64)
            return probabilities[:, 1] if probabilities.shape[1] == 2 else probabilities
        return np.asarray(self.estimator.predict(X), dtype=np.float64)

    def evaluate(self, X: Any, y: np.ndarray, metrics: list[str]) -> dict[str, float]:
        """Log loss where the estimator gives probabilities, else squared error; accuracy and AUC."""
        X, y = np.asarray(X), np.asarray(y)
        if self.classes is None:
            error = self.estimator.predict(X) - y
            return {"loss": float(np.mean(error**2))}
        scores = self.estimator.decision_function(X)
        if hasattr(self.estimator, "predict_proba") and getattr(self.estimator, "loss", "") == "log_loss":
            from sklearn.metrics import log_loss

            loss = log_loss(y, self.estimator.predict_proba(X), labels=self.classes)
        else:
            loss = float(np.mean(self.estimator.predict(X) != y))
        return classification_metrics(np.asarray(scores), y, metrics, loss)
