"""Coordinate-wise median (Yin et al., ICML 2018): each value of the aggregate is the median of the m updates'.

With fewer than half the updates malicious, every coordinate of the estimate lies between two
honest values, whatever the others send; a scaled or sign-flipped update moves it by at most one
rank. Slice by slice at the aggregator: any node of a cluster can run it.
"""

from __future__ import annotations

import numpy as np

from confide.ml.strategies.robust import RobustStrategy

__all__ = ["Median"]


class Median(RobustStrategy):
    """The coordinate-wise median of the participants' updates."""

    name = "median"

    def combine(self, rows: np.ndarray) -> np.ndarray:
        """The median of each column of the (m, n) updates."""
        return np.median(rows, axis=0).astype(np.float32)
