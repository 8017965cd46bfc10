"""Server-side norm clipping (Sun et al., 2019): scale each update down to an L2 bound, then average.

``x_i <- x_i * min(1, bound / ||x_i||)``, then the mean of the m updates. ``norm_bound`` fixes
the bound; without it the bound is the median of the round's update norms, so a party that
scales its update up gets the weight of a typical one. The norms are of whole updates: the
aggregator accumulates them slice by slice and holds the round's slices until the last one.
"""

from __future__ import annotations

import numpy as np

from confide.ml.strategies.robust import RobustStrategy, finite_positive

__all__ = ["NormClip"]


class NormClip(RobustStrategy):
    """The mean of the updates clipped to ``norm_bound`` (None: the round's median norm)."""

    name = "norm_clip"
    whole_vector = True

    def __init__(self, norm_bound: float | None = None) -> None:
        self.norm_bound = None if norm_bound is None else finite_positive(norm_bound, "strategy.norm_bound")

    def rule(self) -> dict:
        """The rule and its bound (0: the median norm)."""
        return {"rule": self.name, "norm_bound": self.norm_bound or 0.0}

    def weights(self, gram: np.ndarray) -> np.ndarray:
        """min(1, bound / ||x_i||) / m for each update."""
        norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
        bound = self.norm_bound if self.norm_bound is not None else float(np.median(norms))
        scale = np.where(norms > bound, bound / np.maximum(norms, 1e-300), 1.0)
        return scale / gram.shape[0]
