"""What the robust strategies share: unweighted changes, a rule the aggregator applies, its checks.

A robust strategy needs an aggregator that sees every update (protection mode ``plain``): each
party sends its change unweighted, the aggregator keeps the m updates of a slice side by side
(``AGGREGATION_KIND_FLOAT32_STACK``) and replaces their sum by a robust estimate of their mean,
and every party adds that estimate to the global model, as FedAvg adds the mean. Rules that
look at one coordinate at a time (median, trimmed mean) work slice by slice on any aggregator
node; rules that look at whole updates (Krum, norm clipping) hold every slice of the round at one
node (m times the model's bytes there) and are refused on a cluster.

``tee`` runs every rule inside the enclave (``AGGREGATION_KIND_TEE_FLOAT32_STACK``: the enclave
stacks the opened updates and seals only the estimate; whole-update rules once every slice is in).
In every mode that hides updates from the aggregator entirely (secagg, groupmask, lattice,
paillier, threshold) these strategies are refused with the reason: the aggregator cannot order,
compare or measure what it cannot read.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.strategies.base import Strategy

__all__ = ["RobustStrategy", "pairwise_squared_distances"]


class RobustStrategy(Strategy):
    """A strategy whose aggregate is a robust estimate the aggregator computes from every update."""

    #: Whether the rule needs whole updates (every slice) rather than one coordinate at a time.
    whole_vector: ClassVar[bool] = False

    def contribution(self, delta: np.ndarray, weight: float) -> np.ndarray:
        """The change itself: the rule estimates the mean change, and an outlier's example count must not weigh in."""
        return delta

    def rule(self) -> dict:
        """The fields of the header's ``RobustRule`` (its ``rule`` and this strategy's options)."""
        return {"rule": self.name}

    def check(self, participants: int) -> None:
        """Refuse a rule that cannot run with ``participants`` updates (an error naming the field)."""
        if participants < 3:
            raise InvalidParameterError(
                f"strategy.name {self.name}: a robust rule needs at least 3 participants, a round has {participants}"
            )

    def combine(self, rows: np.ndarray) -> np.ndarray:
        """Coordinate-wise rules: the estimate of one slice from its (m, n) updates."""
        raise NotImplementedError(f"strategy {self.name} combines whole updates (weights)")

    def weights(self, gram: np.ndarray) -> np.ndarray:
        """Whole-update rules: each update's weight in the estimate, from the (m, m) Gram matrix of the updates."""
        raise NotImplementedError(f"strategy {self.name} combines one coordinate at a time")

    def describe(self) -> dict:
        """Name and options, for reports."""
        return self.rule() | {"name": self.name}


def pairwise_squared_distances(gram: np.ndarray) -> np.ndarray:
    """``||x_i - x_j||^2`` from the Gram matrix ``G_ij = <x_i, x_j>`` (clamped at 0 against rounding)."""
    norms = np.diag(gram)
    return np.maximum(norms[:, None] + norms[None, :] - 2.0 * gram, 0.0)


def finite_positive(value, field: str) -> float:
    """``value`` as a float if it is finite and > 0, else an error naming ``field``."""
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InvalidParameterError(f"{field} must be a finite number > 0, got {value!r}")
    return float(value)
