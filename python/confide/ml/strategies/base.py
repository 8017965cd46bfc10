r"""The strategy base class and the strategies whose aggregate is the parties' sum: FedAvg, FedProx, FedAdam.

FedAdam's moments, with ``d = sum_k n_k/N delta_k`` the weighted mean change::

    m <- beta1 m + (1 - beta1) d
    v <- beta2 v + (1 - beta2) d^2
    w <- w + eta m / (sqrt(v) + tau)

(no bias correction, as in the paper). ``m`` and ``v`` are state: checkpoints carry them, so a
resumed job continues exactly. The table of strategies is in :mod:`confide.ml.strategies`.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from confide.errors import InvalidParameterError

__all__ = ["FedAdam", "FedAvg", "FedProx", "Strategy"]


class Strategy:
    """FedAvg by default: subclasses change what is sent, how the sum is applied, or the local fit."""

    name: ClassVar[str] = "fedavg"

    def __init__(self, **options: float) -> None:
        if options:
            raise InvalidParameterError(f"strategy {self.name} takes no options, got {sorted(options)}")

    #: FedProx's mu (0: no proximal term in the local fit).
    proximal_mu: float = 0.0
    #: Whether :meth:`apply` is ``global += aggregate``: the round loop may then add a large
    #: aggregate a chunk at a time from disk instead of calling it.
    adds_aggregate: ClassVar[bool] = True

    def contribution(self, delta: np.ndarray, weight: float) -> np.ndarray:
        """What this party protects and sends: its change weighted by ``n_k / N``, scaled in place.

        The round loop holds no second copy of the change: it keeps what it passed and, when a
        retry changes the weight, passes the ratio of the new weight to the old.
        """
        delta *= weight
        return delta

    def apply(self, global_weights: np.ndarray, aggregate: np.ndarray) -> np.ndarray:
        """The next global model from the current one and the sum of contributions.

        Works in place on ``global_weights`` (returned); ``aggregate`` is not changed.
        """
        global_weights += aggregate
        return global_weights

    def state(self) -> dict[str, np.ndarray]:
        """State to checkpoint (none by default)."""
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:  # noqa: B027 - optional hook
        """Restore :meth:`state` from a checkpoint."""

    def describe(self) -> dict:
        """For reports."""
        return {"name": self.name}


class FedAvg(Strategy):
    """Weighted by examples: the global model is the example-weighted mean of local models."""

    name = "fedavg"


class FedProx(Strategy):
    """FedAvg's aggregation with a proximal term in every local fit (``mu`` > 0)."""

    name = "fedprox"

    def __init__(self, mu: float = 0.01) -> None:
        if not (isinstance(mu, int | float) and 0 < mu <= 1e3):
            raise InvalidParameterError(f"strategy.mu must be in (0, 1000], got {mu!r}")
        self.proximal_mu = float(mu)

    def describe(self) -> dict:
        """Name and mu."""
        return {"name": self.name, "mu": self.proximal_mu}


class FedAdam(Strategy):
    """Adam applied to the weighted mean change, identically at every party (a server-side optimizer)."""

    name = "fedadam"
    adds_aggregate = False

    def __init__(
        self, server_learning_rate: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3
    ) -> None:
        for field, value, high in (
            ("server_learning_rate", server_learning_rate, 100.0),
            ("beta1", beta1, 1.0),
            ("beta2", beta2, 1.0),
            ("tau", tau, 10.0),
        ):
            closed = not field.startswith("beta")  # betas must stay below 1
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (0.0 < value <= high if closed else 0.0 < value < high)
            ):
                raise InvalidParameterError(
                    f"strategy.{field} must be in (0, {high:g}{']' if closed else ')'}, got {value!r}"
                )
        self.eta, self.beta1, self.beta2, self.tau = float(server_learning_rate), float(beta1), float(beta2), float(tau)
        self._m: np.ndarray | None = None
        self._v: np.ndarray | None = None

    def apply(self, global_weights: np.ndarray, aggregate: np.ndarray) -> np.ndarray:
        """One Adam step on the mean change, in place (the moments in the model's dtype)."""
        if self._m is None or self._m.shape != aggregate.shape:
            self._m = np.zeros_like(aggregate)
            self._v = np.zeros_like(aggregate)
        m, v = self._m, self._v
        m *= self.beta1
        m += (1 - self.beta1) * aggregate
        step = np.square(aggregate)  # one scratch vector; the sum itself is left as it is
        step *= 1 - self.beta2
        v *= self.beta2
        v += step
        np.sqrt(v, out=step)  # eta m / (sqrt(v) + tau)
        step += self.tau
        np.divide(m, step, out=step)
        step *= self.eta
        global_weights += step
        return global_weights

    def state(self) -> dict[str, np.ndarray]:
        """The moments."""
        return {} if self._m is None else {"m": self._m.copy(), "v": self._v.copy()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore the moments (``m`` and ``v``, one shape); bad state is an :class:`InvalidParameterError`."""
        if state:
            if set(state) != {"m", "v"}:
                raise InvalidParameterError(f"fedadam state must hold exactly m and v, got {sorted(state)}")
            try:
                raw = [np.asarray(state[name]) for name in ("m", "v")]
                m, v = (np.array(r, dtype=_moment_dtype(r)) for r in raw)
            except (TypeError, ValueError) as error:
                raise InvalidParameterError(f"fedadam state: m and v must be float arrays ({error})") from None
            if m.shape != v.shape:
                raise InvalidParameterError(f"fedadam state: m and v must have one shape, got {m.shape}, {v.shape}")
            self._m, self._v = m, v

    def describe(self) -> dict:
        """Name and hyper-parameters."""
        return {
            "name": self.name,
            "server_learning_rate": self.eta,
            "beta1": self.beta1,
            "beta2": self.beta2,
            "tau": self.tau,
        }


def _moment_dtype(values) -> np.dtype:
    """A stored moment keeps its float dtype (float32 for a float32 model), float64 otherwise."""
    return np.dtype(np.float32) if values.dtype == np.float32 else np.dtype(np.float64)
