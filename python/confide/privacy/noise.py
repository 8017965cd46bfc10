"""Noise and rounding on the integer grid: L2 clipping, randomized rounding, discrete Gaussian.

The discrete Gaussian N_Z(0, s^2) (P[x] proportional to exp(-x^2 / 2s^2) on the integers) is
sampled by Canonne, Kamath and Steinke's rejection from a discrete Laplace (NeurIPS 2020,
Algorithm 3), vectorized with numpy: draw Y = G1 - G2 (two geometric variables of parameter
1 - exp(-1/t), t = floor(s) + 1), keep it with probability exp(-(|Y| - s^2/t)^2 / (2 s^2)).
The acceptance test runs in float64 (the paper's exact version uses rationals); the
generator is numpy's PCG64 seeded from the OS per call.

Why the grid: the protections add integers exactly (masks mod 2^32, Paillier plaintexts), so
a party's noise share on the grid reaches the sum unchanged, and the sum of the parties'
shares is the noise the accountant is told about (docs/privacy.md).
"""

from __future__ import annotations

import math
import os

import numpy as np

from confide.errors import InvalidParameterError

__all__ = ["clip_l2", "discrete_gaussian", "generator", "randomized_round"]


def generator() -> np.random.Generator:
    """A fresh generator seeded with 256 bits from the OS."""
    return np.random.Generator(np.random.PCG64(int.from_bytes(os.urandom(32), "little")))


def clip_l2(vector: np.ndarray, bound: float) -> tuple[np.ndarray, float]:
    """(vector scaled to L2 norm <= bound, its norm before clipping)."""
    norm = float(np.linalg.norm(vector))
    if not math.isfinite(norm):
        raise InvalidParameterError("the update to clip is not finite")
    if norm <= bound or norm == 0.0:
        return np.asarray(vector, dtype=np.float64).copy(), norm
    return np.asarray(vector, dtype=np.float64) * (bound / norm), norm


def randomized_round(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Unbiased rounding to the integers: floor(x) + Bernoulli(frac(x)); |error| < 1 per coordinate."""
    floor = np.floor(values)
    return (floor + (rng.random(values.shape) < (values - floor))).astype(np.int64)


def discrete_gaussian(sigma: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` independent draws of N_Z(0, sigma^2) as int64 (sigma > 0)."""
    if not (math.isfinite(sigma) and sigma > 0):
        raise InvalidParameterError(f"sigma must be > 0 and finite, got {sigma}")
    t = math.floor(sigma) + 1
    p = -math.expm1(-1.0 / t)  # 1 - exp(-1/t), the geometric parameter of the discrete Laplace
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        want = max(64, int((size - filled) * 1.6))
        y = (rng.geometric(p, want) - rng.geometric(p, want)).astype(np.int64)
        accept = rng.random(want) < np.exp(-((np.abs(y) - sigma * sigma / t) ** 2) / (2 * sigma * sigma))
        kept = y[accept][: size - filled]
        out[filled : filled + kept.size] = kept
        filled += kept.size
    return out
