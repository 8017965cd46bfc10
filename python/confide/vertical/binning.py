"""Quantile binning of one party's columns, done by each party on its own rows.

A party bins its columns before training and keeps the cut points to itself: a host's cut
points are the thresholds of its splits, which the guest never learns (docs/vertical.md).

``n_bins`` counts every bin, the last of which is reserved for missing values (NaN): a column
gets at most ``n_bins - 1`` value bins, cut at the unique quantiles ``k / (n_bins - 1)`` of its
non-missing values, and value ``x`` falls in bin ``searchsorted(cuts, x, side="right")``. A split
"bin <= v" therefore means "x < cuts[v]"; missing values always go right (documented handling,
unlike XGBoost's learned default direction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from confide.errors import InvalidParameterError

__all__ = ["Binner", "MAX_BINS", "MIN_BINS"]

MIN_BINS = 2
MAX_BINS = 256


@dataclass
class Binner:
    """Cut points of every column of one party."""

    n_bins: int
    cuts: list[np.ndarray]

    @classmethod
    def fit(cls, X: np.ndarray, n_bins: int = 32, *, party: str = "party") -> Binner:
        """Quantile cut points of each column of ``X`` (rows x columns)."""
        if not isinstance(n_bins, int) or not MIN_BINS <= n_bins <= MAX_BINS:
            raise InvalidParameterError(f"n_bins must be an int in {MIN_BINS}..{MAX_BINS}, got {n_bins!r}")
        X = _as_matrix(X, party)
        if np.isinf(X).any():
            column = int(np.argwhere(np.isinf(X))[0][1])
            raise InvalidParameterError(f"{party}: column {column} holds an infinite value (only NaN means missing)")
        levels = np.arange(1, n_bins - 1) / (n_bins - 1)
        cuts = []
        for j in range(X.shape[1]):
            column = X[:, j]
            present = column[~np.isnan(column)]
            if present.size == 0:
                cuts.append(np.zeros(0))
                continue
            points = np.unique(np.quantile(present, levels, method="linear"))
            # A cut equal to the minimum would leave bin 0 empty: drop it.
            cuts.append(points[points > present.min()])
        return cls(n_bins=n_bins, cuts=cuts)

    @property
    def features(self) -> int:
        """Number of columns."""
        return len(self.cuts)

    def transform(self, X: np.ndarray, *, party: str = "party") -> np.ndarray:
        """Bin indices, feature-major: ``uint8`` array of shape (features, rows)."""
        X = _as_matrix(X, party)
        if X.shape[1] != self.features:
            raise InvalidParameterError(f"{party}: expected {self.features} columns, got {X.shape[1]}")
        out = np.empty((self.features, X.shape[0]), dtype=np.uint8)
        for j, cuts in enumerate(self.cuts):
            column = X[:, j]
            bins = np.searchsorted(cuts, column, side="right")
            bins[np.isnan(column)] = self.n_bins - 1
            out[j] = bins
        return out

    def threshold(self, feature: int, bin_index: int) -> float:
        """The value ``t`` with "bin <= bin_index" equivalent to "x < t"."""
        cuts = self.cuts[feature]
        return float(cuts[bin_index]) if bin_index < len(cuts) else float("inf")

    def to_dict(self) -> dict:
        """A message-safe mapping (the cut points are the party's secret)."""
        return {"n_bins": self.n_bins, "cuts": [c.astype(np.float64) for c in self.cuts]}

    @classmethod
    def from_dict(cls, data: dict) -> Binner:
        """Inverse of :meth:`to_dict`."""
        return cls(n_bins=int(data["n_bins"]), cuts=[np.asarray(c, dtype=np.float64) for c in data["cuts"]])


def _as_matrix(X: np.ndarray, party: str) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise InvalidParameterError(f"{party}: features must be a 2-D array (rows x columns), got {X.ndim}-D")
    if X.shape[1] == 0:
        raise InvalidParameterError(f"{party}: has no feature columns (a host must hold at least one)")
    if X.shape[0] == 0:
        raise InvalidParameterError(f"{party}: has no rows")
    return X
