"""Partitioned Parquet data: listed by the party process, read and held where the work runs.

A catalog ``parquet`` entry with ``partitioned: true`` names a directory of Parquet files; each
file is one partition (sorted by relative path, so every run sees the same order). The party
process reads only their footers (:func:`confide.data.partitions.list_partitions`: path and row count). Each
:class:`PartitionRows` holder reads one file, runs the job's FL_Data steps on it
(:meth:`confide.data.fldata.FLData.provision_partition`: row-local steps only, a per-row test
split) and keeps the arrays for the rest of the job. The party process gets back sums, counts and
the few scores its metrics need; never the rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from confide.data.partitions import Partition, list_partitions, partition_columns
from confide.errors import InvalidParameterError

__all__ = [
    "Partition",
    "PartitionRows",
    "PartitionTask",
    "PartitionedData",
    "list_partitions",
    "partition_columns",
    "read_partition",
]


@dataclass(frozen=True)
class PartitionTask:
    """What a holder needs to provision its partition (public: a pipeline and names, no keys)."""

    party: str
    dataset: str
    #: The job's FL_Data, as its mapping (``FLData.to_dict``).
    fl_data: dict[str, Any]


def read_partition(task: PartitionTask, partition: Partition):
    """``(table, None)`` of one partition's file, or ``(None, error)`` naming the party, dataset and file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from confide.data.catalog import table_from_arrow

    where = f"party {task.party!r}, dataset {task.dataset!r}, partition {partition.index} ({Path(partition.path).name})"
    try:
        return table_from_arrow(where, pq.read_table(partition.path)), None
    except (pa.ArrowException, OSError) as error:
        return None, InvalidParameterError(f"{where}: cannot read the Parquet data: {error}")
    except InvalidParameterError as error:
        return None, error


class PartitionRows:
    """One partition's provisioned rows, held where the engine runs it; answers with sums.

    Built on the worker from a :class:`PartitionTask` and a :class:`Partition`; a worker that
    restarts rebuilds it from the same two (reading the file again), so a retried call gives the
    same answer.
    """

    def __init__(self, task: PartitionTask, partition: Partition) -> None:
        from confide.data.fldata import FLData

        # A failure is raised from shape(), not here: Ray reports a constructor's error only as
        # the actor's death, and the developer needs its message (step, column, partition).
        table, self.error = read_partition(task, partition)
        if self.error is not None:
            return
        try:
            provisioned = FLData.from_dict(task.fl_data).provision_partition(task.party, table, partition.index)
        except InvalidParameterError as error:
            self.error = error
            return
        self.X, self.y = provisioned.X, provisioned.y
        self.X_test, self.y_test = provisioned.X_test, provisioned.y_test
        self.features = provisioned.feature_names
        self.fitted = provisioned.fitted
        self.index = partition.index

    def pid(self) -> int:
        """The process id of the worker holding this partition."""
        return os.getpid()

    def memory(self) -> dict[str, float]:
        """Resident memory of the process holding this partition, now and at its peak, in MiB."""
        from confide.compute.base import peak_rss_mb

        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return {"rss_mb": resident / 2**20, "peak_rss_mb": peak_rss_mb()}

    def shape(self) -> dict[str, Any]:
        """Rows, test rows, features (names) and the label values present."""
        if self.error is not None:
            raise self.error
        labels = np.unique(np.concatenate([self.y, self.y_test if self.y_test is not None else []]))
        return {
            "rows": int(self.X.shape[0]),
            "test_rows": int(self.X_test.shape[0]) if self.X_test is not None else 0,
            "features": list(self.features),
            "labels": [float(v) for v in labels],
            "nbytes": int(self.X.nbytes + self.y.nbytes),
            # What the row-local steps recorded (categories, bounds): the same in every partition.
            "fitted": self.fitted,
        }

    def _rows(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        if which == "train":
            return self.X, self.y
        if self.X_test is None:
            return self.X[:0], self.y[:0]
        return self.X_test, self.y_test

    def lr_gradient(self, w: np.ndarray) -> tuple[np.ndarray, float, int]:
        """Sum over the training rows of the logistic gradient ``(p - y) [x, 1]`` and of the loss."""
        X, y = self.X, self.y
        z = X @ w[:-1] + w[-1]
        residual = 0.5 + 0.5 * np.tanh(0.5 * z) - y
        gradient = np.empty(w.size)
        gradient[:-1] = X.T @ residual
        gradient[-1] = residual.sum()
        loss = float(np.sum(np.logaddexp(0, z) - y * z))
        return gradient, loss, int(X.shape[0])

    def lr_loss(self, w: np.ndarray, which: str) -> tuple[float, int]:
        """Sum of the logistic loss over the training or test rows, and their number."""
        X, y = self._rows(which)
        z = X @ w[:-1] + w[-1]
        return float(np.sum(np.logaddexp(0, z) - y * z)), int(X.shape[0])

    def fit_model(self, recipe: dict[str, Any], weights: dict, settings: dict) -> tuple[dict, int, dict]:
        """Train this holder's copy of the job's model on its rows (:mod:`confide.compute.parallel`)."""
        from confide.ml.base import FitConfig

        model = self._model(recipe)
        if self.X.shape[0] == 0:
            return weights, 0, {}
        model.set_weights(weights)
        # The round's seed, extended by the partition: each holder draws its own batch order.
        config = FitConfig(**{**settings, "seed": (*settings["seed"], self.index)})
        result = model.fit(self.X, self.y, config)
        return model.get_weights(), int(result.num_examples), dict(result.metrics)

    def evaluate_model(self, recipe: dict[str, Any], weights: dict, which: str, metrics: list[str]) -> dict:
        """Loss and accuracy of the rows held here; with ``auc`` asked, their predictions and labels too."""
        X, y = self._rows(which)
        out: dict[str, Any] = {"rows": int(X.shape[0]), "metrics": {}}
        if not X.shape[0]:
            return out
        model = self._model(recipe)
        model.set_weights(weights)
        out["metrics"] = model.evaluate(X, y, [m for m in metrics if m != "auc"])
        if "auc" in metrics:
            out["scores"], out["labels"] = np.asarray(model.predict(X)), y
        return out

    def _model(self, recipe: dict[str, Any]):
        from confide.compute.parallel import holder_model

        key = repr(sorted(recipe.items()))
        if getattr(self, "_model_key", None) != key:
            self._cached_model, self._model_key = holder_model(recipe), key
        return self._cached_model

    def lr_scores(self, w: np.ndarray, which: str) -> tuple[np.ndarray, np.ndarray]:
        """Decision values and labels of the training or test rows (for accuracy and AUC)."""
        X, y = self._rows(which)
        return X @ w[:-1] + w[-1], y


class PartitionedData:
    """What the party runner holds instead of arrays: holders, and the shape they reported.

    ``which`` is ``train`` or ``test``: the runner's ``X`` and ``X_test`` are two views of the
    same holders. ``len()`` is the number of rows.
    """

    def __init__(self, holders, shapes: list[dict[str, Any]], which: str = "train", engine: dict | None = None) -> None:
        self.holders = holders
        self.shapes = shapes
        self.which = which
        self.engine = engine or {}
        self.features = shapes[0]["features"]
        for index, shape in enumerate(shapes):
            if shape["features"] != self.features:
                raise InvalidParameterError(
                    f"partition {index} provisions features {shape['features'][:5]}..., partition 0 "
                    f"{self.features[:5]}...: every file of a partitioned dataset must hold the same columns"
                )
        key = "rows" if which == "train" else "test_rows"
        self.rows = sum(s[key] for s in shapes)

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, features)."""
        return (self.rows, len(self.features))

    def __len__(self) -> int:
        return self.rows

    def view(self, which: str) -> PartitionedData:
        """The same holders' ``train`` or ``test`` rows."""
        return PartitionedData(self.holders, self.shapes, which, self.engine)

    def call(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every partition (see :class:`PartitionRows`)."""
        return self.holders.call(method, *args)
