"""Hetero NN's input checks, heads, the guest's network and the two parties' models."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from confide.errors import DataProblemError
from confide.vertical.hetero_nn.params import HeteroNNParams
from confide.vertical.netlayers import (
    Adam,
    activation_grad,
    build_network,
    forward_activation,
    glorot,
    network_from_dict,
)

# ----------------------------------------------------------------------------- data checks


def _check_features(X: Any, party: str) -> np.ndarray:
    try:
        X = np.asarray(X)
        X = X if X.dtype in (np.float32, np.float64) else X.astype(np.float64)
    except (TypeError, ValueError) as error:
        raise DataProblemError(f"{party}: features must be numeric: {error}") from None
    if X.ndim != 2 or X.shape[0] < 1:
        raise DataProblemError(f"{party}: features must be a 2-D array with rows, got shape {X.shape}")
    if not np.isfinite(X.sum(axis=0)).all():
        row, column = (int(v) for v in np.argwhere(~np.isfinite(X))[0])
        raise DataProblemError(
            f"{party}: column {column} has a NaN or infinite value (row {row}); hetero_nn needs complete numeric "
            f"columns: impute or drop them (FL_Data's missing/encode steps)"
        )
    return X


def _check_labels(y: Any, rows: int, params: HeteroNNParams, party: str) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if y.shape[0] != rows:
        raise DataProblemError(f"{party}: {y.shape[0]} labels for {rows} rows")
    if not np.all(np.isfinite(y)):
        raise DataProblemError(f"{party}: labels contain NaN or infinite values")
    if params.objective == "binary:logistic" and not np.all(np.isin(y, (0.0, 1.0))):
        raise DataProblemError(f"{party}: binary:logistic needs 0/1 labels, got {sorted(set(np.unique(y)))[:6]}")
    if params.objective == "multi:softprob":
        k = params.num_class
        if not np.all((y == np.rint(y)) & (y >= 0) & (y < k)):
            raise DataProblemError(
                f"{party}: multi:softprob with num_class {k} needs labels 0..{k - 1}, got {np.unique(y)[:12]}"
            )
    return y


@dataclass
class _Scaling:
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, X: np.ndarray) -> _Scaling:
        mean = X.mean(axis=0, dtype=np.float64)
        std = _std(X, mean)
        return cls(mean, np.where(std > 0, std, 1.0))


def _std(X: np.ndarray, mean: np.ndarray, chunk: int = 8192) -> np.ndarray:
    total = np.zeros_like(mean)
    for start in range(0, X.shape[0], chunk):
        part = np.asarray(X[start : start + chunk], dtype=np.float64) - mean
        total += np.einsum("ij,ij->j", part, part)
    return np.sqrt(total / X.shape[0])


# ----------------------------------------------------------------------------- heads


def _head(objective: str, out: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean loss and d(sum loss)/d(out) per row."""
    if objective == "binary:logistic":
        logits = out[:, 0]
        p = 1.0 / (1.0 + np.exp(-logits))
        eps = 1e-12
        loss = -np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))
        return float(loss), (p - y)[:, None]
    if objective == "multi:softprob":
        shifted = out - out.max(axis=1, keepdims=True)
        p = np.exp(shifted)
        p /= p.sum(axis=1, keepdims=True)
        idx = y.astype(np.int64)
        loss = -np.mean(np.log(p[np.arange(len(idx)), idx] + 1e-12))
        grad = p.copy()
        grad[np.arange(len(idx)), idx] -= 1.0
        return float(loss), grad
    diff = out[:, 0] - y
    return float(np.mean(diff * diff) / 2.0), diff[:, None]


def _predictions(objective: str, out: np.ndarray) -> np.ndarray:
    if objective == "binary:logistic":
        return 1.0 / (1.0 + np.exp(-out[:, 0]))
    if objective == "multi:softprob":
        shifted = out - out.max(axis=1, keepdims=True)
        p = np.exp(shifted)
        return p / p.sum(axis=1, keepdims=True)
    return out[:, 0].copy()


def _batches(rows: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng([seed, 7, epoch]).permutation(rows)
    return [np.sort(b) for b in np.array_split(order, max(1, math.ceil(rows / batch_size)))]


# ----------------------------------------------------------------------------- the guest's model


class _GuestNet:
    """The guest's plaintext part: bottom, W_G and b, activation, top + output layer."""

    def __init__(self, params: HeteroNNParams, columns: int, parts: int, rng: np.random.Generator) -> None:
        self.params = params
        self.bottom = build_network(params.guest_net, columns, rng, seed=_seed(params, 0, 1), who="guest_bottom")
        d_i = params.interactive_units
        self.w = glorot(rng, self.bottom.output_dim, d_i) / math.sqrt(parts)
        self.b = np.zeros(d_i)
        self.top = build_network(params.top_net, d_i, rng, seed=_seed(params, 0, 2), outputs=params.outputs, who="top")
        self.adam = Adam(params.learning_rate)

    def forward(self, x: np.ndarray, z_hosts: np.ndarray, keep: bool = True) -> np.ndarray:
        a = self.bottom.forward(x, keep)
        z = a @ self.w + self.b + z_hosts
        g = forward_activation(self.params.interactive_activation, z)
        if keep:
            self._a, self._z, self._g = a, z, g
        return self.top.forward(g, keep)

    def backward(self, grad_out: np.ndarray, rows: int) -> np.ndarray:
        """Steps every guest parameter on the mean loss; returns delta = d(sum loss)/dz."""
        top_grads, grad_g = self.top.backward(grad_out)
        delta = activation_grad(self.params.interactive_activation, self._z, self._g, grad_g)
        bottom_grads, _ = self.bottom.backward(delta @ self.w.T, input_grad=False)
        lr_i = self.params.interactive_learning_rate
        self.w -= lr_i / rows * (self._a.T @ delta)
        self.b -= lr_i / rows * delta.sum(axis=0)
        params = [*self.bottom.params(), *self.top.params()]
        grads = [g / rows for g in (*bottom_grads, *top_grads)]
        if params:
            self.adam.step(params, grads)
        return delta

    def to_dict(self) -> dict:
        """The part as a wire-encodable mapping (``<party>.model.cvw``)."""
        return {"bottom": self.bottom.to_dict(), "w": self.w.copy(), "b": self.b.copy(), "top": self.top.to_dict()}

    def load(self, data: dict) -> None:
        self.bottom = network_from_dict(data["bottom"])
        self.w = np.asarray(data["w"], dtype=np.float64)
        self.b = np.asarray(data["b"], dtype=np.float64)
        self.top = network_from_dict(data["top"])


def _interactive_half(rng: np.random.Generator, d_part: int, d_i: int, parts: int) -> np.ndarray:
    """Half of a host part's initial weights (the guest's A or the host's B): Glorot / sqrt(2 parts)."""
    return glorot(rng, d_part, d_i) / math.sqrt(2.0 * parts)


def _host_rng(params: HeteroNNParams, host_index: int) -> np.random.Generator:
    return np.random.default_rng([params.seed, 1 + host_index])


def _seed(params: HeteroNNParams, party: int, net: int) -> int:
    """The initialisation seed of a framework sub-network (party 0: the guest, 1 + i: host i)."""
    return int(np.random.default_rng([params.seed, party, 0x6E6574, net]).integers(2**31))


def _host_bottom(params: HeteroNNParams, columns: int, rng: np.random.Generator, host_index: int, me: str):
    return build_network(params.host_net, columns, rng, seed=_seed(params, 1 + host_index, 1), who=f"{me}: host_bottom")


@dataclass
class HeteroNNGuestModel:
    """The guest's part: its scaling, plaintext network and its shares W'_h of every host part."""

    params: HeteroNNParams
    hosts: list[str]
    scaling: _Scaling
    net: _GuestNet
    shares: dict[str, np.ndarray]  # host -> W'_h (uint64, d_h x d_i)
    history: list[dict] = field(default_factory=list)
    setup_seconds: float = 0.0

    def to_dict(self) -> dict:
        """The part as a wire-encodable mapping (``<party>.model.cvw``)."""
        return {
            "kind": "hetero_nn_guest",
            "params": _params_dict(self.params),
            "hosts": list(self.hosts),
            "mean": self.scaling.mean,
            "std": self.scaling.std,
            "net": self.net.to_dict(),
            "shares": {h: s.copy() for h, s in self.shares.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> HeteroNNGuestModel:
        """The guest's part from :meth:`to_dict`'s mapping."""
        params = _params_from(data["params"])
        scaling = _Scaling(np.asarray(data["mean"]), np.asarray(data["std"]))
        net = _GuestNet.__new__(_GuestNet)
        net.params = params
        net.load(data["net"])
        shares = {h: np.asarray(s, dtype=np.uint64) for h, s in data["shares"].items()}
        return cls(params, list(data["hosts"]), scaling, net, shares)


@dataclass
class HeteroNNHostModel:
    """A host's part: its scaling, bottom model and its share E_h of its interactive weights."""

    params: HeteroNNParams
    scaling: _Scaling
    bottom: Any  # DenseNetwork or a framework network (nettorch)
    share: np.ndarray  # E_h (uint64, d_h x d_i)
    history: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The part as a wire-encodable mapping (``<party>.model.cvw``)."""
        return {
            "kind": "hetero_nn_host",
            "params": _params_dict(self.params),
            "mean": self.scaling.mean,
            "std": self.scaling.std,
            "bottom": self.bottom.to_dict(),
            "share": self.share.copy(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> HeteroNNHostModel:
        """A host's part from :meth:`to_dict`'s mapping."""
        return cls(
            _params_from(data["params"]),
            _Scaling(np.asarray(data["mean"]), np.asarray(data["std"])),
            network_from_dict(data["bottom"]),
            np.asarray(data["share"], dtype=np.uint64),
        )


_PARAM_FIELDS = (
    "objective", "num_class", "epochs", "batch_size", "learning_rate", "interactive_learning_rate",
    "guest_bottom", "host_bottom", "interactive_units", "interactive_activation", "top", "key_bits", "seed",
)  # fmt: skip


def _params_dict(params: HeteroNNParams) -> dict:
    out = {name: getattr(params, name) for name in _PARAM_FIELDS}
    for name in ("guest_bottom", "host_bottom", "top"):
        value = out[name]
        out[name] = dict(value) if isinstance(value, dict) else [dict(layer) for layer in value]
    out["num_class"] = out["num_class"] or 0
    return out


def _params_from(data: dict) -> HeteroNNParams:
    values = {name: data[name] for name in _PARAM_FIELDS if name in data}
    values["num_class"] = int(values.get("num_class") or 0) or None
    for name in ("guest_bottom", "host_bottom", "top"):
        value = values.get(name) or ()
        values[name] = dict(value) if isinstance(value, dict) else tuple(value)
    for name in ("epochs", "batch_size", "interactive_units", "key_bits", "seed"):
        values[name] = int(values[name])
    return HeteroNNParams(**values)
