"""A softmax regression whose party can poison its update: the attacker of benchmarks/robust_bench.py.

Loaded as a custom model (``model: {algorithm: custom, entry: "benchmarks/attack_model.py:build"}``).
Every party trains the same multinomial logistic regression (minibatch gradient descent on the
cross-entropy); the party whose environment sets ``CONFIDE_ATTACK`` then replaces its change
``d = w_local - w_global`` before it leaves:

- ``scale:S``: ``S * d`` (a model-replacement / boosting attack, S = 100 in the issue);
- ``sign_flip``: ``-4 * d`` (gradient ascent, boosted);
- ``overflow``: ``d`` plus 2^20 in its first value (what a lane overflow aims at: one value past
  any bound the others respect).

Nothing else differs from an honest party, so what a defence achieves is visible in the accuracy.
"""

from __future__ import annotations

import os

import numpy as np

from confide.ml.base import FitResult, classification_metrics


class SoftmaxRegression:
    """Multinomial logistic regression in numpy, poisoned by ``CONFIDE_ATTACK`` when it is set."""

    def __init__(self, learning_rate: float = 0.5, epochs: int = 1, batch_size: int = 64, attack: str = "") -> None:
        self.learning_rate = learning_rate
        self.epochs = epochs
        self.batch_size = batch_size
        self.attack = attack
        self.w: dict[str, np.ndarray] = {}
        self.classes = 2

    def build(self, example_shape, classes):
        d = int(np.prod(example_shape))
        self.classes = max(2, int(classes))
        self.w = {"softmax/w": np.zeros((d, self.classes)), "softmax/b": np.zeros(self.classes)}

    def get_weights(self):
        return {k: v.copy() for k, v in self.w.items()}

    def set_weights(self, weights):
        self.w = {k: np.array(v, dtype=np.float64) for k, v in weights.items()}

    def _scores(self, X):
        return np.asarray(X, dtype=np.float64).reshape(len(X), -1) @ self.w["softmax/w"] + self.w["softmax/b"]

    def fit(self, X, y, config):
        X = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
        y = np.asarray(y).astype(int)
        start = self.get_weights()
        rng = np.random.default_rng(abs(hash(config.seed)) % 2**32)
        loss = 0.0
        for _ in range(self.epochs):
            order = rng.permutation(len(X))
            for begin in range(0, len(X), self.batch_size):
                batch = order[begin : begin + self.batch_size]
                scores = X[batch] @ self.w["softmax/w"] + self.w["softmax/b"]
                scores -= scores.max(axis=1, keepdims=True)
                p = np.exp(scores)
                p /= p.sum(axis=1, keepdims=True)
                loss = float(-np.log(p[np.arange(len(batch)), y[batch]] + 1e-12).mean())
                p[np.arange(len(batch)), y[batch]] -= 1.0
                self.w["softmax/w"] -= self.learning_rate * X[batch].T @ p / len(batch)
                self.w["softmax/b"] -= self.learning_rate * p.mean(axis=0)
        self._poison(start)
        return FitResult(len(X), {"loss": loss})

    def _poison(self, start: dict[str, np.ndarray]) -> None:
        if not self.attack:
            return
        for name, before in start.items():
            change = self.w[name] - before
            if self.attack.startswith("scale:"):
                change *= float(self.attack.split(":", 1)[1])
            elif self.attack == "sign_flip":
                change *= -4.0
            elif self.attack == "overflow" and name == "softmax/w":
                change.flat[0] += 2.0**20
            self.w[name] = before + change

    def evaluate(self, X, y, metrics):
        scores = self._scores(X)
        shifted = scores - scores.max(axis=1, keepdims=True)
        p = np.exp(shifted)
        p /= p.sum(axis=1, keepdims=True)
        y = np.asarray(y).astype(int)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean()) if len(y) else 0.0
        return classification_metrics(scores, y, metrics, loss)


def build(learning_rate: float = 0.5, epochs: int = 1, batch_size: int = 64):
    """The model of this party: poisoned as ``CONFIDE_ATTACK`` says (unset: honest)."""
    return SoftmaxRegression(learning_rate, int(epochs), int(batch_size), os.environ.get("CONFIDE_ATTACK", ""))
