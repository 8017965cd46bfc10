"""Robust rules at the aggregator: the stacked updates of a slice become one robust estimate.

A round of kind ``AGGREGATION_KIND_FLOAT32_STACK`` (protection ``plain`` with a robust strategy,
:mod:`confide.ml.strategies.robust`) completes each slice as an m x n block of the participants'
float32 updates. :class:`RobustRound` turns those blocks into what the parties receive: for a
coordinate-wise rule (median, trimmed mean) each block at once; for a whole-update rule (Krum,
Multi-Krum, norm clipping) it accumulates the Gram matrix of the updates as blocks complete and
holds them (m times the share's bytes) until the last one, then weighs the updates and emits every
slice. Only the estimate is stored and delivered: no party ever receives another's update.
Under ``tee`` the enclave applies the rule (``AGGREGATION_KIND_TEE_FLOAT32_STACK``): coordinate-wise
rules as each slice completes, whole-update rules through :class:`EnclaveRobustRound`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from confide.errors import InvalidParameterError, ProtocolError
from confide.ml.strategies import STRATEGIES, RobustStrategy, make_strategy
from confide.v1 import runtime_pb2 as pb

__all__ = ["EnclaveRobustRound", "RobustRound", "strategy_of"]


def strategy_of(header: pb.RoundHeader) -> RobustStrategy:
    """The robust strategy a stacked round's header names, checked against its participants and cluster."""
    rule = header.robust
    cls = STRATEGIES.get(rule.rule)
    if cls is None or not issubclass(cls, RobustStrategy):
        robust = sorted(name for name, c in STRATEGIES.items() if issubclass(c, RobustStrategy))
        raise ProtocolError(f"header.robust.rule must be one of {', '.join(robust)}, got {rule.rule!r}")
    options = {
        "trimmed_mean": {"trim_fraction": rule.trim_fraction},
        "krum": {"byzantine": rule.byzantine},
        "multi_krum": {"byzantine": rule.byzantine, "selected": rule.selected},
        "norm_clip": {"norm_bound": rule.norm_bound or None},
    }.get(rule.rule, {})
    try:
        strategy = make_strategy(rule.rule, **options)
        strategy.check(len(header.participants))
    except InvalidParameterError as error:
        raise ProtocolError(f"header.robust: {error}") from None
    if strategy.whole_vector and header.cluster_nodes > 1:
        raise ProtocolError(
            f"header.robust.rule {rule.rule} weighs whole updates: every slice must reach one aggregator node, and a "
            f"cluster of {header.cluster_nodes} splits them (use median or trimmed_mean, or one node)"
        )
    return strategy


class EnclaveRobustRound:
    """A whole-update rule under ``tee``: hold each slice's block, sealed for the enclave, until the last.

    The enclave seals a completed slice's m x n block under a key only it holds
    (``confide-agg`` ``robust.rs``); once the share's every slice is in, ``finish`` (the data
    plane's ``finish_robust``) has the enclave weigh the updates over all of them and seal each
    slice's estimate. The host holds m times the share's bytes, all of them sealed.
    """

    def __init__(self, owned: int, finish: Callable[[list[tuple[int, bytes]]], list[tuple[int, bytes]]]) -> None:
        self.owned = owned
        self._finish = finish
        self._held: dict[int, bytes] = {}
        self._done = False
        self._lock = threading.Lock()

    def take(self, completed: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """Nothing until the last slice is in; then every slice's sealed estimate."""
        with self._lock:
            for index, sealed in completed:
                self._held.setdefault(index, sealed)
            if self._done or len(self._held) < self.owned:
                return []
            self._done = True
            held, self._held = sorted(self._held.items()), {}
        return [(index, bytes(sealed)) for index, sealed in self._finish(held)]


class RobustRound:
    """The robust estimate of one round attempt's share, slice by slice or at its last slice."""

    def __init__(self, header: pb.RoundHeader, owned: int) -> None:
        self.strategy = strategy_of(header)
        self.participants = len(header.participants)
        self.owned = owned
        self._held: dict[int, np.ndarray] = {}
        self._gram = np.zeros((self.participants, self.participants))
        self._lock = threading.Lock()
        #: The weights of the updates once decided (whole-update rules); None until the last slice is in.
        self.weights: np.ndarray | None = None

    def take(self, completed: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """The estimates to deliver for newly completed stacked slices (none yet for a whole-update rule)."""
        out = []
        with self._lock:
            for index, block in completed:
                rows = np.frombuffer(block, dtype="<f4").reshape(self.participants, -1)
                if not self.strategy.whole_vector:
                    out.append((index, np.ascontiguousarray(self.strategy.combine(rows), dtype="<f4").tobytes()))
                    continue
                if index in self._held:
                    continue
                wide = rows.astype(np.float64)
                self._gram += wide @ wide.T
                self._held[index] = rows
            if self.strategy.whole_vector and len(self._held) == self.owned and self.weights is None:
                self.weights = self.strategy.weights(self._gram)
                for index, rows in sorted(self._held.items()):
                    estimate = (self.weights @ rows.astype(np.float64)).astype("<f4")
                    out.append((index, estimate.tobytes()))
                self._held.clear()
        return out
