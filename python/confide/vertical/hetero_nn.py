r"""Hetero NN for vertical FL: bottom models, a Paillier interactive layer, a top model.

A guest G holds the labels and some columns; hosts H_1..H_m hold other columns of the same,
already aligned rows (PSI first). The network (algorithms.md §5.3, FATE 1.x's design)::

    a_G = bottom_G(x_G)            a_h = bottom_h(x_h)        (each at its owner, in plaintext)
    z   = a_G W_G + sum_h a_h W_h + b                         (the interactive layer)
    out = top(g(z))                                           (at G; head: sigmoid, softmax or identity)

Who holds what
--------------
G holds its bottom model, ``W_G``, ``b``, the top model and the only Paillier key pair. The
host part ``W_h`` of the interactive layer is held by nobody: it exists as two additive
shares in the ring Z_(2^64) (fixed point, 2^-32), ``W_h = W'_h + E_h``, where G holds W'_h and
host h holds E_h. Each share alone is uniformly distributed, so neither side knows W_h (FATE's
"noisy copy W_A' plus accumulated noise", made exact: FATE's float noise is not uniform).

Initial shares: G draws A, host h draws B (each Glorot / sqrt 2, fixed point) and a uniform
E_h, sends ``B - E_h mod 2^64``; G sets ``W'_h = A + B - E_h``. So W_h = A + B: each party
knows its own half of the *initial* weights; everything learned afterwards is hidden from both.

One mini-batch of rows (the same batches everywhere; per host h)
-----------------------------------------------------------------
Fixed point: activations a_q = round(a 2^13), |a| <= 8 (clipped, counted); the cut-layer
gradient delta = dL_sum/dz (per example), delta_q = round(delta 2^16), |delta| <= 128 (clipped,
counted). All packing puts several signed integers in one Paillier plaintext, ``sum v_i 2^(w i)``
(decoded from the low end with centered digits), so every ciphertext carries many values.

1. Forward. G sends [[W'_h]] (its key; row k of W'_h packed in one ciphertext, repeated at P
   row positions). Host h computes, with the crypto core's multi-exponentiation kernel,
   ``[[sum_k e_bk W'_h[k]]]`` for every row b with ``e = a_q + 2^16`` (P rows per output
   ciphertext), adds a fresh encryption of ``(a_q E_h mod 2^64) + 2^64 rho`` (rho uniform, 40
   bits above the sum's high part) and returns it. G decrypts, subtracts ``2^16 sum_k W'_h[k]``
   and reduces mod 2^64: ``a_q (W'_h + E_h) = a_q W_h``, the host's contribution z_h. The high
   part (above 2^64), which could reveal more about a_q, is hidden by rho.
2. G runs the top model and back-propagates to ``delta`` (B x d_i). It sends every host
   ``[[delta_b]]`` (one ciphertext per row, the row's d_i values packed) and
   ``[[delta[:, j]]]`` (the batch dimension packed, s rows per ciphertext, per column j).
3. Host h computes ``[[a_q^T delta_q]]`` (d_h ciphertexts, the kernel over the B rows), adds
   uniform masks M (40 bits above the value), returns. G decrypts ``a_q^T delta_q + M`` (which
   says nothing about the gradient) and sets ``W'_h -= floor(c (G + M))``; host h sets
   ``E_h += floor(c M)`` (c = learning rate / rows in the batch, 2^-40 exact); the shares then
   sum to ``W_h - c grad`` (to 2^-32). Plain SGD: a moment would need the gradient in clear.
4. For the host's bottom gradient ``delta W_h^T = delta W'_h^T + delta E_h^T``: host h computes,
   per group of s rows, ``[[sum_j E_h[k, j] delta[:, j]]]`` (64-bit exponents), adds masks R
   (40 bits above) and returns; G decrypts, adds ``delta_q W'_h^T`` (mod 2^64) and sends the
   sum; host h removes R: ``delta_q W_h^T mod 2^64``, its bottom model's input gradient.

Per batch and host: 3 round trips; G decrypts ceil(B/P) + d_h + ceil(B/s) d_h ciphertexts and
encrypts B + ceil(B/s) d_i (+ d_h P) with its own (fast CRT) key; a host encrypts as many as it
returns (the masks and rho, under G's public key). 2048-bit keys, d_h = d_i = 8, B = 1024:
P = 2, s = 15.

What each side learns (and the known limit)
-------------------------------------------
- G: its own data and model; z_h = a_h W_h for every training row (the host's contribution
  to the interactive layer, as in FATE); never x_h, a_h, W_h, the host's bottom weights or the
  gradients of W_h (only values under uniform masks). Sizes: rows, d_h.
- Host h: its own data, bottom model and E_h; ``delta W_h^T`` for every training row — the
  gradient of its bottom model's output, which any split model must give it to train that
  model. Never labels, predictions, the loss, a_G, W_G or W_h. That gradient is known to leak
  labels: in binary tasks the norm and direction attacks of Li et al. (ICLR 2022, "Label
  Leakage and Protection in Two-party Split Learning") and the model-completion attacks of
  Fu et al. (USENIX Security 2022) recover most labels from it; the hidden W_h and the
  interactive layer make it harder but do not remove it. Mitigations (noise on the gradient,
  DP) belong to the differential-privacy work; do not rely on Hetero NN alone to keep labels
  secret from a host that attacks.
- Prediction runs step 1 only; G learns the scores, a host nothing.

The plaintext reference ``train_reference`` trains the same network centrally with the same
initial weights, batches and optimizers (Adam for bottom and top models, SGD for the
interactive layer); the secure run differs only by fixed-point rounding.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from confide import _native
from confide.crypto import gpu
from confide.crypto.ints import centered
from confide.errors import ConfideError, DataProblemError, InvalidParameterError, ProtocolError
from confide.ml.netspec import MAX_BATCH_SIZE
from confide.vertical.channel import Channel
from confide.vertical.netlayers import (
    ACTIVATIONS,
    Adam,
    DenseNetwork,
    NetSpec,
    activation_grad,
    build_network,
    forward_activation,
    glorot,
    network_from_dict,
    parse_network,
)
from confide.vertical.paillier_util import Meter as _Meter
from confide.vertical.paillier_util import elements as _elements
from confide.vertical.paillier_util import raw_plaintexts as _raw

__all__ = [
    "HeteroNNGuestModel",
    "HeteroNNHostModel",
    "HeteroNNParams",
    "predict_guest",
    "predict_host",
    "predict_reference",
    "train_guest",
    "train_host",
    "train_reference",
]

OBJECTIVES = ("binary:logistic", "multi:softprob", "reg:squarederror")
FA, A_BOUND = 13, 8.0  # activation fraction bits, clip bound
FD, D_BOUND = 16, 128.0  # cut-gradient fraction bits, clip bound
FW = 32  # interactive host weights: fraction bits in Z_(2^64)
SIGMA = 40  # statistical masking bits
C_SHIFT = 40  # the learning-rate multiplier c as an integer / 2^40
RING = 1 << 64
E_OFFSET = 1 << (FA + 3)  # a_q + E_OFFSET >= 0 for |a| <= 8
E_BITS = FA + 5  # exponent bits of a_q + E_OFFSET (<= 2^(FA + 4))
D_Q_BITS = FD + 7  # |delta_q| <= 2^23
PREDICT_BATCH = 4096


@dataclass(frozen=True)
class HeteroNNParams:
    """Hyper-parameters; every party must use the same ones (checked in the first message)."""

    objective: str = "binary:logistic"
    num_class: int | None = None
    epochs: int = 10
    batch_size: int = 256
    learning_rate: float = 0.01  # Adam, bottom and top models
    interactive_learning_rate: float = 0.1  # SGD, the interactive layer
    guest_bottom: Any = ({"units": 8, "activation": "tanh"},)
    host_bottom: Any = ({"units": 8, "activation": "tanh"},)
    interactive_units: int = 8
    interactive_activation: str = "relu"
    top: Any = ()
    key_bits: int = 2048
    seed: int = 0
    threads: int = 0
    guest_net: NetSpec = field(init=False, repr=False, compare=False)
    host_net: NetSpec = field(init=False, repr=False, compare=False)
    top_net: NetSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InvalidParameterError(f"objective {self.objective!r} is not one of {list(OBJECTIVES)}")
        if self.objective == "multi:softprob":
            if not isinstance(self.num_class, int) or not 3 <= self.num_class <= 1000:
                raise InvalidParameterError(
                    f"num_class must be an integer in 3..1000 for multi:softprob, got {self.num_class!r}"
                )
        elif self.num_class is not None:
            raise InvalidParameterError(f"num_class is for objective multi:softprob, not {self.objective}")
        _int("epochs", self.epochs, 1, 100_000)
        _int("batch_size", self.batch_size, 1, MAX_BATCH_SIZE)
        _int("interactive_units", self.interactive_units, 1, 64)
        _int("seed", self.seed, 0, 2**63 - 1)
        _int("threads", self.threads, 0, 1024)
        for name in ("learning_rate", "interactive_learning_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < float(value) <= 10.0:
                raise InvalidParameterError(f"{name} must be a number in (0, 10], got {value!r}")
        if self.key_bits not in (2048, 3072, 4096):
            raise InvalidParameterError(f"key_bits must be 2048, 3072 or 4096, got {self.key_bits!r}")
        if self.interactive_activation not in ACTIVATIONS:
            raise InvalidParameterError(
                f"interactive_activation {self.interactive_activation!r} is not one of {list(ACTIVATIONS)}"
            )
        object.__setattr__(self, "guest_net", parse_network(self.guest_bottom, "guest_bottom"))
        object.__setattr__(self, "host_net", parse_network(self.host_bottom, "host_bottom"))
        object.__setattr__(self, "top_net", parse_network(self.top, "top"))

    @property
    def outputs(self) -> int:
        """Width of the output layer (1, or num_class)."""
        return self.num_class if self.objective == "multi:softprob" else 1

    def host_dim(self, columns: int) -> int | None:
        """Width of a host's numpy bottom output for ``columns`` input columns.

        None for a framework bottom: the host builds it and says its width in its hello.
        """
        if self.host_net.kind != "dense":
            return None
        return self.host_net.layers[-1][0] if self.host_net.layers else columns

    def shared(self) -> dict:
        """What every party must agree on."""
        return {
            "objective": self.objective,
            "num_class": self.num_class or 0,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "interactive_units": self.interactive_units,
            "interactive_learning_rate": float(self.interactive_learning_rate),
            "host_layers": self.host_net.shared(),
            "key_bits": self.key_bits,
            "seed": self.seed,
        }


def _int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidParameterError(f"{name} must be an integer in {low}..{high}, got {value!r}")


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


def _pack(rows: list[list[int]], width: int) -> list[int]:
    """sum_i v_i 2^(width i) per row (signed v_i allowed)."""
    out = []
    for row in rows:
        acc = 0
        for v in reversed(row):
            acc = (acc << width) + v
        out.append(acc)
    return out


def _unpack_signed(value: int, width: int, slots: int, where: str) -> list[int]:
    mask, half, full = (1 << width) - 1, 1 << (width - 1), 1 << width
    out = []
    for _ in range(slots):
        low = value & mask
        if low >= half:
            low -= full
        out.append(low)
        value = (value - low) >> width
    if value != 0:
        raise ProtocolError(f"{where}: a packed value overflowed its slots (a peer did not follow the protocol)")
    return out


def _unpack_unsigned(value: int, width: int, slots: int, where: str) -> list[int]:
    if value < 0:
        raise ProtocolError(f"{where}: a packed value is negative (a peer did not follow the protocol)")
    mask = (1 << width) - 1
    out = []
    for _ in range(slots):
        out.append(value & mask)
        value >>= width
    if value:
        raise ProtocolError(f"{where}: a packed value overflowed its slots (a peer did not follow the protocol)")
    return out


def _decrypt(secret: _native.DecryptionKey, vector: _native.CiphertextVector, n: int, threads: int) -> list[int]:
    """Centered plaintexts (-n/2, n/2]."""
    return [centered(int.from_bytes(b, "big"), n) for b in gpu.decrypt_raw(secret, vector, threads)]


def _random_below(count: int, bits: int) -> list[int]:
    """``count`` uniform integers in [0, 2^bits) from the OS CSPRNG."""
    size = (bits + 7) // 8
    data = os.urandom(size * count)
    excess = size * 8 - bits
    return [int.from_bytes(data[i * size : (i + 1) * size], "little") >> excess for i in range(count)]


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
    if not isinstance(data, bytes):
        raise ProtocolError(f"{where}: expected ciphertext bytes, got {type(data).__name__}")
    try:
        vector = _native.CiphertextVector.from_bytes(data, key)
    except (ConfideError, ValueError) as error:
        raise ProtocolError(f"{where}: {error}") from None
    if len(vector) != length:
        raise ProtocolError(f"{where}: expected {length} ciphertexts, got {len(vector)}")
    return vector


def _generate_keypair(bits: int) -> _native.DecryptionKey:
    secret = _native.generate_keypair(bits)
    secret.precompute()
    return secret


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
    return encrypt(_raw(_pack(rows, layout.w_f), n), "fixed_base", threads)


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
    rho = _random_below(rows * layout.d_i, layout.rho_bits)
    addend = np.zeros((outputs * per, layout.d_i), dtype=object)
    addend[:rows] = low.astype(object) + (np.array(rho, dtype=object).reshape(rows, layout.d_i) << 64)
    packed = _pack(addend.reshape(outputs, per * layout.d_i).tolist(), layout.w_f)
    return products.add(gpu.encrypt_raw(key, _raw(packed, n), "fixed_base", threads), threads), clipped


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
    for v in _decrypt(secret, vector, n, threads):
        values += _unpack_unsigned(v, layout.w_f, per * layout.d_i, where)
    low = np.array([v % RING for v in values[: rows * layout.d_i]], dtype=np.uint64).reshape(rows, layout.d_i)
    offset = np.uint64(E_OFFSET) * share.sum(axis=0, dtype=np.uint64)
    return _from_ring(low - offset, FA + FW)


def _encode_delta(layout: _Layout, delta: np.ndarray, encrypt, n: int, threads: int):
    """[[delta_b]] per row and [[delta[:, j]]] per group of s rows; delta_q; clip count."""
    d_q, clipped = _quantize(delta, FD, D_BOUND)
    rows = d_q.shape[0]
    by_row = encrypt(_raw(_pack(d_q.tolist(), layout.w_g), n), "fixed_base", threads)
    s = layout.per_group
    groups = math.ceil(rows / s)
    padded = np.zeros((groups * s, layout.d_i), dtype=np.int64)
    padded[:rows] = d_q
    columns = padded.reshape(groups, s, layout.d_i).transpose(0, 2, 1).reshape(groups * layout.d_i, s)
    by_column = encrypt(_raw(_pack(columns.tolist(), layout.w_d), n), "fixed_base", threads)
    return by_row, by_column, d_q, clipped


def _host_gradient(layout: _Layout, by_row, a_q_e: np.ndarray, key, n: int, threads: int):
    """[[a_q^T delta_q + M]] (d_h ciphertexts of d_i slots) and the masks M."""
    rows = a_q_e.shape[0]
    matrix = np.vstack([a_q_e.T, np.ones((1, rows), dtype=np.uint64)])
    products = _elements(by_row.dot_u64(np.ascontiguousarray(matrix), E_BITS, threads))
    correction = _native.CiphertextVector.from_elements([products[-1]], key).mul_scalar_i64(
        np.array([-E_OFFSET], dtype=np.int64), threads
    )
    corr = _elements(correction)[0]
    masks = _random_below(layout.d_h * layout.d_i, layout.g_value + SIGMA)
    mask_rows = [masks[k * layout.d_i : (k + 1) * layout.d_i] for k in range(layout.d_h)]
    gradient = _native.CiphertextVector.from_elements(products[:-1], key).add(
        _native.CiphertextVector.from_elements([corr] * layout.d_h, key), threads
    )
    return gradient.add(
        gpu.encrypt_raw(key, _raw(_pack(mask_rows, layout.w_g), n), "fixed_base", threads), threads
    ), mask_rows


def _host_back(layout: _Layout, by_column, share: np.ndarray, rows: int, key, n: int, threads: int):
    """[[sum_j E[k, j] delta[:, j] + R]] per group and k; the masks R (rows x d_h ints)."""
    s = layout.per_group
    groups = math.ceil(rows / s)
    products = by_column.dot_groups_u64(np.ascontiguousarray(share), 64, threads)  # index g d_h + k
    masks = _random_below(groups * layout.d_h * s, layout.y_value + SIGMA)
    packed = _pack([masks[i * s : (i + 1) * s] for i in range(groups * layout.d_h)], layout.w_d)
    masked = products.add(gpu.encrypt_raw(key, _raw(packed, n), "fixed_base", threads), threads)
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
    for v in _decrypt(secret, vector, n, threads):
        slots += _unpack_signed(v, layout.w_d, s, where)
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


def train_guest(
    channel: Channel,
    hosts: list[str],
    X: np.ndarray,
    y: np.ndarray,
    params: HeteroNNParams,
    session: str,
    on_epoch: Callable[..., None] | None = None,
    resume: dict | None = None,
) -> HeteroNNGuestModel:
    """The guest's side of training (module docstring). Returns the guest's model part.

    ``on_epoch(entry, snapshot)``: after every epoch, with its record and a callable returning
    the guest's whole training state (for a checkpoint). ``resume``: such a state; training
    continues with the next epoch (every host must resume from the same epoch).
    """
    me = f"guest {channel.party!r}"
    start_epoch = int(resume["epoch"]) if resume else 0
    setup = time.perf_counter()
    meter = _Meter()
    own: Exception | None = None
    rows = columns = -1
    rng = np.random.default_rng([params.seed, 0])
    net = None
    try:
        X = _check_features(X, me)
        rows, columns = X.shape
        y = _check_labels(y, rows, params, me)
        # Built before the hello, so a network that cannot be built stops every party at once.
        net = _GuestNet(params, columns, 1 + len(hosts), rng)
    except InvalidParameterError as error:
        own = error
    key_bytes = b""
    secret = None
    if own is None:
        with meter:
            secret = _generate_keypair(params.key_bits)
        key_bytes = secret.encryption_key.to_bytes()
    extra = {"key": key_bytes, "hosts": list(hosts), "resume_epoch": start_epoch}
    channel.send(hosts, f"hnn/{session}/hello", _hello(own, rows, columns, params, extra))
    replies = {h: channel.recv(h, f"hnn/{session}/hello") for h in hosts}
    problems = [p for h in hosts if (p := _peer_problem(replies[h], h, rows, params, me, start_epoch)) is not None]
    _raise(own, problems)
    if secret is None or net is None:
        raise ProtocolError(f"{me}: no key pair or network was made")
    key = secret.encryption_key
    n = int.from_bytes(key.n_bytes(), "big")
    threads = params.threads
    scaling = _Scaling.fit(X)
    d_hs = {h: _bottom_dim(replies[h], h, params, me) for h in hosts}
    net.bottom.standardize_inputs(scaling.mean, scaling.std)
    layouts = {h: _Layout(params, d_hs[h], n) for h in hosts}
    shares: dict[str, np.ndarray] = {}
    for h in hosts:
        half = _to_ring(_interactive_half(rng, d_hs[h], params.interactive_units, 1 + len(hosts)), FW)
        if resume is None:
            theirs = _ring_array(replies[h].get("init"), (d_hs[h], params.interactive_units), f"{me}: init from {h}")
            shares[h] = half + theirs
    model = HeteroNNGuestModel(params, list(hosts), scaling, net, shares, setup_seconds=time.perf_counter() - setup)
    if resume is not None:
        model = _resumed_guest(resume, hosts, d_hs, params, me)
        net, shares, scaling = model.net, model.shares, model.scaling

    def snapshot(epoch_done: int) -> Callable[[], dict]:
        return lambda: {"epoch": epoch_done, "model": model.to_dict(), "adam": _adam_state(net.adam)}

    for epoch in range(start_epoch, params.epochs):
        clock = _EpochClock(epoch, channel, meter)
        losses, weights = [], []
        clipped = {"delta": 0}
        for index, rows_b in enumerate(_batches(rows, params.batch_size, params.seed, epoch)):
            tag = f"hnn/{session}/{epoch}/{index}"
            count = len(rows_b)
            for h in hosts:
                with meter:
                    enc = _encrypt_shares(layouts[h], shares[h], partial(gpu.encrypt_raw, secret), n, threads)
                channel.send(h, tag + "/w", {"w": enc.to_bytes()})
            z_hosts = np.zeros((count, params.interactive_units))
            for h in hosts:
                message = channel.recv(h, tag + "/z")
                lay = layouts[h]
                vector = _vector(message.get("z"), key, math.ceil(count / lay.per_forward), f"{me}: forward from {h}")
                with meter:
                    z_hosts += _guest_forward_open(
                        lay, secret, vector, shares[h], count, n, threads, f"{me}: forward from {h}"
                    )
            out = net.forward(X[rows_b], z_hosts)
            loss, grad = _head(params.objective, out, y[rows_b])
            losses.append(loss)
            weights.append(count)
            delta = net.backward(grad, count)
            lay0 = layouts[hosts[0]]
            with meter:
                by_row, by_column, d_q, n_clip = _encode_delta(
                    lay0, delta, partial(gpu.encrypt_raw, secret), n, threads
                )
            clipped["delta"] += n_clip
            channel.send(hosts, tag + "/delta", {"row": by_row.to_bytes(), "column": by_column.to_bytes()})
            c = _lr_multiplier(params, count)
            for h in hosts:
                lay = layouts[h]
                message = channel.recv(h, tag + "/grad")
                where = f"{me}: gradient from {h}"
                grad_v = _vector(message.get("grad"), key, lay.d_h, where)
                back_v = _vector(message.get("back"), key, math.ceil(count / lay.per_group) * lay.d_h, where)
                with meter:
                    masked = []
                    for v in _decrypt(secret, grad_v, n, threads):
                        masked += _unpack_signed(v, lay.w_g, lay.d_i, where)
                    u = _guest_back_open(lay, secret, back_v, d_q, shares[h], n, threads, where)
                channel.send(h, tag + "/u", {"u": u})
                shares[h] = shares[h] - _scaled_floor(masked, c).reshape(lay.d_h, lay.d_i)
        model.shares = shares
        loss = float(np.average(losses, weights=weights))
        clock.close(model.history, on_epoch, snapshot(epoch + 1), loss=loss, clipped=clipped)
    return model


class _EpochClock:
    """One epoch's record: seconds, crypto seconds and bytes since the epoch began."""

    def __init__(self, epoch: int, channel: Channel, meter: _Meter) -> None:
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


def train_host(
    channel: Channel,
    guest: str,
    X: np.ndarray,
    params: HeteroNNParams,
    session: str,
    on_epoch: Callable[..., None] | None = None,
    resume: dict | None = None,
) -> HeteroNNHostModel:
    """Host h's side of training. Returns the host's model part (``on_epoch``, ``resume``: as the guest's)."""
    me = f"host {channel.party!r}"
    start_epoch = int(resume["epoch"]) if resume else 0
    meter = _Meter()
    hello = channel.recv(guest, f"hnn/{session}/hello")
    own: Exception | None = None
    rows = columns = -1
    try:
        X = _check_features(X, me)
        rows, columns = X.shape
        if columns < 1:
            raise DataProblemError(f"{me}: holds no columns; a host must bring at least one feature")
    except InvalidParameterError as error:
        own = error
    problem = None if own is not None else _peer_problem(hello, guest, rows, params, me, start_epoch)
    hosts = hello.get("hosts") if isinstance(hello.get("hosts"), list) else []
    if own is None and problem is None and channel.party not in hosts:
        problem = ProtocolError(f"{me}: not in the guest's host list {hosts}")
    init = np.zeros((0, 0), dtype=np.uint64)
    share = np.zeros((0, 0), dtype=np.uint64)
    reply_extra: dict = {}
    bottom = None
    if own is None and problem is None:
        try:
            key = _public_key(hello.get("key"), guest, me)
            n = int.from_bytes(key.n_bytes(), "big")
            d_h = params.host_dim(columns)
            if d_h is None:  # a framework bottom: build it now to learn its width
                bottom = _host_bottom(params, columns, None, hosts.index(channel.party), me)
                d_h = bottom.output_dim
            layout = _Layout(params, d_h, n)
        except ConfideError as error:
            problem = error
    if own is None and problem is None:
        rng = _host_rng(params, hosts.index(channel.party))
        half = _interactive_half(rng, d_h, params.interactive_units, 1 + len(hosts))
        share = _ring_random((d_h, params.interactive_units))
        init = _to_ring(half, FW) - share
        reply_extra = {"resume_epoch": start_epoch, "bottom_dim": d_h, **({"init": init} if resume is None else {})}
    channel.send(guest, f"hnn/{session}/hello", _hello(own or problem, rows, columns, params, reply_extra))
    _raise(own, [problem] if problem else [])
    threads = params.threads
    scaling = _Scaling.fit(X)
    if bottom is None:
        bottom = _host_bottom(params, columns, rng, hosts.index(channel.party), me)
    bottom.standardize_inputs(scaling.mean, scaling.std)
    adam = Adam(params.learning_rate)
    model = HeteroNNHostModel(params, scaling, bottom, share)
    if resume is not None:
        model = HeteroNNHostModel.from_dict(resume["model"])
        bottom, share, scaling = model.bottom, model.share, model.scaling
        adam = _adam_from(resume.get("adam"), params.learning_rate)
        if share.shape != (d_h, params.interactive_units) or bottom.input_dim != columns:
            raise ProtocolError(
                f"{me}: the checkpoint does not fit this data ({bottom.input_dim} columns, {columns} now)"
            )

    def snapshot(epoch_done: int) -> Callable[[], dict]:
        return lambda: {"epoch": epoch_done, "model": model.to_dict(), "adam": _adam_state(adam)}

    for epoch in range(start_epoch, params.epochs):
        clock = _EpochClock(epoch, channel, meter)
        clipped = {"activation": 0}
        for index_b, rows_b in enumerate(_batches(rows, params.batch_size, params.seed, epoch)):
            tag = f"hnn/{session}/{epoch}/{index_b}"
            count = len(rows_b)
            where = f"{me}: batch {index_b} of epoch {epoch + 1}"
            a = bottom.forward(X[rows_b])
            message = channel.recv(guest, tag + "/w")
            bases = _vector(message.get("w"), key, layout.per_forward * layout.d_h, where)
            with meter:
                z, n_clip = _host_forward(layout, bases, a, share, key, n, threads)
            clipped["activation"] += n_clip
            channel.send(guest, tag + "/z", {"z": z.to_bytes()})
            message = channel.recv(guest, tag + "/delta")
            by_row = _vector(message.get("row"), key, count, where)
            by_column = _vector(message.get("column"), key, math.ceil(count / layout.per_group) * layout.d_i, where)
            a_q, _ = _quantize(a, FA, A_BOUND)
            with meter:
                gradient, grad_masks = _host_gradient(
                    layout, by_row, (a_q + E_OFFSET).astype(np.uint64), key, n, threads
                )
                back, back_masks = _host_back(layout, by_column, share, count, key, n, threads)
            channel.send(guest, tag + "/grad", {"grad": gradient.to_bytes(), "back": back.to_bytes()})
            message = channel.recv(guest, tag + "/u")
            u = _ring_array(message.get("u"), (count, layout.d_h), where)
            r = np.array([v % RING for v in back_masks.reshape(-1)], dtype=np.uint64).reshape(count, layout.d_h)
            grad_a = _from_ring(u - r, FD + FW)
            grad_a = np.where(np.abs(a) <= A_BOUND, grad_a, 0.0)  # clipped activations pass no gradient
            grads, _ = bottom.backward(grad_a, input_grad=False)
            if grads:
                adam.step(bottom.params(), [g / count for g in grads])
            c = _lr_multiplier(params, count)
            flat = [v for row in grad_masks for v in row]
            share = share + _scaled_floor(flat, c).reshape(layout.d_h, layout.d_i)
        model.share = share
        clock.close(model.history, on_epoch, snapshot(epoch + 1), clipped=clipped)
    model.share = share
    return model


def _public_key(data: Any, sender: str, me: str) -> _native.EncryptionKey:
    if not isinstance(data, bytes) or not data:
        raise ProtocolError(f"{me}: {sender} sent no public key")
    try:
        return _native.EncryptionKey.from_bytes(data)
    except (ConfideError, ValueError) as error:
        raise ProtocolError(f"{me}: {sender}'s public key is invalid: {error}") from None


# ----------------------------------------------------------------------------- prediction


def predict_guest(
    channel: Channel, hosts: list[str], X: np.ndarray, model: HeteroNNGuestModel, session: str
) -> np.ndarray:
    """Scores for the rows of ``X`` (aligned with every host's rows): probabilities or values."""
    me = f"guest {channel.party!r}"
    params = model.params
    X = _check_features(X, me)
    rows = X.shape[0]
    secret = _generate_keypair(params.key_bits)
    key = secret.encryption_key
    n = int.from_bytes(key.n_bytes(), "big")
    channel.send(hosts, f"hnnp/{session}/hello", {"rows": rows, "key": key.to_bytes()})
    replies = {h: channel.recv(h, f"hnnp/{session}/hello") for h in hosts}
    for h in hosts:
        if replies[h].get("error"):
            raise ProtocolError(f"{me}: {h} cannot predict: {replies[h]['error']}")
        if replies[h].get("rows") != rows:
            raise DataProblemError(f"{me}: {h} has {replies[h].get('rows')} rows to score, {me} has {rows}")
    layouts = {h: _Layout(params, model.shares[h].shape[0], n) for h in hosts}
    outputs = []
    for start in range(0, rows, PREDICT_BATCH):
        part = slice(start, min(rows, start + PREDICT_BATCH))
        count = part.stop - part.start
        tag = f"hnnp/{session}/{start}"
        for h in hosts:
            enc = _encrypt_shares(layouts[h], model.shares[h], partial(gpu.encrypt_raw, secret), n, params.threads)
            channel.send(h, tag + "/w", {"w": enc.to_bytes()})
        z_hosts = np.zeros((count, params.interactive_units))
        for h in hosts:
            lay = layouts[h]
            vector = _vector(
                channel.recv(h, tag + "/z").get("z"), key, math.ceil(count / lay.per_forward), f"{me}: {h}"
            )
            z_hosts += _guest_forward_open(lay, secret, vector, model.shares[h], count, n, params.threads, f"{me}: {h}")
        outputs.append(model.net.forward(X[part], z_hosts, keep=False))
    return _predictions(params.objective, np.vstack(outputs))


def predict_host(channel: Channel, guest: str, X: np.ndarray, model: HeteroNNHostModel, session: str) -> None:
    """Host h's side of prediction (one forward pass over its rows)."""
    me = f"host {channel.party!r}"
    hello = channel.recv(guest, f"hnnp/{session}/hello")
    error = None
    rows = -1
    try:
        X = _check_features(X, me)
        rows = X.shape[0]
        if X.shape[1] != model.bottom.input_dim:
            raise DataProblemError(f"{me}: model was trained on {model.bottom.input_dim} columns, got {X.shape[1]}")
    except InvalidParameterError as exc:
        error = exc
    channel.send(guest, f"hnnp/{session}/hello", {"rows": rows, "error": None if error is None else str(error)})
    if error is not None:
        raise error
    if hello.get("rows") != rows:
        raise DataProblemError(f"{me}: {guest} has {hello.get('rows')} rows to score, {me} has {rows}")
    key = _public_key(hello.get("key"), guest, me)
    n = int.from_bytes(key.n_bytes(), "big")
    params = model.params
    layout = _Layout(params, model.share.shape[0], n)
    for start in range(0, rows, PREDICT_BATCH):
        part = slice(start, min(rows, start + PREDICT_BATCH))
        tag = f"hnnp/{session}/{start}"
        bases = _vector(channel.recv(guest, tag + "/w").get("w"), key, layout.per_forward * layout.d_h, me)
        z, _ = _host_forward(
            layout,
            bases,
            model.bottom.forward(X[part], keep=False),
            model.share,
            key,
            n,
            params.threads,
        )
        channel.send(guest, tag + "/z", {"z": z.to_bytes()})


# ----------------------------------------------------------------------------- plaintext reference


@dataclass
class ReferenceModel:
    params: HeteroNNParams
    guest: str
    hosts: list[str]
    scalings: dict[str, _Scaling]
    net: _GuestNet
    bottoms: dict[str, DenseNetwork]
    weights: dict[str, np.ndarray]
    history: list[dict] = field(default_factory=list)


def train_reference(parts: dict[str, np.ndarray], y: np.ndarray, params: HeteroNNParams, guest: str) -> ReferenceModel:
    """The same network, initial weights, batches and optimizers, trained centrally in float."""
    hosts = [p for p in parts if p != guest]
    X = {p: _check_features(parts[p], p) for p in parts}
    rows = X[guest].shape[0]
    y = _check_labels(y, rows, params, guest)
    scalings = {p: _Scaling.fit(X[p]) for p in parts}
    # Framework bottoms are built first (their width is known once built); numpy ones below, in
    # the order of the secure run's draws.
    early = {
        h: _host_bottom(params, X[h].shape[1], None, i, f"host {h!r}")
        for i, h in enumerate(hosts)
        if params.host_dim(X[h].shape[1]) is None
    }
    d_hs = {h: early[h].output_dim if h in early else params.host_dim(X[h].shape[1]) for h in hosts}
    parts_count = 1 + len(hosts)
    rng = np.random.default_rng([params.seed, 0])
    net = _GuestNet(params, X[guest].shape[1], parts_count, rng)
    net.bottom.standardize_inputs(scalings[guest].mean, scalings[guest].std)
    guest_halves = {h: _interactive_half(rng, d_hs[h], params.interactive_units, parts_count) for h in hosts}
    bottoms, weights, adams = {}, {}, {}
    for i, h in enumerate(hosts):
        host_rng = _host_rng(params, i)
        weights[h] = guest_halves[h] + _interactive_half(host_rng, d_hs[h], params.interactive_units, parts_count)
        bottoms[h] = early[h] if h in early else _host_bottom(params, X[h].shape[1], host_rng, i, f"host {h!r}")
        bottoms[h].standardize_inputs(scalings[h].mean, scalings[h].std)
        adams[h] = Adam(params.learning_rate)
    model = ReferenceModel(params, guest, hosts, scalings, net, bottoms, weights)
    for epoch in range(params.epochs):
        losses, counts = [], []
        for rows_b in _batches(rows, params.batch_size, params.seed, epoch):
            count = len(rows_b)
            alphas = {h: bottoms[h].forward(X[h][rows_b]) for h in hosts}
            z_hosts = sum((alphas[h] @ weights[h] for h in hosts), np.zeros((count, params.interactive_units)))
            out = net.forward(X[guest][rows_b], z_hosts)
            loss, grad = _head(params.objective, out, y[rows_b])
            losses.append(loss)
            counts.append(count)
            delta = net.backward(grad, count)
            for h in hosts:
                grad_a = delta @ weights[h].T
                weights[h] = weights[h] - params.interactive_learning_rate / count * (alphas[h].T @ delta)
                grads, _ = bottoms[h].backward(grad_a, input_grad=False)
                if grads:
                    adams[h].step(bottoms[h].params(), [g / count for g in grads])
        model.history.append({"epoch": epoch + 1, "loss": float(np.average(losses, weights=counts))})
    return model


def predict_reference(model: ReferenceModel, parts: dict[str, np.ndarray]) -> np.ndarray:
    """Scores of the centrally trained reference for every party's rows."""
    X = {p: np.asarray(parts[p]) for p in parts}
    rows = X[model.guest].shape[0]
    z_hosts = np.zeros((rows, model.params.interactive_units))
    for h in model.hosts:
        z_hosts += model.bottoms[h].forward(X[h], keep=False) @ model.weights[h]
    return _predictions(model.params.objective, model.net.forward(X[model.guest], z_hosts, keep=False))
