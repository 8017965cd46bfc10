"""A party's rows for a job: its catalog dataset, an embedded federation's share, or partitions.

:func:`load_party_data` gives the party process a :class:`PartyData`: arrays in memory, or, for a
partitioned catalog entry, holders on the compute engine that keep the rows where they were read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from confide.data import breast_cancer_federation, digits_federation, synthetic_lr, synthetic_tensors, text_federation
from confide.errors import (
    JobFailedError,
)
from confide.spec import JobSpec

__all__ = ["PARTITIONED_MODELS", "PartyData", "close_compute", "load_party_data"]

log = logging.getLogger("confide.party")


#: Models whose own ``fit`` and ``evaluate`` take a :class:`~confide.compute.partitions.PartitionedData`
#: (Homo LR: full-batch gradients per partition, summed); any other model of the seam trains on
#: partitions through :class:`~confide.compute.parallel.DataParallel`.
PARTITIONED_MODELS = ("homo_lr",)


@dataclass
class PartyData:
    """One party's rows (and a test split when the data set gives one).

    ``classes``: labels of the *job* (2 for binary, 10 for digits), which every party's model is
    built for even where its own rows lack a class; 0 where the data cannot say (FL_Data with
    more than two label values: the model's own output decides).
    """

    X: object
    y: np.ndarray
    X_test: object | None = None
    y_test: np.ndarray | None = None
    classes: int = 2
    #: FL_Data only: the feature columns in order, and the statistics the pipeline fitted here.
    feature_names: list[str] | None = None
    fitted: list[dict] | None = None
    #: FL_Data only: the raw numeric columns' training ranges (confide.data.flsteps.raw_ranges).
    ranges: dict[str, list[float]] | None = None

    @property
    def example_shape(self) -> tuple[int, ...]:
        """Shape of one example (features, or an image's height x width x channels)."""
        return tuple(int(d) for d in self.X.shape[1:])


def load_party_data(spec: JobSpec, party_id: str, catalog=None, compute=None) -> PartyData:
    """Rows of ``party_id`` as the job provisions them: FL_Data over the party's catalog, or embedded.

    A partitioned catalog dataset is held by ``compute`` (an open :class:`~confide.compute.LocalCompute`;
    default inline): ``X`` and ``X_test`` are then :class:`~confide.compute.partitions.PartitionedData`
    views (``y`` and ``y_test`` the same views: the labels stay with the rows).
    """
    if spec.fl_data is not None:
        if catalog is None:
            raise JobFailedError(f"the job provisions data as FL_Data but party {party_id!r} has no dataset catalog")
        dataset = spec.fl_data_object().datasets()[party_id]
        partitions = catalog.partitions(dataset)
        if partitions is not None:
            return _partitioned_data(spec, party_id, dataset, partitions, compute)
        fl_data = spec.fl_data_object()
        provisioned = fl_data.provision(party_id, catalog.table(fl_data.datasets()[party_id]))
        labels = np.concatenate(
            [np.ravel(provisioned.y), np.ravel(provisioned.y_test if provisioned.y_test is not None else [])]
        )
        # Binary labels are binary everywhere; more classes are the network's to declare (a party
        # may lack the highest class), so 0: "as the model says".
        classes = 2 if np.isin(labels, (0, 1)).all() else 0
        return PartyData(
            provisioned.X,
            provisioned.y,
            provisioned.X_test,
            provisioned.y_test,
            classes=classes,
            feature_names=provisioned.feature_names,
            fitted=provisioned.fitted,
            ranges=provisioned.ranges,
        )
    index = spec.parties.index(party_id)
    data = spec.data
    if data.dataset in ("breast_cancer", "digits", "text"):
        federation = embedded_federation(spec)
        X, y = federation.parts[index]
        # Every party evaluates the global model on the federation's held-out rows (no party trains on them).
        X_test, y_test = federation.test
        return PartyData(X, y, X_test, y_test, classes=embedded_classes(spec))
    if data.dataset == "tensors":
        X, y, X_test, y_test = synthetic_tensors(
            index,
            len(spec.parties),
            samples=data.samples,
            example_shape=tuple(data.example_shape),
            classes=data.classes,
            sequence=data.sequence,
            test_fraction=data.test_fraction,
            seed=data.seed,
        )
        return PartyData(X, y, X_test, y_test, classes=data.classes)
    X, y, X_test, y_test = synthetic_lr(
        index,
        len(spec.parties),
        samples=data.samples,
        features=data.features,
        density=data.density,
        alpha=data.alpha,
        beta=data.beta,
        seed=data.seed,
        test_fraction=min(data.test_fraction, 0.5),
    )
    return PartyData(X, y, X_test, y_test)


def embedded_federation(spec: JobSpec):
    """The job's embedded or generated :class:`confide.data.Federation` (breast_cancer, digits, text)."""
    data = spec.data
    dealing = {"split": data.split, "skew": data.skew, "test_fraction": data.test_fraction, "seed": data.seed}
    if data.dataset == "text":
        return text_federation(
            len(spec.parties),
            samples=data.samples,
            length=data.example_shape[0] if len(data.example_shape) == 1 else -1,
            classes=data.classes,
            vocabulary=data.vocabulary,
            **dealing,
        )
    make = breast_cancer_federation if data.dataset == "breast_cancer" else digits_federation
    return make(len(spec.parties), **dealing)


def embedded_classes(spec: JobSpec) -> int:
    """The number of labels of the job's embedded data set."""
    return {"digits": 10, "text": spec.data.classes}.get(spec.data.dataset, 2)


def close_compute(engine, data: PartyData | None) -> None:
    """Release a partitioned dataset's holders and the engine this party opened (never raises)."""
    holders = getattr(getattr(data, "X", None), "holders", None)
    for release in (getattr(holders, "close", None), getattr(engine, "close", None)):
        if release is None:
            continue
        try:
            release()
        except Exception as error:  # noqa: BLE001 - the job's own outcome matters more than a cleanup
            log.warning("releasing the compute engine failed: %s", error)


def _partitioned_data(spec: JobSpec, party_id: str, dataset: str, partitions, compute) -> PartyData:
    """Holders of a partitioned dataset on the party's engine, and the shape they report."""
    from confide.compute import open_compute
    from confide.compute.partitions import PartitionedData, PartitionRows, PartitionTask

    fl_data = spec.fl_data_object()
    fl_data.check_partitionable(party_id)  # here, so its message (the step) reaches the developer as is
    engine = compute if compute is not None else open_compute("inline")
    task = PartitionTask(party=party_id, dataset=dataset, fl_data=fl_data.to_dict())
    holders = engine.hold(PartitionRows, [(task, partition) for partition in partitions])
    try:
        shapes = holders.call("shape")
        labels = sorted({value for shape in shapes for value in shape["labels"]})
        # Which processes hold the partitions (an operator's view; a restarted holder gets a new one).
        where = {**engine.describe(), "partitions": holders.count, "holder_pids": holders.pids()}
        train = PartitionedData(holders, shapes, "train", where)
    except BaseException:
        holders.close()
        raise
    test = train.view("test") if any(shape["test_rows"] for shape in shapes) else None
    classes = 2 if set(labels) <= {0.0, 1.0} else 0
    return PartyData(
        train, train, test, test, classes=classes, feature_names=train.features, fitted=shapes[0]["fitted"]
    )
