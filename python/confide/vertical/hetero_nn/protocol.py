"""Hetero NN's fixed point in Z_(2^64), the encrypted interactive-layer steps, and what guest and hosts share."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from confide import _native
from confide.crypto import gpu
from confide.crypto import vectors as cv
from confide.errors import DataProblemError, InvalidParameterError, ProtocolError
from confide.vertical.channel import Channel
from confide.vertical.hetero_nn.model import HeteroNNGuestModel
from confide.vertical.hetero_nn.params import (
    A_BOUND,
    C_SHIFT,
    D_BOUND,
    D_Q_BITS,
    E_BITS,
    E_OFFSET,
    FA,
    FD,
    FW,
    RING,
    SIGMA,
    HeteroNNParams,
)
from confide.vertical.netlayers import (
    Adam,
)

# ----------------------------------------------------------------------------- fixed point


def _bits(x: int) -> int:
    return max(1, math.ceil(math.log2(max(2, x))))


def _forward_width(d_h: int) -> int:
    """Slot bits of the forward products: sum_k e W' (< d_h 2^(E_BITS-1) 2^64) + 2^64 rho."""
    high = _bits(d_h * (E_OFFSET * 2 + 1))
    return 64 + high + SIGMA + 1


def _grad_width(rows: int) -> tuple[int, int]:
    """(value bits, slot bits) of a_q^T delta_q + M over ``rows`` rows (signed slots)."""
    value = _bits(rows) + (FA + 3) + D_Q_BITS
    return value, value + SIGMA + 2


def _back_width(d_i: int) -> tuple[int, int]:
    """(value bits, slot bits) of sum_j E[k, j] delta_q[:, j] + R (signed slots)."""
    value = 64 + D_Q_BITS + _bits(d_i)
    return value, value + SIGMA + 2


def _quantize(values: np.ndarray, frac: int, bound: float) -> tuple[np.ndarray, int]:
    clipped = np.clip(values, -bound, bound)
    count = int(np.count_nonzero(clipped != values))
    return np.rint(clipped * float(1 << frac)).astype(np.int64), count


def _ring_random(shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(os.urandom(8 * int(np.prod(shape))), dtype=np.uint64).reshape(shape).copy()


def _to_ring(values: np.ndarray, frac: int) -> np.ndarray:
    return np.rint(np.asarray(values) * float(1 << frac)).astype(np.int64).astype(np.uint64)


def _from_ring(values: np.ndarray, frac: int) -> np.ndarray:
    return values.astype(np.uint64).view(np.int64).astype(np.float64) / float(1 << frac)


def _scaled_floor(values: list[int], c: int) -> np.ndarray:
    """floor(v c / 2^C_SHIFT) mod 2^64 for each big integer v, as uint64."""
    return np.array([((v * c) >> C_SHIFT) % RING for v in values], dtype=np.uint64)


def _lr_multiplier(params: HeteroNNParams, rows: int) -> int:
    """The SGD multiplier c 2^C_SHIFT, c = lr / rows, rescaled from scale 2^(FA+FD) to the weights' 2^FW."""
    return round(params.interactive_learning_rate / rows * 2.0 ** (FW - FA - FD + C_SHIFT))


def _vector(data: Any, key: _native.EncryptionKey, length: int, where: str) -> _native.CiphertextVector:
    return cv.parse_vector(data, key, where, length)


def _public_key(data: Any, sender: str, me: str) -> _native.EncryptionKey:
    return cv.parse_public_key(data, f"{me}: the hello from {sender}")


# ----------------------------------------------------------------------------- protocol pieces


class _Layout:
    """Packing geometry for one host: forward rows per ciphertext P, batch rows per ciphertext s."""

    def __init__(self, params: HeteroNNParams, d_h: int, n: int) -> None:
        usable = n.bit_length() - 1
        d_i = params.interactive_units
        self.d_h, self.d_i = d_h, d_i
        self.w_f = _forward_width(d_h)
        self.per_forward = max(1, usable // (d_i * self.w_f))
        if d_i * self.w_f > usable:
            raise InvalidParameterError(f"interactive_units {d_i} does not fit one {usable}-bit plaintext per row")
        self.rho_bits = self.w_f - 1 - 64
        self.g_value, self.w_g = _grad_width(params.batch_size)
        if d_i * self.w_g > usable:
            raise InvalidParameterError(f"interactive_units {d_i} x {self.w_g} bits exceed the plaintext")
        self.y_value, self.w_d = _back_width(d_i)
        self.per_group = max(1, usable // self.w_d)


def _encrypt_shares(layout: _Layout, share: np.ndarray, encrypt, n: int, threads: int) -> _native.CiphertextVector:
    """[[W'_h]] with row k of the share at each of P row positions (index p d_h + k)."""
    rows = []
    for p in range(layout.per_forward):
        for k in range(layout.d_h):
            rows.append([0] * (p * layout.d_i) + [int(v) for v in share[k]])
    return encrypt(cv.raw_plaintexts(cv.pack_slots(rows, layout.w_f), n), "fixed_base", threads)


def _host_forward(
    layout: _Layout,
    bases: _native.CiphertextVector,
    a: np.ndarray,
    share: np.ndarray,
    key: _native.EncryptionKey,
    n: int,
    threads: int,
) -> tuple[_native.CiphertextVector, int]:
    """[[a_q W'_h + a_q E_h mod 2^64 + 2^64 rho]] for each row, P rows per ciphertext."""
    a_q, clipped = _quantize(a, FA, A_BOUND)
    rows = a_q.shape[0]
    per = layout.per_forward
    outputs = math.ceil(rows / per)
    e = np.zeros((outputs * per, layout.d_h), dtype=np.uint64)
    e[:rows] = (a_q + E_OFFSET).astype(np.uint64)
    products = bases.dot_u64(np.ascontiguousarray(e.reshape(outputs, per * layout.d_h)), E_BITS, threads)
    low = a_q.astype(np.uint64) @ share  # a_q E_h mod 2^64
    rho = cv.random_below(rows * layout.d_i, layout.rho_bits)
    addend = np.zeros((outputs * per, layout.d_i), dtype=object)
    addend[:rows] = low.astype(object) + (np.array(rho, dtype=object).reshape(rows, layout.d_i) << 64)
    packed = cv.pack_slots(addend.reshape(outputs, per * layout.d_i).tolist(), layout.w_f)
    return products.add(gpu.encrypt_raw(key, cv.raw_plaintexts(packed, n), "fixed_base", threads), threads), clipped


def _guest_forward_open(
    layout: _Layout,
    secret: _native.DecryptionKey,
    vector: _native.CiphertextVector,
    share: np.ndarray,
    rows: int,
    n: int,
    threads: int,
    where: str,
) -> np.ndarray:
    """z_h (float) from the host's forward ciphertexts."""
    per = layout.per_forward
    values: list[int] = []
    for v in cv.decrypt_centered(secret, vector, n, threads):
        values += cv.unpack_unsigned(v, layout.w_f, per * layout.d_i, where)
    low = np.array([v % RING for v in values[: rows * layout.d_i]], dtype=np.uint64).reshape(rows, layout.d_i)
    offset = np.uint64(E_OFFSET) * share.sum(axis=0, dtype=np.uint64)
    return _from_ring(low - offset, FA + FW)


def _encode_delta(layout: _Layout, delta: np.ndarray, encrypt, n: int, threads: int):
    """[[delta_b]] per row and [[delta[:, j]]] per group of s rows; delta_q; clip count."""
    d_q, clipped = _quantize(delta, FD, D_BOUND)
    rows = d_q.shape[0]
    by_row = encrypt(cv.raw_plaintexts(cv.pack_slots(d_q.tolist(), layout.w_g), n), "fixed_base", threads)
    s = layout.per_group
    groups = math.ceil(rows / s)
    padded = np.zeros((groups * s, layout.d_i), dtype=np.int64)
    padded[:rows] = d_q
    columns = padded.reshape(groups, s, layout.d_i).transpose(0, 2, 1).reshape(groups * layout.d_i, s)
    by_column = encrypt(cv.raw_plaintexts(cv.pack_slots(columns.tolist(), layout.w_d), n), "fixed_base", threads)
    return by_row, by_column, d_q, clipped


def _host_gradient(layout: _Layout, by_row, a_q_e: np.ndarray, key, n: int, threads: int):
    """[[a_q^T delta_q + M]] (d_h ciphertexts of d_i slots) and the masks M."""
    rows = a_q_e.shape[0]
    matrix = np.vstack([a_q_e.T, np.ones((1, rows), dtype=np.uint64)])
    products = cv.elements(by_row.dot_u64(np.ascontiguousarray(matrix), E_BITS, threads))
    correction = _native.CiphertextVector.from_elements([products[-1]], key).mul_scalar_i64(
        np.array([-E_OFFSET], dtype=np.int64), threads
    )
    corr = cv.elements(correction)[0]
    masks = cv.random_below(layout.d_h * layout.d_i, layout.g_value + SIGMA)
    mask_rows = [masks[k * layout.d_i : (k + 1) * layout.d_i] for k in range(layout.d_h)]
    gradient = _native.CiphertextVector.from_elements(products[:-1], key).add(
        _native.CiphertextVector.from_elements([corr] * layout.d_h, key), threads
    )
    return gradient.add(
        gpu.encrypt_raw(key, cv.raw_plaintexts(cv.pack_slots(mask_rows, layout.w_g), n), "fixed_base", threads), threads
    ), mask_rows


def _host_back(layout: _Layout, by_column, share: np.ndarray, rows: int, key, n: int, threads: int):
    """[[sum_j E[k, j] delta[:, j] + R]] per group and k; the masks R (rows x d_h ints)."""
    s = layout.per_group
    groups = math.ceil(rows / s)
    products = by_column.dot_groups_u64(np.ascontiguousarray(share), 64, threads)  # index g d_h + k
    masks = cv.random_below(groups * layout.d_h * s, layout.y_value + SIGMA)
    packed = cv.pack_slots([masks[i * s : (i + 1) * s] for i in range(groups * layout.d_h)], layout.w_d)
    masked = products.add(gpu.encrypt_raw(key, cv.raw_plaintexts(packed, n), "fixed_base", threads), threads)
    # masks[(g d_h + k) s + r] belongs to row g s + r, column k
    r = (
        np.array(masks, dtype=object)
        .reshape(groups, layout.d_h, s)
        .transpose(0, 2, 1)
        .reshape(groups * s, layout.d_h)[:rows]
    )
    return masked, r


def _guest_back_open(
    layout: _Layout, secret, vector, d_q: np.ndarray, share: np.ndarray, n: int, threads: int, where: str
) -> np.ndarray:
    """(Y + R + delta_q W'^T) mod 2^64 per row and k (uint64)."""
    rows = d_q.shape[0]
    s = layout.per_group
    groups = math.ceil(rows / s)
    slots: list[int] = []
    for v in cv.decrypt_centered(secret, vector, n, threads):
        slots += cv.unpack_signed(v, layout.w_d, s, where)
    y = (
        np.array([v % RING for v in slots], dtype=np.uint64)
        .reshape(groups, layout.d_h, s)
        .transpose(0, 2, 1)
        .reshape(groups * s, layout.d_h)[:rows]
    )
    return y + d_q.astype(np.uint64) @ share.T


# ----------------------------------------------------------------------------- training


def _hello(error: Exception | None, rows: int, columns: int, params: HeteroNNParams, extra: dict) -> dict:
    return {"error": None if error is None else f"{type(error).__name__}: {error}", "rows": rows, "columns": columns,
            "params": params.shared(), **extra}  # fmt: skip


def _peer_problem(
    message: dict, sender: str, rows: int, params: HeteroNNParams, me: str, resume_epoch: int = 0
) -> Exception | None:
    if message.get("error"):
        return ProtocolError(f"{me}: {sender!r} could not start: {message['error']}")
    if message.get("params") != params.shared():
        theirs = message.get("params") or {}
        diff = sorted(k for k in params.shared() if theirs.get(k) != params.shared()[k])
        return InvalidParameterError(f"{me}: {sender} runs different hetero_nn parameters ({', '.join(diff)})")
    if message.get("rows") != rows:
        return DataProblemError(
            f"{me}: {sender} has {message.get('rows')} rows, {me} has {rows}: align the records (PSI) first"
        )
    if message.get("resume_epoch", 0) != resume_epoch:
        return ProtocolError(
            f"{me}: {sender} resumes after epoch {message.get('resume_epoch', 0)}, {me} after epoch {resume_epoch}: "
            f"every party must resume from the same checkpoint"
        )
    return None


def _bottom_dim(reply: dict, host: str, params: HeteroNNParams, me: str) -> int:
    """The width of a host's bottom output, as its hello says (checked against a numpy spec)."""
    d_h = reply.get("bottom_dim")
    if not isinstance(d_h, int) or isinstance(d_h, bool) or not 1 <= d_h <= 65536:
        raise ProtocolError(f"{me}: {host} gave no valid bottom_dim (its bottom model's output width): {d_h!r}")
    expected = params.host_dim(int(reply.get("columns", 0)))
    if expected is not None and d_h != expected:
        raise ProtocolError(f"{me}: {host}'s bottom model has {d_h} outputs, host_bottom says {expected}")
    return d_h


def _raise(own: Exception | None, problems: list[Exception]) -> None:
    if own is not None:
        raise own
    if problems:
        raise problems[0]


class _EpochClock:
    """One epoch's record: seconds, crypto seconds and bytes since the epoch began."""

    def __init__(self, epoch: int, channel: Channel, meter: cv.Meter) -> None:
        self.epoch, self.channel, self.meter = epoch, channel, meter
        self.start, self.crypto = time.perf_counter(), meter.seconds
        self.sent, self.received = channel.bytes_sent, channel.bytes_received

    def close(self, history: list[dict], on_epoch: Callable[..., None] | None, snapshot, **extra: Any) -> None:
        entry = {
            "epoch": self.epoch + 1,
            **({"loss": extra.pop("loss")} if "loss" in extra else {}),
            "seconds": time.perf_counter() - self.start,
            "crypto_seconds": self.meter.seconds - self.crypto,
            "bytes_sent": self.channel.bytes_sent - self.sent,
            "bytes_received": self.channel.bytes_received - self.received,
            **extra,
        }
        history.append(entry)
        if on_epoch is not None:
            on_epoch(entry, snapshot)


def _adam_state(adam: Adam) -> dict:
    return {"t": adam.t, "m": [m.copy() for m in adam.m], "v": [v.copy() for v in adam.v]}


def _adam_from(state: dict | None, learning_rate: float) -> Adam:
    adam = Adam(learning_rate)
    if state:
        adam.t = int(state["t"])
        # The saved moments keep their dtype (float32 for a framework network's parameters).
        adam.m = [np.array(m) for m in state["m"]]
        adam.v = [np.array(v) for v in state["v"]]
    return adam


def _resumed_guest(state: dict, hosts: list[str], d_hs: dict, params: HeteroNNParams, me: str) -> HeteroNNGuestModel:
    """The guest's model and optimizer as a checkpoint left them."""
    model = HeteroNNGuestModel.from_dict(state["model"])
    if sorted(model.hosts) != sorted(hosts):
        raise ProtocolError(f"{me}: the checkpoint was made with hosts {model.hosts}, not {hosts}")
    for h in hosts:
        if model.shares[h].shape != (d_hs[h], params.interactive_units):
            raise ProtocolError(f"{me}: the checkpoint's share for {h} does not fit its {d_hs[h]} bottom outputs")
    model.net.adam = _adam_from(state.get("adam"), params.learning_rate)
    return model


def _ring_array(data: Any, shape: tuple[int, int], where: str) -> np.ndarray:
    if not isinstance(data, np.ndarray) or data.dtype != np.uint64 or data.shape != shape:
        got = getattr(data, "shape", type(data).__name__)
        raise ProtocolError(f"{where}: expected a uint64 array of shape {shape}, got {got}")
    return data
