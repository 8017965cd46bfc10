"""Update-level DP with distributed noise: each party adds its share; only the sum is noised enough.

Per round attempt with m participants, party i (docs/privacy.md has the argument):

1. clips its model change to L2 norm C (``privacy.clip_norm``; adapted every round with
   ``adaptive_clipping``, Andrew et al. 2021: C <- C exp(-eta (b - gamma)) where b is the
   noisy fraction of parties whose change was within C, released through the same sum);
2. scales it by 2^g and rounds it to the integers at random (unbiased); the L2 norm of the
   rounded vector is at most Delta = 2^g C + sqrt(d), whatever the rounding drew;
3. adds discrete Gaussian noise N_Z(0, (z Delta)^2 / (m - k)) to every coordinate, z the
   noise multiplier the accountant calibrated and k = ``tolerate_colluders`` (default 1: every
   participant knows its own share and sees the sum): the m shares sum to variance
   m/(m-k) (z Delta)^2, so even after k parties subtract their own shares the sum keeps
   (z Delta)^2;
4. hands (rounded + noise) / 2^g to the protection, which adds integers exactly: ``secagg``
   and ``groupmask`` through fixed point with 2^f >= 2^g, ``paillier`` and ``threshold``
   through BatchCrypt with alpha = floor(Q/m) / 2^g (scale exactly 2^g, no clipping: the
   range is checked against a 12-sigma tail) instead of the dACIQ ranges, which would tell the
   other parties each one's largest value.

The aggregate is divided by m (FedAvg with equal weights: the n_k / N weights would make the
sensitivity depend on the parties' sizes). The mechanism each round is the Gaussian mechanism
with sensitivity Delta and noise multiplier z, up to the discrete Gaussian sum's closeness to
N_Z(0, m sigma^2) (Kairouz, Liu, Steinke 2021, Thm. 12: negligible for per-party sigma >= 1 on
the grid, which is checked); epsilon comes from dp-accounting (:mod:`confide.privacy.accounting`).
"""

from __future__ import annotations

import math

import numpy as np

from confide.errors import InvalidParameterError
from confide.privacy.accounting import ACCOUNTANT_LIBRARY, DistributedPlan
from confide.privacy.noise import clip_l2, discrete_gaussian, generator, randomized_round

__all__ = ["DistributedNoise", "grid_bits"]

#: The protection's range must hold the clipped value plus this many noise deviations.
TAIL_SIGMAS = 12.0
#: Smallest per-party noise deviation on the grid (the discrete Gaussians' sum is then as good as one).
MIN_GRID_SIGMA = 1.0
MASKING = ("secagg", "groupmask", "lattice")
PAILLIER = ("paillier", "threshold")


def grid_bits(
    mode: str,
    *,
    bits: int,
    mask_bound: float | None,
    parties: int,
    clip: float,
    noise: float,
    dimension: int,
    count_noise: float = 0.0,
) -> int:
    """The grid 2^g for this mode: the finest whose values the protection carries exactly.

    ``noise`` is the per-party share's deviation per unit of sensitivity (z / sqrt(m - k));
    ``count_noise`` that of the adaptive clip count, whose coordinate must fit as well. A
    coordinate needs room for its value plus :data:`TAIL_SIGMAS` deviations of its share.
    """

    def need(g: int) -> float:  # the largest coordinate, in the update's units
        update = clip + TAIL_SIGMAS * noise * (clip + math.sqrt(dimension) / 2.0**g)
        return max(update, 1.0 + TAIL_SIGMAS * count_noise if count_noise else 0.0)

    if mode in MASKING:
        from confide.crypto.fixedpoint import FixedPoint

        if mask_bound is None:
            raise InvalidParameterError(
                "protection.mask_bound: null makes the parties exchange their largest value every round, which "
                "differential privacy does not cover; set a public bound"
            )
        # lattice: its messages are narrower than a word, so the grid is coarser (the same fixed point).
        ring = 32
        if mode == "lattice":
            from confide.protect.lattice import message_bits

            ring = message_bits(parties)
        g = FixedPoint(mask_bound, parties, ring).fraction_bits
        if need(g) > mask_bound:
            raise InvalidParameterError(
                f"protection.mask_bound ({mask_bound:g}) must hold the clipped update plus its noise share: at least "
                f"{need(g):.3g} for privacy.clip_norm {clip:g} and {parties} parties"
            )
        return g
    if mode in PAILLIER:
        per = ((1 << (bits - 1)) - 1) // parties
        g = math.floor(math.log2(per / need(60))) if per > 0 else -1
        while g >= 0 and 2**g * need(g) > per:
            g -= 1
        if g < 0:
            raise InvalidParameterError(
                f"protection.bits ({bits}) leaves {per} codes per party for {parties} parties, too few for the "
                f"clipped update plus its noise share; raise protection.bits (24 or 32 suit differential privacy)"
            )
        return g
    raise InvalidParameterError(
        f"privacy.mechanism distributed needs a protection that hides single updates (secagg, groupmask, lattice, "
        f"paillier, threshold); with {mode} the aggregator would see each party's update with only its share of the "
        "noise"
    )


class DistributedNoise:
    """One party's side of the mechanism for one job."""

    def __init__(self, privacy, protection, plan: DistributedPlan) -> None:
        self.privacy = privacy
        self.protection = protection
        self.plan = plan
        self.clip = float(privacy.clip_norm)
        self.dimension = 0
        self.last: dict = {}

    def _share_deviation(self, m: int) -> float:
        k = self.privacy.tolerate_colluders
        if m - k < 1:
            raise InvalidParameterError(f"privacy.tolerate_colluders ({k}) must be below the round's {m} participants")
        return self.plan.noise_multiplier / math.sqrt(m - k)

    def privatize(self, delta: np.ndarray, participants: list[str]) -> tuple[np.ndarray, float | None]:
        """The vector to protect, and the alpha the paillier modes must use (None for masking)."""
        m = len(participants)
        d = delta.size
        self.dimension = d
        share = self._share_deviation(m)
        count_share = 0.0
        if self.privacy.adaptive_clipping:
            count_share = self.plan.count_noise_multiplier / math.sqrt(m - self.privacy.tolerate_colluders)
        g = grid_bits(
            self.protection.mode,
            bits=self.protection.bits,
            mask_bound=self.protection.mask_bound,
            parties=m,
            clip=self.clip,
            noise=share,
            dimension=d,
            count_noise=count_share,
        )
        scale = float(2**g)
        sensitivity = scale * self.clip + math.sqrt(d)
        sigma = share * sensitivity
        if sigma < MIN_GRID_SIGMA:
            raise InvalidParameterError(
                f"the noise share per party is {sigma:.3g} grid steps, below {MIN_GRID_SIGMA}: raise "
                f"privacy.clip_norm or the protection's precision"
            )
        rng = generator()
        clipped, norm = clip_l2(delta, self.clip)
        grid = randomized_round(clipped * scale, rng) + discrete_gaussian(sigma, d, rng)
        parts = [grid]
        if self.privacy.adaptive_clipping:
            inside = int(norm <= self.clip)
            parts.append(np.array([inside * int(scale)]) + discrete_gaussian(count_share * scale, 1, rng))
        vector = np.concatenate(parts).astype(np.float64) / scale
        if np.max(np.abs(vector)) >= 2.0**52 / scale:
            raise InvalidParameterError(
                "a noisy coordinate left float64's exact range: lower protection.bits or protection.mask_bound"
            )
        self.last = {
            "clip_norm": self.clip,
            "grid_bits": g,
            "noise_sigma_per_party": sigma / scale,
            "sensitivity": sensitivity / scale,
        }
        alpha = (((1 << (self.protection.bits - 1)) - 1) // m) / scale if self.protection.mode in PAILLIER else None
        return vector, alpha

    def finish(self, aggregate: np.ndarray, participants: list[str]) -> np.ndarray:
        """The mean noisy clipped change; adapts the clip from the noisy count."""
        m = len(participants)
        d = self.dimension
        mean = np.asarray(aggregate[:d], dtype=np.float64) / m
        if self.privacy.adaptive_clipping:
            fraction = float(aggregate[d]) / m
            self.clip *= math.exp(-self.privacy.clip_learning_rate * (fraction - self.privacy.target_quantile))
            self.last["clip_fraction_noisy"] = fraction
            self.last["next_clip_norm"] = self.clip
        return mean

    def report(self, rounds_done: int) -> dict:
        """What ran, with the accountant's epsilon so far."""
        out = {
            "mechanism": "distributed discrete Gaussian, update level (each party clips and adds its share)",
            "unit": "one party's whole update, every round",
            "epsilon_budget": self.plan.epsilon,
            "epsilon_spent": self.plan.spent(rounds_done),
            "delta": self.plan.delta,
            "noise_multiplier": self.plan.noise_multiplier,
            "clip_norm": self.privacy.clip_norm,
            "adaptive_clipping": self.privacy.adaptive_clipping,
            "tolerate_colluders": self.privacy.tolerate_colluders,
            "accountant": f"{self.plan.accountant} ({ACCOUNTANT_LIBRARY})",
        }
        if self.privacy.adaptive_clipping:
            out["count_noise_multiplier"] = self.plan.count_noise_multiplier
            out["final_clip_norm"] = self.clip
        return out
