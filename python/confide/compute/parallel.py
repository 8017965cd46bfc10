"""Data-parallel training of any model of the seam over partitioned rows.

Each partition's holder builds the job's model once (from the same recipe the party used: model
spec, network, seed, Keras backend) and keeps it. Every round, :meth:`DataParallel.fit` sends the
party's current weights to every holder; each trains its copy for the round's local epochs on its
own rows (a batch order of its own, drawn from the round's seed and its partition index) and
returns the weights and its number of rows. The party process averages the copies, weighted by
rows: local SGD with model averaging, the data-parallel scheme of FedAvg applied inside the silo.
Every engine gives the same result: the holders' work does not depend on where they run, and the
average adds them in partition order.

Evaluation: each holder evaluates its rows; loss and accuracy are averaged weighted by rows (both
are means over rows, so this is exact); AUC, which is not a mean, is computed in the party process
from the holders' predictions on the rows being evaluated.

A holder's local optimizer state (Adam's moments) stays with it across rounds; it is not
checkpointed, so a resumed run restarts it (the global weights and the strategy's state are
checkpointed as for any job).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.base import FitConfig, FitResult, Weights

__all__ = ["DataParallel"]


class DataParallel:
    """A :class:`~confide.ml.base.FederatedModel` whose ``fit`` and ``evaluate`` run on the partitions.

    ``model`` is the party's own copy (it holds the global weights between rounds); ``recipe`` is
    what a holder needs to build the same model (public: the spec's model section, the network, the
    seed, the party and its Keras backend).
    """

    def __init__(self, model: Any, recipe: dict[str, Any]) -> None:
        self.model = model
        self.recipe = dict(recipe)
        self.backend = getattr(model, "backend", None)

    def build(self, example_shape: tuple[int, ...], classes: int) -> None:
        """Build the party's copy; holders build theirs with the same shape and classes."""
        self.model.build(example_shape, classes)
        self.recipe.update(example_shape=tuple(example_shape), classes=int(classes))

    def get_weights(self) -> Weights:
        """The party's copy's weights."""
        return self.model.get_weights()

    def set_weights(self, weights: Weights) -> None:
        """Load weights into the party's copy (holders get them with every call)."""
        self.model.set_weights(weights)

    def fit(self, X: Any, y: Any, config: FitConfig) -> FitResult:
        """Every holder trains from the current weights; the copies are averaged by rows."""
        weights = self.model.get_weights()
        settings = {
            "round": config.round,
            "seed": tuple(config.seed),
            "epochs": config.epochs,
            "proximal_mu": config.proximal_mu,
            "global_weights": config.global_weights,
        }
        results = X.call("fit_model", self.recipe, weights, settings)
        total = sum(n for _w, n, _m in results)
        if total == 0:
            raise InvalidParameterError("the partitions hold no training rows")
        averaged = {
            name: np.sum([w[name].astype(np.float64) * (n / total) for w, n, _m in results if n], axis=0).astype(
                value.dtype
            )
            for name, value in weights.items()
        }
        self.model.set_weights(averaged)
        metrics = {}
        for key in sorted({k for _w, _n, m in results for k in m}):
            metrics[key] = float(sum(m.get(key, 0.0) * n for _w, n, m in results) / total)
        return FitResult(num_examples=int(total), metrics=metrics)

    def evaluate(self, X: Any, y: Any, metrics: list[str]) -> dict[str, float]:
        """Loss and accuracy averaged by rows; AUC from the holders' predictions."""
        results = X.call("evaluate_model", self.recipe, self.model.get_weights(), X.which, list(metrics))
        total = sum(r["rows"] for r in results)
        out: dict[str, float] = {}
        for key in ("loss", "accuracy"):
            if key == "loss" or key in metrics:
                present = [r for r in results if key in r["metrics"] and r["rows"]]
                if present:
                    out[key] = float(sum(r["metrics"][key] * r["rows"] for r in present) / total)
        if "auc" in metrics:
            scores = np.concatenate([r["scores"] for r in results if r["rows"]])
            labels = np.concatenate([r["labels"] for r in results if r["rows"]])
            if len(np.unique(labels)) == 2:
                from confide.ml.metrics import roc_auc

                column = scores if scores.ndim == 1 else scores[:, 0] if scores.shape[1] == 1 else scores[:, -1]
                out["auc"] = roc_auc(labels, column)
        return out

    def predict(self, X: Any) -> np.ndarray:
        """The party's copy's predictions on arrays (scoring a new record set)."""
        return self.model.predict(X)

    def state(self) -> Weights:
        """The party's copy's local state, if it has one."""
        return self.model.state() if hasattr(self.model, "state") else {}

    def load_state(self, state: Weights) -> None:
        """Restore the party's copy's local state."""
        if hasattr(self.model, "load_state"):
            self.model.load_state(state)


def holder_model(recipe: dict[str, Any]) -> Any:
    """Build the model a recipe describes (on a holder)."""
    from confide.ml import build_model
    from confide.spec import ModelSpec

    spec = ModelSpec.model_validate(recipe["model"])
    options = {"network": recipe.get("network")}
    if recipe.get("keras_backend"):
        options["keras_backend"] = recipe["keras_backend"]
    model = build_model(spec, seed=recipe["seed"], party_id=recipe["party"], **options)
    model.build(tuple(recipe["example_shape"]), int(recipe["classes"]))
    return model
