"""One party's differential privacy for one job: the mechanism, its ledger and the budget check.

The runner asks, in order: :meth:`PartyPrivacy.allow` before a round (stop or warn when the
round would spend more than the budget), :meth:`fit_dp_sgd` for the local training,
:meth:`privatize` / :meth:`finish` around the protected aggregation (``distributed``), then
:meth:`record` once the round is done. :meth:`state` / :meth:`load_state` ride along with the
checkpoints, so a resumed job composes the rounds it already ran.
"""

from __future__ import annotations

import logging

import numpy as np

from confide.errors import InvalidParameterError
from confide.privacy import distributed_plan, sgd_plan
from confide.privacy.accounting import ACCOUNTANT_LIBRARY, PrivacyLedger
from confide.privacy.distributed import DistributedNoise

__all__ = ["PartyPrivacy"]

log = logging.getLogger("confide.privacy")


class PartyPrivacy:
    """The ``privacy`` section of a job, as one party runs it."""

    def __init__(self, spec, party_id: str, samples: int, model=None) -> None:
        privacy = spec.privacy
        self.privacy = privacy
        self.party_id = party_id
        self.ledger = PrivacyLedger(privacy.delta, privacy.accountant)
        self.noise: DistributedNoise | None = None
        self.sgd = None
        self.stopped_at: int | None = None
        self.over_budget = False
        if privacy.mechanism == "distributed":
            self.plan = distributed_plan(privacy, spec.rounds)
            self.noise = DistributedNoise(privacy, spec.protection, self.plan)
            self._entry = {"z": self.plan.noise_multiplier}
            if self.plan.count_noise_multiplier is not None:
                self._entry["count_z"] = self.plan.count_noise_multiplier
        else:
            if model is not None and not getattr(model, "supports_dp_sgd", False):
                raise InvalidParameterError(
                    f"privacy.mechanism dp_sgd: this party's model ({type(model).__name__}) computes no per-record "
                    f"gradients; use homo_lr, a PyTorch TorchModel (Opacus), or mechanism distributed"
                )
            self.plan = sgd_plan(
                privacy,
                samples=samples,
                batch_size=int(getattr(model, "batch_size", spec.model.batch_size) or spec.model.batch_size),
                epochs=spec.model.local_epochs,
                rounds=spec.rounds,
            )
            self._entry = {
                "z": self.plan.noise_multiplier,
                "q": self.plan.sample_rate,
                "steps": self.plan.steps_per_round,
            }

    def allow(self, round_number: int) -> bool:
        """False when the round would exceed the budget and ``on_budget_spent`` is stop."""
        spent = self.ledger.spent([self._entry])
        if spent <= self.privacy.epsilon * (1 + 1e-9):
            return True
        if self.privacy.on_budget_spent == "stop":
            log.warning(
                "round %d would bring epsilon to %.4f, above the budget %g: stopping",
                round_number,
                spent,
                self.privacy.epsilon,
            )
            self.stopped_at = round_number
            return False
        log.warning(
            "round %d brings epsilon to %.4f, above the budget %g (on_budget_spent: warn)",
            round_number,
            spent,
            self.privacy.epsilon,
        )
        self.over_budget = True
        return True

    def fit_dp_sgd(self) -> tuple[float, float, float] | None:
        """(noise multiplier, clip, sample rate) for the local training, under dp_sgd."""
        if self.noise is not None:
            return None
        return (self.plan.noise_multiplier, self.privacy.clip_norm, self.plan.sample_rate)

    def privatize(self, delta: np.ndarray, participants: list[str]) -> tuple[np.ndarray, float | None] | None:
        """The vector to protect and the round's public clipping threshold (distributed); None under dp_sgd.

        The threshold goes into the round's :class:`~confide.protect.base.RoundContext` (``clipping``).
        """
        if self.noise is None:
            return None
        return self.noise.privatize(delta, participants)

    def finish(self, aggregate: np.ndarray, participants: list[str]) -> np.ndarray:
        """The mean noisy change (distributed); the aggregate unchanged under dp_sgd."""
        if self.noise is None:
            return aggregate
        return self.noise.finish(aggregate, participants)

    def record(self, steps: int | None = None) -> dict:
        """Adds the round to the ledger (with the DP-SGD steps that ran, if the model counted them)."""
        entry = dict(self._entry)
        if steps is not None and "steps" in entry:
            entry["steps"] = int(steps)
        self.ledger.entries.append(entry)
        out = {"epsilon_spent": self.ledger.spent()}
        if self.noise is not None:
            out.update(self.noise.last)
        return out

    def report(self) -> dict:
        """What ran and what it spent, for the job report."""
        rounds = len(self.ledger.entries)
        if self.noise is not None:
            out = self.noise.report(0)
        else:
            out = {
                "mechanism": "DP-SGD, record level (per-record clipping and Gaussian noise in local training)",
                "unit": "one record of this party",
                "epsilon_budget": self.plan.epsilon,
                "delta": self.plan.delta,
                "noise_multiplier": self.plan.noise_multiplier,
                "clip_norm": self.privacy.clip_norm,
                "sample_rate": self.plan.sample_rate,
                "steps_per_round": self.plan.steps_per_round,
                "accountant": f"{self.plan.accountant} ({ACCOUNTANT_LIBRARY})",
            }
        out["epsilon_spent"] = self.ledger.spent()
        out["rounds_accounted"] = rounds
        out["on_budget_spent"] = self.privacy.on_budget_spent
        if self.stopped_at is not None:
            out["stopped_before_round"] = self.stopped_at
        if self.over_budget:
            out["over_budget"] = True
        return out

    def state(self) -> dict:
        """Ledger and adaptive clip, for a checkpoint."""
        return {"ledger": self.ledger.to_json(), "clip": self.noise.clip if self.noise is not None else None}

    def load_state(self, state: dict) -> None:
        """Inverse of :meth:`state`."""
        self.ledger = PrivacyLedger.from_json(state["ledger"])
        if self.noise is not None and state.get("clip") is not None:
            self.noise.clip = float(state["clip"])
