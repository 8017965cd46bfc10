"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017): keep the updates closest to their neighbours.

Each update i scores ``sum of ||x_i - x_j||^2`` over its ``m - f - 2`` nearest other updates, f
the number of malicious updates tolerated (``byzantine``), with ``2f + 2 < m``. Krum takes the
update of lowest score; Multi-Krum the mean of the ``k`` lowest (``selected``, by default
``m - f``). A scaled update is far from every honest one and never selected. The distances are
over whole updates: the aggregator accumulates the Gram matrix slice by slice and holds every
slice of the round until the last one (not on a cluster, where no node sees every slice).
"""

from __future__ import annotations

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.strategies.robust import RobustStrategy, pairwise_squared_distances

__all__ = ["Krum", "MultiKrum"]


class Krum(RobustStrategy):
    """The one update closest to its ``m - f - 2`` nearest others."""

    name = "krum"
    whole_vector = True

    def __init__(self, byzantine: int = 1, selected: int = 0) -> None:
        if not isinstance(byzantine, int) or isinstance(byzantine, bool) or byzantine < 0:
            raise InvalidParameterError(f"strategy.byzantine must be an integer >= 0, got {byzantine!r}")
        if not isinstance(selected, int) or isinstance(selected, bool) or selected < 0:
            raise InvalidParameterError(f"strategy.selected must be an integer >= 0 (0: m - f), got {selected!r}")
        self.byzantine = byzantine
        self.selected = selected

    def check(self, participants: int) -> None:
        """Krum's condition 2f + 2 < m, and at most m updates selected."""
        super().check(participants)
        f = self.byzantine
        if 2 * f + 2 >= participants:
            raise InvalidParameterError(
                f"strategy.byzantine {f} is too large for {participants} participants: Krum needs 2f + 2 < m "
                f"(at most {max(0, (participants - 3) // 2)} here)"
            )
        if self.selected > participants:
            raise InvalidParameterError(
                f"strategy.selected {self.selected} exceeds the {participants} participants of a round"
            )

    def rule(self) -> dict:
        """The rule, f and (Multi-Krum) k."""
        return {"rule": self.name, "byzantine": self.byzantine, "selected": self.selected}

    def count(self, participants: int) -> int:
        """Updates averaged: 1 for Krum."""
        return 1

    def scores(self, gram: np.ndarray) -> np.ndarray:
        """Each update's sum of squared distances to its m - f - 2 nearest others."""
        m = gram.shape[0]
        distances = pairwise_squared_distances(gram)
        np.fill_diagonal(distances, np.inf)
        nearest = max(1, m - self.byzantine - 2)
        return np.sort(distances, axis=1)[:, :nearest].sum(axis=1)

    def weights(self, gram: np.ndarray) -> np.ndarray:
        """1/k for the k updates of lowest score, 0 for the rest."""
        m = gram.shape[0]
        chosen = np.argsort(self.scores(gram), kind="stable")[: self.count(m)]
        out = np.zeros(m)
        out[chosen] = 1.0 / len(chosen)
        return out


class MultiKrum(Krum):
    """The mean of the ``k`` updates of lowest Krum score (k = ``selected``, or m - f)."""

    name = "multi_krum"

    def count(self, participants: int) -> int:
        """k: ``selected``, or m - f."""
        return self.selected or participants - self.byzantine
