"""Hetero LR's models, input checks, per-party scaling and optimizer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from confide._checks import check_int as _check_int
from confide.errors import InvalidParameterError
from confide.vertical.hetero_lr.params import (
    _ADAM_BETA1,
    _ADAM_BETA2,
    _ADAM_EPS,
    _GUEST_FORMAT,
    _HOST_FORMAT,
    HeteroLRParams,
)

# ------------------------------------------------------------------------------ models


def _floats(values: Any, name: str, length: int | None = None) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a list of numbers") from None
    if length is not None and array.size != length:
        raise InvalidParameterError(f"{name} must hold {length} values, got {array.size}")
    if not np.all(np.isfinite(array)):
        raise InvalidParameterError(f"{name} must be finite")
    return array


@dataclass
class _Scaling:
    """A party's local standardization and quantization of its columns."""

    mean: np.ndarray
    scale: np.ndarray
    quant_min: np.ndarray
    quant_step: np.ndarray
    feature_bits: int

    def to_dict(self) -> dict:
        return {
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "quant_min": self.quant_min.tolist(),
            "quant_step": self.quant_step.tolist(),
            "feature_bits": self.feature_bits,
        }

    @classmethod
    def from_dict(cls, data: dict, columns: int) -> _Scaling:
        return cls(
            mean=_floats(data.get("mean"), "mean", columns),
            scale=_floats(data.get("scale"), "scale", columns),
            quant_min=_floats(data.get("quant_min"), "quant_min", columns),
            quant_step=_floats(data.get("quant_step"), "quant_step", columns),
            feature_bits=_check_int("feature_bits", data.get("feature_bits"), 8, 24),
        )

    def standardize(self, X: np.ndarray) -> np.ndarray:
        return (X - self.mean) / self.scale


@dataclass
class HeteroLRGuestModel:
    """The guest's part: its weights, intercept, scaling and the training history.

    ``history`` holds one dict per epoch: ``epoch``, ``loss`` (Taylor loss + L2, weights
    before each step), ``seconds``, ``crypto_seconds`` (encryption, decryption and
    homomorphic products), ``bytes_sent``, ``bytes_received``.
    """

    weights: np.ndarray
    intercept: float
    scaling: _Scaling
    hosts: list[str]
    history: list[dict] = field(default_factory=list)
    converged: bool = False
    setup_seconds: float = 0.0

    @property
    def n_features(self) -> int:
        """Number of the guest's feature columns."""
        return int(self.weights.size)

    def to_dict(self) -> dict:
        """A JSON-ready mapping (lists and numbers)."""
        return {
            "format": _GUEST_FORMAT,
            "weights": self.weights.tolist(),
            "intercept": float(self.intercept),
            "scaling": self.scaling.to_dict(),
            "hosts": list(self.hosts),
            "history": [dict(item) for item in self.history],
            "converged": bool(self.converged),
            "setup_seconds": float(self.setup_seconds),
        }

    @classmethod
    def from_dict(cls, data: dict) -> HeteroLRGuestModel:
        """Inverse of :meth:`to_dict` (validates the format and the shapes)."""
        if not isinstance(data, dict) or data.get("format") != _GUEST_FORMAT:
            raise InvalidParameterError(f"format must be {_GUEST_FORMAT!r}")
        weights = _floats(data.get("weights"), "weights")
        hosts = data.get("hosts")
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
            raise InvalidParameterError("hosts must be a non-empty list of party names")
        return cls(
            weights=weights,
            intercept=float(_floats([data.get("intercept")], "intercept", 1)[0]),
            scaling=_Scaling.from_dict(data.get("scaling") or {}, weights.size),
            hosts=list(hosts),
            history=[dict(item) for item in data.get("history", [])],
            converged=bool(data.get("converged", False)),
            setup_seconds=float(data.get("setup_seconds", 0.0)),
        )


@dataclass
class HeteroLRHostModel:
    """A host's part: its weights, scaling and training history.

    Each history entry has the guest's fields; ``loss`` is None (hosts never learn it).
    """

    weights: np.ndarray
    scaling: _Scaling
    guest: str
    hosts: list[str]
    history: list[dict] = field(default_factory=list)
    setup_seconds: float = 0.0

    @property
    def n_features(self) -> int:
        """Number of this host's feature columns."""
        return int(self.weights.size)

    def to_dict(self) -> dict:
        """A JSON-ready mapping (lists and numbers)."""
        return {
            "format": _HOST_FORMAT,
            "weights": self.weights.tolist(),
            "scaling": self.scaling.to_dict(),
            "guest": self.guest,
            "hosts": list(self.hosts),
            "history": [dict(item) for item in self.history],
            "setup_seconds": float(self.setup_seconds),
        }

    @classmethod
    def from_dict(cls, data: dict) -> HeteroLRHostModel:
        """Inverse of :meth:`to_dict` (validates the format and the shapes)."""
        if not isinstance(data, dict) or data.get("format") != _HOST_FORMAT:
            raise InvalidParameterError(f"format must be {_HOST_FORMAT!r}")
        weights = _floats(data.get("weights"), "weights")
        if weights.size == 0:
            raise InvalidParameterError("weights must hold at least one value for a host")
        guest, hosts = data.get("guest"), data.get("hosts")
        if not isinstance(guest, str) or not guest:
            raise InvalidParameterError("guest must be a party name")
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
            raise InvalidParameterError("hosts must be a non-empty list of party names")
        return cls(
            weights=weights,
            scaling=_Scaling.from_dict(data.get("scaling") or {}, weights.size),
            guest=guest,
            hosts=list(hosts),
            history=[dict(item) for item in data.get("history", [])],
            setup_seconds=float(data.get("setup_seconds", 0.0)),
        )


class ReferenceResult(NamedTuple):
    """What :func:`train_plaintext_reference` returns.

    One weight vector per part (guest first), the guest's intercept and the epoch losses.
    """

    weights: list[np.ndarray]
    intercept: float
    loss: list[float]


# ------------------------------------------------------------------------------ inputs


def _check_features(X: Any, party: str, *, min_columns: int) -> np.ndarray:
    try:
        array = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"X of {party} must be a numeric array") from None
    if array.ndim != 2:
        raise InvalidParameterError(f"X of {party} must be a 2-D array (rows, columns), got shape {array.shape}")
    if array.shape[0] < 1:
        raise InvalidParameterError(f"X of {party} has no rows")
    if array.shape[1] < min_columns:
        raise InvalidParameterError(
            f"X of {party} has {array.shape[1]} columns: a host needs at least {min_columns} feature column"
        )
    finite = np.isfinite(array)
    if not finite.all():
        rows, columns = np.nonzero(~finite)
        raise InvalidParameterError(
            f"X of {party}: column {int(columns[0])} holds a non-finite value (NaN or inf) at row {int(rows[0])}"
        )
    return np.ascontiguousarray(array)


def _check_labels(y: Any, rows: int, party: str) -> np.ndarray:
    try:
        array = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"y of {party} must be a numeric array of 0/1 labels") from None
    if array.ndim != 1 or array.size != rows:
        raise InvalidParameterError(f"y of {party} must have shape ({rows},) to match X, got {array.shape}")
    bad = np.nonzero(~np.isfinite(array))[0]
    if bad.size:
        raise InvalidParameterError(f"y of {party}: row {int(bad[0])} holds a non-finite label (NaN or inf)")
    bad = np.nonzero((array != 0.0) & (array != 1.0))[0]
    if bad.size:
        raise InvalidParameterError(f"y of {party}: labels must be 0 or 1, got {array[bad[0]]!r} at row {int(bad[0])}")
    return array


def _check_batch_privacy(params: HeteroLRParams, rows: int, entries: int, party: str) -> None:
    smallest = min(params.batch_size, rows)
    if smallest <= entries:
        raise InvalidParameterError(
            f"batch_size: {party} learns {entries} gradient entries per batch, so batches of {smallest} rows "
            f"would let it solve for the other parties' per-row values; batches need more than {entries} rows "
            f"(batch_size = {params.batch_size}, rows = {rows})"
        )


def _check_party_names(guest: str, hosts: Any, session: Any) -> list[str]:
    if not isinstance(session, str) or not session:
        raise InvalidParameterError(f"session must be a non-empty string, got {session!r}")
    if isinstance(hosts, str) or not isinstance(hosts, Sequence) or not hosts:
        raise InvalidParameterError("hosts must be a non-empty list of party names")
    hosts = list(hosts)
    if not all(isinstance(h, str) and h for h in hosts):
        raise InvalidParameterError(f"hosts must be party names (non-empty strings), got {hosts!r}")
    if len(set(hosts)) != len(hosts):
        raise InvalidParameterError(f"hosts must be distinct, got {hosts!r}")
    if guest in hosts:
        raise InvalidParameterError(f"the guest {guest!r} cannot also be a host")
    return hosts


def _scaling_of(X: np.ndarray, feature_bits: int) -> _Scaling:
    mean = X.mean(axis=0) if X.shape[1] else np.zeros(0)
    scale = X.std(axis=0) if X.shape[1] else np.ones(0)
    scale = np.where(scale > 0.0, scale, 1.0)
    standard = (X - mean) / scale
    low = standard.min(axis=0) if X.shape[1] else np.zeros(0)
    high = standard.max(axis=0) if X.shape[1] else np.zeros(0)
    step = (high - low) / float((1 << feature_bits) - 1)
    step = np.where(step > 0.0, step, 1.0)
    return _Scaling(mean=mean, scale=scale, quant_min=low, quant_step=step, feature_bits=feature_bits)


def _quantize(standard: np.ndarray, scaling: _Scaling) -> np.ndarray:
    """Unsigned codes, transposed to (columns, rows) for the encrypted products."""
    codes = np.rint((standard - scaling.quant_min) / scaling.quant_step)
    np.clip(codes, 0, (1 << scaling.feature_bits) - 1, out=codes)
    return np.ascontiguousarray(codes.T.astype(np.uint64))


def _dequantize(codes: np.ndarray, scaling: _Scaling) -> np.ndarray:
    """(rows, columns) values ``min + step q`` that the encrypted products use."""
    return scaling.quant_min + scaling.quant_step * codes.T.astype(np.float64)


def _batches(rows: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed + epoch).permutation(rows)
    count = max(1, rows // batch_size)
    bounds = [i * batch_size for i in range(count)] + [rows]
    return [order[bounds[i] : bounds[i + 1]] for i in range(count)]


# ------------------------------------------------------------------------------ optimizer


class _Optimizer:
    """Mini-batch gradient descent with optional per-epoch decay, or Adam."""

    def __init__(self, params: HeteroLRParams, size: int) -> None:
        self.params = params
        self.m = np.zeros(size)
        self.v = np.zeros(size)
        self.t = 0

    def state(self) -> dict:
        """Adam's moments and step count (unused by sgd)."""
        return {"t": self.t, "m": self.m.copy(), "v": self.v.copy()}

    def load(self, state: dict) -> None:
        """The moments :meth:`state` returned."""
        if state:
            self.t = int(state["t"])
            self.m = np.asarray(state["m"], dtype=np.float64).reshape(self.m.shape)
            self.v = np.asarray(state["v"], dtype=np.float64).reshape(self.v.shape)

    def step(self, weights: np.ndarray, gradient: np.ndarray, epoch: int) -> np.ndarray:
        rate = self.params.learning_rate / (1.0 + self.params.decay * epoch)
        if self.params.optimizer == "sgd":
            return weights - rate * gradient
        self.t += 1
        self.m = _ADAM_BETA1 * self.m + (1.0 - _ADAM_BETA1) * gradient
        self.v = _ADAM_BETA2 * self.v + (1.0 - _ADAM_BETA2) * gradient * gradient
        m_hat = self.m / (1.0 - _ADAM_BETA1**self.t)
        v_hat = self.v / (1.0 - _ADAM_BETA2**self.t)
        return weights - rate * m_hat / (np.sqrt(v_hat) + _ADAM_EPS)


def _converged(losses: list[float], tol: float) -> bool:
    return tol > 0.0 and len(losses) >= 2 and abs(losses[-1] - losses[-2]) < tol
