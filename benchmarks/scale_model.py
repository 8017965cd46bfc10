"""The large model of ``scale_bench.py``: Keras Dense 1000 -> N -> 10 on random inputs, Adam.

A party loads it through the own-code route (``model.algorithm: custom``, ``model.entry``
``benchmarks/scale_model.py:dense``). ``build`` makes the network, compiles it with Adam and
runs one local step and one evaluation, so the weights, the optimizer's slots and the
framework's compiled functions exist; then it
records the process's resident set (the baseline) and, at exit, its peak, to
``$CONFIDE_SCALE_MEMORY_DIR/<party>.json``. What the party adds beyond the baseline is
Confide's. Local training and evaluation use the party's own random rows (seeded by party and
round): the benchmark is about size, not accuracy.

``python benchmarks/scale_model.py PARAMETERS ROUNDS`` trains the same network alone for
``ROUNDS`` local fits and prints its baseline and peak: the framework's own growth, the anchor.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys

import numpy as np

from confide.party.memory import resident_bytes

FEATURES, CLASSES, BATCH, STEPS = 1000, 10, 32, 2


def hidden_units(parameters: int) -> int:
    """N such that Dense 1000 -> N -> 10 holds about ``parameters`` values (1011 N + 10)."""
    return max(1, (parameters - CLASSES) // (FEATURES + 1 + CLASSES))


class DenseModel:
    """The FederatedModel protocol over a Keras Sequential network."""

    def __init__(self, parameters: int, party: str, seed: int = 7) -> None:
        self.parameters, self.party, self.seed = parameters, party, seed
        self.model = None
        self.baseline_kib = 0

    def _rows(self, salt: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, salt, sum(map(ord, self.party))])
        X = rng.standard_normal((BATCH * STEPS, FEATURES), dtype=np.float32)
        return X, rng.integers(0, CLASSES, BATCH * STEPS)

    def build(self, example_shape=None, classes=None) -> None:
        os.environ.setdefault("KERAS_BACKEND", "jax")
        import keras

        keras.utils.set_random_seed(self.seed)  # the same initial weights at every party
        units = hidden_units(self.parameters)
        self.model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(units, activation="relu", name="hidden"),
                keras.layers.Dense(CLASSES, name="out"),
            ]
        )
        self.model.compile(
            optimizer=keras.optimizers.Adam(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        X, y = self._rows(0)
        # One local step and one evaluation through the calls a round makes: the optimizer's slots and
        # the framework's compiled functions exist before the baseline is read.
        self.model.fit(X[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
        self.model.evaluate(X[:BATCH], y[:BATCH], verbose=0)
        gc.collect()
        self.baseline_kib = resident_bytes() // 1024
        directory = os.environ.get("CONFIDE_SCALE_MEMORY_DIR")
        if directory:
            atexit.register(self._record, directory)

    def _record(self, directory: str) -> None:
        with open(os.path.join(directory, f"{self.party}.json"), "w") as out:
            peak = resident_bytes(peak=True) // 1024
            json.dump({"baseline_kib": self.baseline_kib, "peak_kib": peak, "model_bytes": self.nbytes}, out)

    @property
    def nbytes(self) -> int:
        """Bytes of the weights (float32)."""
        return sum(int(np.prod(v.shape)) * 4 for v in self.model.weights)

    def get_weights(self) -> dict[str, np.ndarray]:
        return {v.path: np.asarray(v.numpy()) for v in self.model.weights}

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        for variable in self.model.weights:
            variable.assign(weights[variable.path])

    def fit(self, X, y, config):
        from confide.ml.base import FitResult

        rows, labels = self._rows(config.round)
        history = self.model.fit(rows, labels, batch_size=BATCH, epochs=config.epochs, verbose=0, shuffle=False)
        return FitResult(len(rows), {"loss": float(history.history["loss"][-1])})

    def evaluate(self, X, y, metrics):
        rows, labels = self._rows(1_000_000)  # held-out rows: a salt no round uses
        return {"loss": float(self.model.evaluate(rows[:BATCH], labels[:BATCH], verbose=0))}


def dense(parameters: int = 10_000_000):
    """The entry ``model.entry`` names (the party's name from CONFIDE_SCALE_PARTY)."""
    return DenseModel(int(parameters), os.environ.get("CONFIDE_SCALE_PARTY", "party"))


if __name__ == "__main__":
    parameters, rounds = int(sys.argv[1]), int(sys.argv[2])
    alone = DenseModel(parameters, "alone")
    alone.build()
    for round_number in range(1, rounds + 1):

        class _Config:
            round, epochs = round_number, 1

        weights = alone.get_weights()  # as a round reads and loads them, without Confide
        alone.fit(None, None, _Config)
        alone.set_weights(weights)
        del weights
    print(
        json.dumps(
            {
                "baseline_kib": alone.baseline_kib,
                "peak_kib": resident_bytes(peak=True) // 1024,
                "model_bytes": alone.nbytes,
            }
        )
    )
