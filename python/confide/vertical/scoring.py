"""Scoring new records with a trained vertical model: one site's side of a scoring job.

A scoring job (``score`` in the job specification; docs/vertical.md, "Scoring new records") is a
vertical job that trains nothing. Each site:

1. loads its own part of the model, the ``<party>.model.zip`` its training run wrote (found in
   the training session's folder at this site, or in ``score.model_dir``), and checks that it is
   the part this job expects (algorithm, guest, partners): :func:`confide.artifact.load_vertical_part`,
   in the party process, which hands the manifest and the part to this module;
2. reads its new records, takes the id column out and prepares the rest exactly as training
   prepared its rows: its steps with the statistics fitted then (never refitted on the new
   records); what the model never saw is counted, never shown (unseen categories, values
   outside the training range);
3. aligns the ids with its partners by PSI (nobody learns another site's other records);
4. runs the model's prediction protocol on the common records. The guest alone learns the
   scores and writes ``<guest>.scores.csv`` (the id column, then the score or one column per
   class); a host sends what the protocol asks of it (its split decisions, or its partial
   scores) and learns the number of records scored, nothing more.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from confide.data.catalog import Table
from confide.data.flsteps import Step, record_warnings, take_ids, transform
from confide.data.vertical import VerticalPartyData
from confide.errors import DataProblemError, InvalidParameterError, JobFailedError
from confide.spec import JobSpec

__all__ = ["SCORES", "records", "score", "write_scores"]

#: The guest's scores, beside its report.
SCORES = "{party}.scores.csv"


def records(spec: JobSpec, party: str, manifest: dict, catalog, report: dict) -> VerticalPartyData:
    """The party's new records, prepared as training prepared its rows; warnings go to ``report``."""
    if catalog is None or spec.fl_data is None:
        raise JobFailedError(f"party {party!r}: a scoring job reads new records from the party's catalog (fl_data)")
    fl_data = spec.fl_data_object()
    dataset = fl_data.datasets()[party]
    id_column = spec.data.id_column
    where = f"party {party!r}, dataset {dataset!r}"
    columns = dict(catalog.table(dataset).columns)
    ids = take_ids(where, columns, id_column, "the new records need the id column the model was trained with")
    table = Table(columns)
    report["warnings"] = record_warnings(manifest["pipeline"], manifest["fitted"], manifest.get("ranges"), table)
    steps = [Step.from_value(step) for step in manifest["pipeline"]]
    label = fl_data.label
    try:
        X, kept = transform(steps, label, manifest["fitted"], table, manifest["features"])
    except InvalidParameterError as error:
        raise DataProblemError(
            f"{where}: {error}", hint="the new records need the columns the model was trained on"
        ) from None
    y = None
    if party == spec.guest and label in columns:  # labelled new records: the guest also reports metrics
        values = np.asarray(columns[label])[kept]
        try:
            y = values.astype(np.float64)
        except (TypeError, ValueError):
            y = None
        if y is not None and np.isnan(y).any():
            y = None
    report["data"] = {
        "dataset": dataset,
        "fl_data_version": fl_data.version,
        "fl_data_fingerprint": fl_data.fingerprint,
        "id_column": id_column,
        "rows": table.rows,
        "kept": len(kept),
    }
    return VerticalPartyData(ids=ids[kept].tolist(), X=X, y=y, columns=list(manifest["features"]))


def score(spec: JobSpec, channel, role: str, guest: str, hosts: list[str], part: dict, X: np.ndarray):
    """The model's prediction protocol on the aligned rows ``X``: the guest's scores; None at a host."""
    algorithm = spec.model.algorithm
    model = part["model"]
    try:
        if algorithm == "secureboost":
            from confide.vertical import secureboost as sb

            if role == "guest":
                return sb.predict_guest(channel, sb.SecureBoostGuestModel.from_dict(model), X, "score")
            sb.serve_host(channel, guest, X, "score", model=sb.SecureBoostHostModel.from_dict(model))
            return None
        if algorithm == "hetero_lr":
            from confide.vertical import hetero_lr as lr

            if role == "guest":
                return lr.predict_guest(channel, hosts, X, lr.HeteroLRGuestModel.from_dict(model), "score")
            lr.predict_host(channel, guest, X, lr.HeteroLRHostModel.from_dict(model), "score")
            return None
        from confide.vertical import hetero_nn as nn

        if role == "guest":
            return nn.predict_guest(channel, hosts, X, nn.HeteroNNGuestModel.from_dict(model), "score")
        nn.predict_host(channel, guest, X, nn.HeteroNNHostModel.from_dict(model), "score")
        return None
    except (KeyError, TypeError, ValueError) as error:
        raise JobFailedError(
            f"the {algorithm} part of this site cannot be read: {type(error).__name__}: {error}"
        ) from None


def write_scores(path: Path, id_column: str, ids, scores: np.ndarray) -> Path:
    """``id_column`` then ``score`` (one column ``class_k`` per class for a multi-class model), atomically."""
    scores = np.asarray(scores, dtype=np.float64)
    names = ["score"] if scores.ndim == 1 else [f"class_{k}" for k in range(scores.shape[1])]
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([id_column, *names])
        for record, row in zip(ids, scores.reshape(len(ids), -1), strict=True):
            writer.writerow([record, *(repr(float(v)) for v in row)])
    os.replace(temporary, path)
    return path
