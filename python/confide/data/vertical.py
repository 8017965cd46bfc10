"""Vertically split data sets: each party holds some columns of the same records (no downloads).

:func:`vertical_party_data` gives one party its own view, generated locally from the job's seed:

- ``breast_cancer``: scikit-learn's embedded Wisconsin data (569 rows, 30 columns), split by
  columns the way FATE's ``breast_hetero`` example does: the guest holds the label and the first
  10 columns, the hosts share the other 20 (or the split in ``columns``).
- ``synthetic``: scikit-learn's ``make_classification`` (or ``make_regression``) with
  ``samples`` rows and ``features`` columns, a quarter of them informative; the guest holds the
  first ``features // 2`` columns and the hosts share the rest (the 50/50 split of the benchmark).

Every party also gets record ids and keeps only a seeded random ``overlap`` fraction of the
records, in its own shuffled order, so the parties must align them with PSI before training
(the ids are ints; ``id_type="str"`` gives strings such as ``"rec-000123"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from confide.errors import InvalidParameterError

__all__ = ["VerticalPartyData", "column_split", "vertical_party_data"]


@dataclass
class VerticalPartyData:
    """One party's records: ids, its columns, and the labels if it is the guest."""

    ids: list
    X: np.ndarray
    y: np.ndarray | None
    columns: list[str]
    #: Under FL_Data: what new records of this party go through to be scored (``steps``,
    #: ``fitted``, the raw columns' training ``ranges``, the ``label``); it stays at the party.
    prepared: dict | None = None


def column_split(total: int, parties: list[str], guest: str, columns: dict[str, int] | None, guest_share: int) -> dict:
    """Party -> (first, last) column range; the guest first, then the hosts in order."""
    hosts = [p for p in parties if p != guest]
    if columns is not None:
        missing = [p for p in parties if p not in columns]
        if missing or sum(columns.values()) != total or any(v < 0 for v in columns.values()):
            raise InvalidParameterError(
                f"data.columns must give every party ({parties}) a non-negative column count summing to {total}, "
                f"got {columns}"
            )
        counts = {p: columns[p] for p in [guest, *hosts]}
    else:
        rest = total - guest_share
        counts = {guest: guest_share}
        for k, host in enumerate(hosts):
            counts[host] = rest // len(hosts) + (1 if k < rest % len(hosts) else 0)
    ranges, start = {}, 0
    for party, count in counts.items():
        ranges[party] = (start, start + count)
        start += count
    return ranges


def _pooled(dataset: str, samples: int, features: int, seed: int, objective: str):
    if dataset == "breast_cancer":
        from confide.data.embedded import breast_cancer

        data = breast_cancer()
        y = data.target.astype(np.float64)
        return data.data.astype(np.float64), y, list(data.feature_names)
    if dataset == "digits":
        from confide.data.embedded import digits

        data = digits()
        return data.data.astype(np.float64), data.target.astype(np.float64), [f"p{j}" for j in range(64)]
    if dataset == "synthetic":
        if objective == "regression":
            from sklearn.datasets import make_regression

            X, y = make_regression(
                n_samples=samples,
                n_features=features,
                n_informative=max(1, features // 4),
                noise=10.0,
                random_state=seed,
            )
        else:
            from sklearn.datasets import make_classification

            X, y = make_classification(
                n_samples=samples,
                n_features=features,
                n_informative=max(2, features // 4),
                n_redundant=0,
                flip_y=0.05,
                class_sep=0.8,
                random_state=seed,
            )
        return X.astype(np.float64), y.astype(np.float64), [f"x{j}" for j in range(features)]
    raise InvalidParameterError(f"data.dataset {dataset!r} has no vertical split (breast_cancer, digits or synthetic)")


def vertical_party_data(
    party: str,
    parties: list[str],
    guest: str,
    *,
    dataset: str = "breast_cancer",
    samples: int = 100_000,
    features: int = 100,
    columns: dict[str, int] | None = None,
    overlap: float = 0.95,
    seed: int = 0,
    objective: str = "classification",
    id_type: str = "int",
) -> VerticalPartyData:
    """``party``'s records of the vertically split ``dataset`` (see the module docstring)."""
    if party not in parties or guest not in parties:
        raise InvalidParameterError(f"party {party!r} and guest {guest!r} must be among the parties {parties}")
    if not 0 < overlap <= 1:
        raise InvalidParameterError(f"data.overlap must be in (0, 1], got {overlap}")
    X, y, names = _pooled(dataset, samples, features, seed, objective)
    guest_share = 10 if dataset == "breast_cancer" else X.shape[1] // 2
    first, last = column_split(X.shape[1], parties, guest, columns, guest_share)[party]
    rng = np.random.default_rng([seed, parties.index(party), 7])
    keep = np.sort(rng.choice(len(X), size=max(1, round(overlap * len(X))), replace=False))
    order = rng.permutation(keep)
    ids = [f"rec-{i:07d}" for i in order] if id_type == "str" else [int(i) for i in order]
    return VerticalPartyData(
        ids=ids,
        X=X[order, first:last],
        y=y[order] if party == guest else None,
        columns=names[first:last],
    )
