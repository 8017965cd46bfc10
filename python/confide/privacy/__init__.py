"""Differential privacy: calibration and budgets (accounting.py), noise (noise.py), the two mechanisms.

- ``distributed`` (:mod:`confide.privacy.distributed`): party-level DP of the aggregate, each
  party adding its share of discrete Gaussian noise under any protection that hides single
  updates (secagg, groupmask, paillier, threshold).
- ``dp_sgd``: record-level DP-SGD inside each party's training (``HomoLR.local_train``, the
  PyTorch adapter through Opacus, Keras networks on JAX), calibrated per party by :func:`sgd_plan`.

:func:`distributed_plan` and :func:`sgd_plan` turn a ``privacy`` section into the noise
multiplier that meets its budget, or a clear error before the job starts.
"""

from __future__ import annotations

import functools
import math

from confide.errors import InvalidParameterError
from confide.privacy.accounting import (
    ACCOUNTANT_LIBRARY,
    DistributedPlan,
    SgdPlan,
    calibrate,
    distributed_event,
    epsilon_of,
    sgd_event,
)

__all__ = ["ACCOUNTANT_LIBRARY", "DistributedPlan", "SgdPlan", "distributed_plan", "sgd_plan"]


def _over(spent: float, budget: float) -> bool:
    return spent > budget * (1 + 1e-9)


def _rounds_that_fit(spent_after, budget: float, limit: int) -> int:
    """The most rounds whose epsilon stays within ``budget`` (bisection on the accountant)."""
    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if _over(spent_after(middle), budget):
            high = middle - 1
        else:
            low = middle
    return low


def distributed_plan(privacy, rounds: int) -> DistributedPlan:
    """The update-level mechanism for ``rounds`` rounds, or :class:`InvalidParameterError` if it cannot fit."""
    return _distributed_plan(
        privacy.epsilon,
        privacy.delta,
        rounds,
        privacy.noise_multiplier,
        privacy.max_noise_multiplier,
        privacy.count_noise_ratio if privacy.adaptive_clipping else None,
        privacy.accountant,
    )


@functools.lru_cache(maxsize=64)
def _distributed_plan(epsilon, delta, rounds, fixed, maximum, ratio, accountant) -> DistributedPlan:
    def event(z: float):
        return distributed_event(z, rounds, ratio * z if ratio is not None else None)

    if fixed is not None:
        z = float(fixed)
        spent = epsilon_of(event(z), delta, accountant)
        if _over(spent, epsilon):
            fits = _rounds_that_fit(
                lambda r: epsilon_of(distributed_event(z, r, ratio * z if ratio else None), delta, accountant),
                epsilon,
                rounds,
            )
            raise InvalidParameterError(
                f"privacy: the budget cannot be met: noise_multiplier {z:g} over {rounds} rounds spends epsilon "
                f"{spent:.3f} > privacy.epsilon {epsilon:g} at delta {delta:g}; {fits} rounds fit"
            )
    else:
        z = calibrate(event, epsilon, delta, accountant)
        while _over(epsilon_of(event(z), delta, accountant), epsilon):  # the search's tolerance, on the safe side
            z *= 1.0001
        if z > maximum:
            raise InvalidParameterError(
                f"privacy: the budget cannot be met: epsilon {epsilon:g} over {rounds} rounds needs noise_multiplier "
                f"{z:.3g}, above privacy.max_noise_multiplier {maximum:g} (the model would learn nothing); raise "
                f"epsilon or lower the rounds"
            )
    return DistributedPlan(epsilon, delta, rounds, z, ratio * z if ratio is not None else None, accountant)


def sgd_plan(privacy, *, samples: int, batch_size: int, epochs: int, rounds: int) -> SgdPlan:
    """One party's DP-SGD calibration from its own row count.

    Poisson sampling at q = 1 / ceil(samples / batch_size), ceil(samples / batch_size) steps per epoch.
    """
    if samples < 2:
        raise InvalidParameterError(f"privacy: DP-SGD needs at least 2 records, this party has {samples}")
    batches = max(1, math.ceil(samples / batch_size))
    rate = 1.0 / batches  # what Opacus' DPDataLoader samples at; homo_lr does the same
    steps = epochs * batches
    total = rounds * steps

    def event(z: float):
        return sgd_event(z, rate, total)

    if privacy.noise_multiplier is not None:
        z = float(privacy.noise_multiplier)
        spent = epsilon_of(event(z), privacy.delta, privacy.accountant)
        if _over(spent, privacy.epsilon):
            raise InvalidParameterError(
                f"privacy: the budget cannot be met: noise_multiplier {z:g} over {rounds} rounds of {steps} DP-SGD "
                f"steps (sample rate {rate:.4f}) spends epsilon {spent:.3f} > privacy.epsilon {privacy.epsilon:g}"
            )
    else:
        z = calibrate(event, privacy.epsilon, privacy.delta, privacy.accountant)
        while _over(epsilon_of(event(z), privacy.delta, privacy.accountant), privacy.epsilon):
            z *= 1.0001
        if z > privacy.max_noise_multiplier:
            raise InvalidParameterError(
                f"privacy: the budget cannot be met: epsilon {privacy.epsilon:g} over {total} DP-SGD steps at sample "
                f"rate {rate:.4f} needs noise_multiplier {z:.3g}, above privacy.max_noise_multiplier "
                f"{privacy.max_noise_multiplier:g}"
            )
    return SgdPlan(privacy.epsilon, privacy.delta, z, rate, steps, privacy.accountant)
