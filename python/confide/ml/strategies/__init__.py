r"""Aggregation strategies: how local changes become the next global model.

A strategy sees two things only: this party's change ``delta = w_local - w_global`` (flat
float64, :class:`confide.ml.base.WeightLayout`) with its weight ``n_k / N``, and the *sum* of
every participant's contribution, which the protection mode delivers. It never knows which
protection ran, and every party applies it to the same sum, so every party holds the same
global model after each round without a trusted server.

==========  ================================================  ===============================
strategy    contribution of party k / global update           source
==========  ================================================  ===============================
fedavg      ``n_k/N delta_k``;  ``w += sum``                   McMahan et al. 2017
fedprox     as fedavg; local fit adds ``mu/2 ||w - w_g||^2``   Li et al. 2020 (MLSys)
fedadam     as fedavg; ``w += eta m / (sqrt(v) + tau)``       Reddi et al. 2021 (ICLR), Alg. 2
median      ``delta_k``; ``w +=`` coordinate-wise median         Yin et al. 2018 (ICML)
trimmed_    ``delta_k``; ``w +=`` coordinate-wise mean without   Yin et al. 2018 (ICML)
mean        the ``b`` largest and smallest, ``b = beta m``
krum        ``delta_k``; ``w +=`` the update closest to its      Blanchard et al. 2017 (NeurIPS)
            ``m - f - 2`` nearest others
multi_krum  as krum; ``w +=`` the mean of the ``k`` best         Blanchard et al. 2017
norm_clip   ``delta_k``; ``w +=`` the mean of the updates        Sun et al. 2019 ("Can you really
            clipped to an L2 bound (the median norm)            backdoor FL?")
==========  ================================================  ===============================

The last five are robust strategies (:mod:`confide.ml.strategies.robust`): the aggregator
applies them to every party's update, so they run in ``plain`` only and are refused elsewhere.

FedAdam's moments are in :mod:`confide.ml.strategies.base`.

Adding a strategy: one file subclassing :class:`Strategy` (or :class:`RobustStrategy`), one
line in :data:`STRATEGIES`.
"""

from __future__ import annotations

from confide.errors import InvalidParameterError
from confide.ml.strategies.base import FedAdam, FedAvg, FedProx, Strategy
from confide.ml.strategies.krum import Krum, MultiKrum
from confide.ml.strategies.median import Median
from confide.ml.strategies.norm_clip import NormClip
from confide.ml.strategies.robust import RobustStrategy
from confide.ml.strategies.trimmed_mean import TrimmedMean

__all__ = [
    "STRATEGIES",
    "FedAdam",
    "FedAvg",
    "FedProx",
    "RobustStrategy",
    "Strategy",
    "make_strategy",
]

STRATEGIES: dict[str, type[Strategy]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fedadam": FedAdam,
    "median": Median,
    "trimmed_mean": TrimmedMean,
    "krum": Krum,
    "multi_krum": MultiKrum,
    "norm_clip": NormClip,
}


def make_strategy(name: str, **options: float) -> Strategy:
    """The strategy ``name`` (one of :data:`STRATEGIES`) with its options."""
    if name not in STRATEGIES:
        raise InvalidParameterError(f"strategy.name must be one of {', '.join(STRATEGIES)}, got {name!r}")
    return STRATEGIES[name](**options)
