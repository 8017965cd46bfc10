"""``plain``: float32 updates in the clear (the baseline; the aggregator sees every update)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from confide.protect.base import Protection, RoundContext
from confide.v1 import runtime_pb2 as pb

__all__ = ["Plain"]


class Plain(Protection):
    """No protection: little-endian float32 words."""

    mode = "plain"
    kind = pb.AGGREGATION_KIND_FLOAT32_SUM
    aggregator_sees = "every party's update in the clear"

    def share(self, round_number, tag, payload, peers) -> None:
        """Sent in the clear (this mode hides nothing from the aggregator)."""
        self.exchange.send(round_number, tag, payload, list(peers))

    def collect(self, round_number, tag, peer, timeout=None) -> bytes:
        """Received in the clear."""
        return self.exchange.recv(round_number, tag, peer, timeout=timeout)

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """float32 words."""
        return np.ascontiguousarray(values, dtype="<f4").tobytes()

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """Concatenate the summed slices."""
        out = context.output()
        for index in range(context.num_slices):
            start, stop = context.bounds(index)
            out[start:stop] = np.frombuffer(result(index).payload, dtype="<f4")
        return out
