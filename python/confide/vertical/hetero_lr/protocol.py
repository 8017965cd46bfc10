"""Hetero LR's fixed point, message fields and the steps guest and hosts share (hello, resume)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from confide import _native
from confide.crypto import vectors as cv
from confide.errors import EncodingError, InvalidParameterError, ProtocolError
from confide.vertical.channel import Channel
from confide.vertical.hetero_lr.model import _Optimizer, _Scaling
from confide.vertical.hetero_lr.params import _INT_LIMIT_BITS, PROTOCOL, HeteroLRParams

# ------------------------------------------------------------------------------ crypto helpers


def _fixed(values: np.ndarray, bits: int, what: str) -> np.ndarray:
    scaled = np.rint(np.asarray(values, dtype=np.float64) * float(1 << bits))
    limit = float(1 << _INT_LIMIT_BITS)
    if scaled.size and not (np.all(np.isfinite(scaled)) and np.max(np.abs(scaled)) < limit):
        raise EncodingError(
            f"{what} left the fixed-point range |v| < 2^{_INT_LIMIT_BITS - bits} (fixed_point_bits = {bits}): "
            f"training diverged; lower learning_rate"
        )
    return scaled.astype(np.int64)


def _big_fixed(value: float, bits: int) -> int:
    """round(value 2^bits) as a Python int, for plaintext terms of any size."""
    return round(math.ldexp(value, bits)) if value < 2.0**900 else int(value) << bits


def _affine_gradient(
    vector: _native.CiphertextVector, codes: np.ndarray, scaling: _Scaling, threads: int, *, with_sum: bool
) -> tuple[_native.CiphertextVector, int]:
    """Encrypted ``sum_i xhat_ij D_i`` at scale 2^(F+E) per column j, and E.

    ``xhat = min + step q``; when ``with_sum``, ``sum_i D_i`` (scale 2^F) follows the columns.
    """
    key = vector.encryption_key
    columns, length = codes.shape
    matrix = np.vstack([codes, np.ones((1, length), dtype=np.uint64)])
    products = cv.elements(cv.dot_u64(vector, matrix, threads))
    total = products[-1]
    if columns == 0:
        return cv.from_elements([total], key), 0
    largest = max(float(np.max(scaling.quant_step)), float(np.max(np.abs(scaling.quant_min))), 2.0**-60)
    exponent = max(0, _INT_LIMIT_BITS - 1 - math.frexp(largest)[1])
    a = np.rint(np.ldexp(scaling.quant_step, exponent)).astype(np.int64)
    b = np.rint(np.ldexp(scaling.quant_min, exponent)).astype(np.int64)
    sums = cv.from_elements(products[:-1], key).mul_scalar_i64(a, threads)
    offsets = cv.from_elements([total] * columns, key).mul_scalar_i64(b, threads)
    gradient = sums.add(offsets, threads)
    if with_sum:
        gradient = cv.from_elements([*cv.elements(gradient), total], key)
    return gradient, exponent


def _vector_field(
    message: dict, name: str, key: _native.EncryptionKey, sender: str, tag: str, length: int | None
) -> _native.CiphertextVector:
    where = f"message {tag!r} from {sender}: field {name!r}"
    return cv.parse_vector(message.get(name), key, where, length, raw_only=True)


def _public_key(data: Any, sender: str) -> _native.EncryptionKey:
    return cv.parse_public_key(data, f"hello from {sender}: field 'key'")


def _int_field(message: dict, name: str, sender: str, tag: str) -> int:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"message {tag!r} from {sender}: field {name!r} must be an integer")
    return value


# ------------------------------------------------------------------------------ training


def _hello(
    party_error: Exception | None, rows: int, columns: int, params: HeteroLRParams, key: bytes, resume_epoch: int
) -> dict:
    return {
        "protocol": PROTOCOL,
        "n_rows": rows,
        "n_features": columns,
        "params": params.shared(),
        "key": key,
        "error": "" if party_error is None else str(party_error),
        "resume_epoch": resume_epoch,
    }


def _peer_problems(
    message: dict, sender: str, rows: int, params: HeteroLRParams, me: str, resume_epoch: int
) -> list[Exception]:
    """Everything wrong in a peer's hello (row counts first: the most common mistake)."""
    problems: list[Exception] = []
    if message.get("protocol") != PROTOCOL:
        return [ProtocolError(f"hello from {sender}: protocol {message.get('protocol')!r}, expected {PROTOCOL!r}")]
    if message.get("error"):
        problems.append(ProtocolError(f"{sender} cannot train: {message['error']}"))
    peer_rows = message.get("n_rows")
    if rows >= 0 and isinstance(peer_rows, int) and peer_rows >= 0 and peer_rows != rows:
        problems.append(
            InvalidParameterError(
                f"row counts differ: {me} has {rows} rows, {sender} has {peer_rows}; align the rows (PSI) first"
            )
        )
    if message.get("params") != params.shared():
        problems.append(
            InvalidParameterError(
                f"shared parameters differ: {me} has {params.shared()}, {sender} has {message.get('params')}"
            )
        )
    if message.get("resume_epoch", 0) != resume_epoch:
        problems.append(
            ProtocolError(
                f"{sender} resumes after epoch {message.get('resume_epoch', 0)}, {me} after epoch {resume_epoch}: "
                "every party must resume from the same checkpoint"
            )
        )
    return problems


def _snapshot(epoch_done: int, weights: np.ndarray, optimizer: _Optimizer, losses: list[float] | None) -> dict:
    """A party's whole training state after ``epoch_done`` epochs (what a checkpoint keeps).

    The keys are not in it: every run draws fresh ones, and no state depends on them.
    """
    state = {"epoch": epoch_done, "weights": weights.copy(), "optimizer": optimizer.state()}
    if losses is not None:
        state["losses"] = np.asarray(losses, dtype=np.float64)
    return state


def _resumed(state: dict, size: int, params: HeteroLRParams, me: str) -> tuple[np.ndarray, _Optimizer, list[float]]:
    """Weights, optimizer and epoch losses as a checkpoint left them; checked against this data."""
    weights = np.asarray(state.get("weights"), dtype=np.float64)
    if weights.shape != (size,):
        raise ProtocolError(f"{me}: the checkpoint holds {weights.size} weights, this data needs {size}")
    optimizer = _Optimizer(params, size)
    optimizer.load(state.get("optimizer") or {})
    return weights, optimizer, [float(v) for v in np.asarray(state.get("losses", []), dtype=np.float64)]


def _raise_first(own: Exception | None, problems: list[Exception]) -> None:
    if own is not None:
        raise own
    for problem in problems:
        if isinstance(problem, InvalidParameterError):
            raise problem
    if problems:
        raise problems[0]


def _epoch_record(epoch: int, loss: float | None, start: float, crypto: float, channel: Channel, sent: int, got: int):
    return {
        "epoch": epoch,
        "loss": loss,
        "seconds": time.perf_counter() - start,
        "crypto_seconds": crypto,
        "bytes_sent": channel.bytes_sent - sent,
        "bytes_received": channel.bytes_received - got,
    }
