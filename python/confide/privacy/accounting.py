"""Privacy accounting through Google's ``dp-accounting``: every epsilon Confide reports comes from it.

Two mechanisms are accounted, never by formulas of ours:

- **Update-level, distributed** (``privacy.mechanism: distributed``): each round releases the
  sum of the participants' clipped updates plus Gaussian noise of standard deviation z times
  the L2 sensitivity (``GaussianDpEvent(z)``); with adaptive clipping, also the sum of the
  parties' "norm below the clip" bits with noise multiplier z_b (a second ``GaussianDpEvent``).
  R rounds compose: ``SelfComposedDpEvent(ComposedDpEvent([...]), R)``. Every party takes part
  in every round (no sampling), so the guarantee is per party: its whole update, every round.
- **Record-level DP-SGD** (``privacy.mechanism: dp_sgd``): each local step samples each record
  with probability q (Poisson) and adds Gaussian noise to the clipped per-record gradients;
  T steps compose: ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), T)``.

The accountant is RDP (``RdpAccountant``, as Opacus and TF Privacy use) by default, or PLD
(``PLDAccountant``: tighter, slower). Calibration finds the smallest z whose epsilon meets the
budget with ``dp_accounting.mechanism_calibration.calibrate_dp_mechanism``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from importlib.metadata import version

import dp_accounting
from dp_accounting import mechanism_calibration, pld, rdp

from confide.errors import InvalidParameterError

__all__ = [
    "ACCOUNTANT_LIBRARY",
    "DistributedPlan",
    "PrivacyLedger",
    "SgdPlan",
    "calibrate",
    "distributed_event",
    "epsilon_of",
    "sgd_event",
]

# The RDP accountant logs a warning for every order whose series does not converge during a
# calibration's search and leaves that order out (the bound stays valid, from the others).
logging.getLogger("absl").setLevel(logging.ERROR)

#: What computes every epsilon, for reports.
ACCOUNTANT_LIBRARY = f"dp-accounting {version('dp-accounting')}"


def _accountant(kind: str):
    if kind == "rdp":
        return rdp.RdpAccountant()
    if kind == "pld":
        return pld.PLDAccountant()
    raise InvalidParameterError(f"accountant must be 'rdp' or 'pld', got {kind!r}")


def distributed_event(noise_multiplier: float, rounds: int, count_noise_multiplier: float | None = None):
    """R rounds of the update-level Gaussian mechanism (plus the clip-count release, if adaptive)."""
    per_round = dp_accounting.GaussianDpEvent(noise_multiplier)
    if count_noise_multiplier is not None:
        per_round = dp_accounting.ComposedDpEvent([per_round, dp_accounting.GaussianDpEvent(count_noise_multiplier)])
    return dp_accounting.SelfComposedDpEvent(per_round, rounds)


def sgd_event(noise_multiplier: float, sample_rate: float, steps: int):
    """T steps of Poisson-sampled Gaussian DP-SGD."""
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), steps
    )


def epsilon_of(event, delta: float, accountant: str = "rdp") -> float:
    """Epsilon of ``event`` at ``delta`` (0 events: 0)."""
    account = _accountant(accountant)
    account.compose(event)
    return float(account.get_epsilon(delta))


def calibrate(make_event, epsilon: float, delta: float, accountant: str = "rdp") -> float:
    """The smallest noise multiplier z with epsilon(make_event(z)) <= ``epsilon`` (bisection by dp-accounting)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidParameterError(f"privacy.epsilon must be > 0 and finite, got {epsilon}")
    try:
        return float(
            mechanism_calibration.calibrate_dp_mechanism(
                lambda: _accountant(accountant),
                make_event,
                epsilon,
                delta,
                mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0),
                tol=1e-4,
            )
        )
    except (mechanism_calibration.NoBracketIntervalFoundError, ValueError, OverflowError) as error:
        raise InvalidParameterError(
            f"privacy: no noise multiplier meets privacy.epsilon {epsilon} at privacy.delta {delta}: {error}"
        ) from None


@dataclass(frozen=True)
class DistributedPlan:
    """The calibrated update-level mechanism of one job (the same at every party)."""

    epsilon: float
    delta: float
    rounds: int
    noise_multiplier: float
    count_noise_multiplier: float | None
    accountant: str

    def spent(self, rounds: int) -> float:
        """Epsilon after ``rounds`` rounds."""
        if rounds <= 0:
            return 0.0
        return epsilon_of(
            distributed_event(self.noise_multiplier, rounds, self.count_noise_multiplier), self.delta, self.accountant
        )


@dataclass(frozen=True)
class SgdPlan:
    """One party's calibrated DP-SGD (its sample rate depends on its own row count)."""

    epsilon: float
    delta: float
    noise_multiplier: float
    sample_rate: float
    steps_per_round: int
    accountant: str

    def spent(self, rounds: int) -> float:
        """Epsilon of this party's records after ``rounds`` rounds of local DP-SGD."""
        if rounds <= 0:
            return 0.0
        return epsilon_of(
            sgd_event(self.noise_multiplier, self.sample_rate, rounds * self.steps_per_round),
            self.delta,
            self.accountant,
        )


@dataclass
class PrivacyLedger:
    """Every round's mechanism as it ran, composed by the accountant (survives checkpoints as JSON).

    An entry is ``{"z": .., "count_z": ..}`` (a distributed round) or ``{"z": .., "q": .., "steps": ..}``
    (one round of local DP-SGD). Rounds that ran with other parameters (a job tuned or resumed
    with another calibration) compose as they ran.
    """

    delta: float
    accountant: str = "rdp"
    entries: list[dict] = field(default_factory=list)

    @staticmethod
    def _event(entry: dict):
        if "q" in entry:
            return sgd_event(entry["z"], entry["q"], entry["steps"])
        return distributed_event(entry["z"], 1, entry.get("count_z"))

    def spent(self, extra: list[dict] | None = None) -> float:
        """Epsilon of every recorded round (and ``extra`` ones not yet run)."""
        entries = self.entries + (extra or [])
        if not entries:
            return 0.0
        groups: list[tuple[dict, int]] = []
        for entry in entries:
            if groups and groups[-1][0] == entry:
                groups[-1] = (entry, groups[-1][1] + 1)
            else:
                groups.append((entry, 1))
        events = [dp_accounting.SelfComposedDpEvent(self._event(entry), count) for entry, count in groups]
        return epsilon_of(dp_accounting.ComposedDpEvent(events), self.delta, self.accountant)

    def to_json(self) -> dict:
        """For the checkpoint."""
        return {"delta": self.delta, "accountant": self.accountant, "entries": self.entries}

    @classmethod
    def from_json(cls, data: dict) -> PrivacyLedger:
        """Inverse of :meth:`to_json`."""
        return cls(float(data["delta"]), str(data["accountant"]), [dict(e) for e in data["entries"]])
