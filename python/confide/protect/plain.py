"""``plain``: updates in the clear (the baseline; the aggregator sees every update).

Values travel as float32 unless ``protection.wire`` narrows them: ``float16`` or ``bfloat16``
(2 bytes a value, rounded to nearest even) or ``int8`` (1 byte a value and one float32 scale
per slice: ``q = round(x / scale)``, ``scale = max|x| / 127``). The aggregator widens each
slice back to float32 before it sums (its ``f16_sum``, ``bf16_sum``, ``q8_sum`` kinds), and the
sum comes back as float32: narrowing halves or quarters the upload, not the download. ``tee``
seals the same narrow bytes (:func:`narrow`), and its enclave widens them after opening.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from confide.errors import InvalidParameterError
from confide.protect.base import Protection, ProtectionParams, RoundContext
from confide.v1 import runtime_pb2 as pb

__all__ = ["WIRE_KINDS", "Plain", "check_wire", "narrow", "to_bfloat16", "widened"]

#: protection.wire -> the aggregation kind its slices travel as.
WIRE_KINDS = {
    "float32": pb.AGGREGATION_KIND_FLOAT32_SUM,
    "float16": pb.AGGREGATION_KIND_FLOAT16_SUM,
    "bfloat16": pb.AGGREGATION_KIND_BFLOAT16_SUM,
    "int8": pb.AGGREGATION_KIND_INT8_SCALED_SUM,
}
_FLOAT16_MAX = float(np.finfo(np.float16).max)


def check_wire(wire: str) -> str:
    """``wire`` if it is one of :data:`WIRE_KINDS`, else an error naming the field."""
    if wire not in WIRE_KINDS:
        raise InvalidParameterError(f"protection.wire must be one of {', '.join(WIRE_KINDS)}, got {wire!r}")
    return wire


def narrow(values: np.ndarray, wire: str, round_number: int) -> bytes:
    """A slice's values as ``wire`` carries them.

    The float modes' one encoder: plain sends these bytes, tee seals them. float16 refuses a
    value past its range, naming the round; int8 puts its float32 scale first.
    """
    if wire == "float32":
        return np.ascontiguousarray(values, dtype="<f4").tobytes()
    values = np.asarray(values, dtype=np.float32)
    if wire == "bfloat16":
        return to_bfloat16(values).tobytes()
    largest = float(np.abs(values).max()) if values.size else 0.0
    if wire == "float16":
        if largest > _FLOAT16_MAX:
            raise InvalidParameterError(
                f"protection.wire float16: round {round_number} holds a value of magnitude {largest:.6g}, past "
                f"float16's largest ({_FLOAT16_MAX:.0f}); use bfloat16 (float32's range)"
            )
        return values.astype("<f2").tobytes()
    scale = np.float32(largest / 127.0)
    quantized = np.rint(values / scale) if scale > 0 else np.zeros_like(values)
    return scale.astype("<f4").tobytes() + np.clip(quantized, -127, 127).astype(np.int8).tobytes()


def widened(values: np.ndarray, wire: str) -> np.ndarray:
    """The float32 values the aggregator sums for a slice sent as ``narrow(values, wire)`` (exactly)."""
    if wire == "float32":
        return np.asarray(values, dtype=np.float32)
    if wire == "float16":
        return np.asarray(values, dtype=np.float32).astype(np.float16).astype(np.float32)
    data = narrow(values, wire, 0)
    if wire == "bfloat16":
        return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    scale = np.frombuffer(data[:4], dtype="<f4")[0]  # as the data plane: float32(q) * scale
    return np.frombuffer(data[4:], dtype=np.int8).astype(np.float32) * scale


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """bfloat16 words (uint16) of float32 ``values``, rounded to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype("<u2")


class Plain(Protection):
    """No protection: little-endian float32 words, or narrower ones (``protection.wire``)."""

    mode = "plain"
    kind = pb.AGGREGATION_KIND_FLOAT32_SUM
    aggregator_sees = "every party's update in the clear"
    verify_arithmetic = "float"

    def __init__(self, exchange, params: ProtectionParams) -> None:
        super().__init__(exchange, params)
        self.kind = WIRE_KINDS[check_wire(params.wire)]

    def use_robust(self, rule: dict) -> None:
        """Slices stacked, not summed, at the aggregator, which applies ``rule`` (float32 wire only)."""
        if self.params.wire != "float32":
            raise InvalidParameterError(
                f"strategy.name {rule['rule']} needs protection.wire float32, got {self.params.wire}"
            )
        self.kind = pb.AGGREGATION_KIND_FLOAT32_STACK
        self.robust = pb.RobustRule(**rule)

    def share(self, round_number, tag, payload, peers) -> None:
        """Sent in the clear (this mode hides nothing from the aggregator)."""
        self.exchange.send(round_number, tag, payload, list(peers))

    def collect(self, round_number, tag, peer, timeout=None) -> bytes:
        """Received in the clear."""
        return self.exchange.recv(round_number, tag, peer, timeout=timeout)

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """The slice in the job's wire format."""
        return narrow(values, self.params.wire, context.round)

    def verify_image(self, context: RoundContext, index: int, values: np.ndarray) -> np.ndarray:
        """The float32 values the aggregator sums for this slice."""
        return widened(values, self.params.wire)

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """Concatenate the summed slices (float32 whatever the wire)."""
        out = context.output()
        for index in range(context.num_slices):
            start, stop = context.bounds(index)
            payload = result(index).payload
            values = np.frombuffer(payload, dtype="<f4")
            self.verified(index, payload, values)
            out[start:stop] = values
        return out

    def report(self) -> dict:
        """The mode, and the wire format its slices took."""
        out = {**super().report(), "wire": self.params.wire}
        if self.robust is not None:
            out["robust_rule"] = self.robust.rule
            out["aggregator_sees"] += f"; it returns their {self.robust.rule.replace('_', ' ')}, not their sum"
        return out
