"""Coordinate-wise trimmed mean (Yin et al., ICML 2018): drop the b largest and b smallest values of each coordinate.

``b = floor(trim_fraction * m)``, at least 1: the mean of the middle ``m - 2b`` values of each
coordinate. It tolerates b malicious updates per coordinate and keeps more of the honest
updates' information than the median. Slice by slice at the aggregator.
"""

from __future__ import annotations

import math

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.strategies.robust import RobustStrategy

__all__ = ["TrimmedMean"]


class TrimmedMean(RobustStrategy):
    """The mean of each coordinate without its ``b`` largest and ``b`` smallest values."""

    name = "trimmed_mean"

    def __init__(self, trim_fraction: float = 0.2) -> None:
        if not (isinstance(trim_fraction, int | float) and math.isfinite(trim_fraction) and 0 < trim_fraction < 0.5):
            raise InvalidParameterError(f"strategy.trim_fraction must be in (0, 0.5), got {trim_fraction!r}")
        self.trim_fraction = float(trim_fraction)

    def cut(self, participants: int) -> int:
        """Values dropped at each end of a coordinate: floor(trim_fraction * m), at least 1."""
        return max(1, math.floor(self.trim_fraction * participants))

    def check(self, participants: int) -> None:
        """At least one value must remain after cutting both ends."""
        super().check(participants)
        if 2 * self.cut(participants) >= participants:
            raise InvalidParameterError(
                f"strategy.trim_fraction {self.trim_fraction}: cutting {self.cut(participants)} at each end of "
                f"{participants} updates leaves none"
            )

    def rule(self) -> dict:
        """The rule and its fraction."""
        return {"rule": self.name, "trim_fraction": self.trim_fraction}

    def combine(self, rows: np.ndarray) -> np.ndarray:
        """The trimmed mean of each column of the (m, n) updates."""
        cut = self.cut(rows.shape[0])
        ordered = np.sort(rows, axis=0)
        return ordered[cut : rows.shape[0] - cut].mean(axis=0, dtype=np.float64).astype(np.float32)
