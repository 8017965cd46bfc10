r"""Hetero logistic regression for vertical FL: Paillier-protected, two keys, no arbiter.

A guest G holds the labels and some columns; hosts H_1..H_m hold other columns of the same,
already aligned rows (PSI first). Every party keeps its own weights and runs its own
optimizer; nobody sees another party's features, weights, labels or gradient.

Model and loss (algorithms.md §5.1)
-----------------------------------
Score ``z = X_G w_G + b + sum_j X_j w_j``, labels ``y in {-1, +1}`` (inputs are 0/1). The
logistic loss is replaced by its second-order Taylor expansion at z = 0::

    L ~ log 2 - 1/(2N) sum_i y_i z_i + 1/(8N) sum_i z_i^2  (+ l2/2 ||w||^2 of every party)
    d_i = z_i/4 - y_i/2                      (fore-gradient; d = d_G + sum_j u_j)
    grad_party = 1/N X_party^T d + l2 w_party      intercept: 1/N sum_i d_i

with ``d_G = (X_G w_G + b)/4 - y/2`` at the guest and ``u_j = X_j w_j / 4`` at host j.

Keys
----
G draws a key pair K_G; the first host in ``hosts`` (the *key host* H_1) draws K_H. Both
public keys are published in the first message. Encryption by a key's owner uses the
faster CRT path.

One mini-batch B (N rows; the same batches everywhere)
-------------------------------------------------------
The row order of epoch e is ``numpy.random.default_rng(seed + e).permutation(rows)``, cut into
``rows // batch_size`` batches (at least one); the remainder joins the last batch, so no batch
is smaller than ``min(batch_size, rows)``.

1. Host k sends ``[[u_k]]_{K_H}`` to G and, with several hosts, ``[[u_k]]_{K_G}`` to every
   other host (host to host; G never receives a ciphertext under its own key from which it
   could read u_k).
2. G sends ``[[d_G]]_{K_G}`` to every host.
3. Host j: ``[[d]] = [[d_G]] + u_j + sum_{k != j} [[u_k]]`` and
   ``[[X_j^T d]]``; adds a fresh encryption of a random mask R_j and sends
   ``[[X_j^T d + R_j]]_{K_G}`` to G; G decrypts and returns the masked values; the host
   removes R_j, divides by N, adds ``l2 w_j`` and steps.
4. G: ``[[d]] = d_G + sum_k [[u_k]]_{K_H}``, ``[[X_G^T d]]`` and ``[[sum_i d_i]]``, masked
   with R_G and sent to H_1 with the masked loss part (below); H_1 decrypts and returns;
   G unmasks, adds ``l2 w_G`` and steps.
5. Loss, with ``z_H = sum_k z_k = 4 sum_k u_k``: G computes its plaintext part
   ``log 2 - 1/(2N) sum y z_G + 1/(8N) sum z_G^2 + l2/2 ||w_G||^2`` and, under K_H,
   ``1/N sum_i (z_G(i) - 2 y_i) u(i)`` (the ``y z_H`` and ``2 z_G z_H`` terms), masked. The
   remaining term ``1/(8N) sum z_H^2 = 1/(8N) sum_k sum z_k^2 + 1/N sum_{j<k} sum z_j u_k``
   (plus the hosts' ``l2/2 ||w_j||^2``) is built by the hosts: host j puts its plaintext
   ``sum z_j^2 / 8`` and, from the ``[[u_k]]_{K_G}`` it already holds, the encrypted cross
   terms with every later host k > j into one ciphertext ``[[a_j]]_{K_G}``. Hosts j >= 2 send it
   to H_1; H_1 decrypts G's masked part ``V = L_G + R_L`` (an exact integer: R_L lies in
   ``[2^(k-3), 2^(k-2))`` so nothing wraps), encrypts ``V + a_1`` under K_G, adds every ``[[a_j]]`` and sends
   the single ciphertext to G, which decrypts and removes R_L. So G learns exactly the batch
   loss and no host learns it; with one host this is FATE's loss, and unlike FATE it also
   works for several hosts. G logs the epoch loss (row-weighted mean of the batch losses,
   computed with the weights before each step) and stops when it changes by less than
   ``tol`` or after ``epochs`` epochs; a control message tells the hosts.

Fixed point and features
------------------------
``d_G`` and ``u_j`` travel as signed integers ``round(v 2^F)`` (F = ``fixed_point_bits``) in
Z_n. Every party standardizes its columns locally (mean 0, std 1, training statistics) and
quantizes them for the encrypted products only, as unsigned integers
``q = round((x - min_j) / step_j)`` with ``feature_bits`` bits (``step_j = (max_j - min_j) /
(2^bits - 1)``), so that ``X^T [[d]]`` is a multi-exponentiation with short unsigned
exponents (``CiphertextVector.dot_u64``; a pure-Python fallback over the native element
operations runs while the native kernel is missing). With ``S_j = sum_i q_ij D_i`` and
``T = sum_i D_i`` (a row of ones in the same product) the party forms, still encrypted,
``a_j S_j + b_j T`` with ``a_j = round(step_j 2^E)``, ``b_j = round(min_j 2^E)`` (E chosen so both
fit in 62 bits): that is ``sum_i xhat_ij d_i`` at scale ``2^(F+E)``, decoded after unmasking as
``value / 2^(F+E) / N``. The scores ``z`` use the unquantized standardized values; the
gradient uses ``xhat = min + step q`` (relative error ~ 2^-feature_bits per entry, which
averages out). :func:`train_plaintext_reference` runs the same algorithm in float64, with
``quantized=True`` using ``xhat`` in the gradient exactly like the secure run.

Masks
-----
Each masked value is ``x + R`` with R uniform in ``[2^(k-3), 2^(k-2))`` (k the smaller key
size), drawn from :mod:`secrets`; the decryptor sees ``x + R mod n``, within statistical
distance ``|x| / 2^(k-3)`` of R's own distribution (below 2^-1700 for any value these
protocols produce at k = 2048), and ``x + R`` never wraps modulo n, which the loss relay
through two keys needs. The fresh encryption of R also re-randomizes the ciphertext, which matters: a
product of the decryptor's own ciphertexts carries randomness ``prod rho_i^(q_ij)``, which the
key holder could otherwise recover and test against guesses of q.

What each party learns
----------------------
* G: its own gradient per batch, i.e. ``X_G^T (sum_k u_k)`` and ``sum_i sum_k u_k(i)`` (linear
  aggregates of the hosts' partial scores), the batch loss, each host's row count and column
  count (also visible from message sizes). Host gradients reach G only masked.
* Host j: its own gradient ``X_j^T d`` per batch (aggregates of the label-dependent
  fore-gradient), the stop decision; everything else it receives is a ciphertext or a masked
  value. H_1 additionally decrypts only masked values.
* Inference (:func:`predict_guest`): hosts send their per-row partial scores ``z_j = X_j w_j``
  to G, as in FATE; G learns these scores (not features or weights) and the predictions.

Caveats
-------
* Semi-honest parties only. Every decryptor is a decryption oracle for what it is sent: a
  malicious host could submit elements of ``[[d_G]]`` as its "gradient" and learn ``d_G``
  (hence labels), a malicious guest could submit hosts' ciphertexts to H_1. This is the trust
  model of FATE's and Yang et al.'s protocols. Channels must be authenticated (the runtime's
  mTLS).
* A party whose gradient has at least as many entries as a batch has rows could solve for the
  other side's per-row values; every party therefore refuses batches with no more rows than
  its gradient has entries (its columns, + 1 for the guest's intercept). This is necessary,
  not sufficient: gradients of many batches and epochs still accumulate information, as in
  every protocol of this family (FATE's included).
* Key sizes are 2048, 3072 or 4096 bits (the native core refuses smaller keys).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from confide import _native
from confide._checks import check_int as _check_int
from confide._checks import check_real as _check_real
from confide.crypto import gpu
from confide.crypto.ints import centered
from confide.errors import ConfideError, EncodingError, InvalidParameterError, ProtocolError
from confide.vertical.channel import Channel
from confide.vertical.paillier_util import Meter as _Meter
from confide.vertical.paillier_util import elements as _elements
from confide.vertical.paillier_util import raw_plaintexts as _raw

__all__ = [
    "HeteroLRGuestModel",
    "HeteroLRHostModel",
    "HeteroLRParams",
    "ReferenceResult",
    "predict_guest",
    "predict_host",
    "train_guest",
    "train_host",
    "train_plaintext_reference",
]

PROTOCOL = "confide.hetero-lr/1"
_GUEST_FORMAT = "confide.HeteroLRGuest/1"
_HOST_FORMAT = "confide.HeteroLRHost/1"
_KEY_BITS = (2048, 3072, 4096)
_OPTIMIZERS = ("adam", "sgd")
_ADAM_BETA1 = 0.9
_ADAM_BETA2 = 0.999
_ADAM_EPS = 1e-8
#: Fixed-point values must stay below 2^62 in magnitude (they travel as int64).
_INT_LIMIT_BITS = 62
#: The parameters every party must share (the others are each party's own choice).
_SHARED = ("epochs", "batch_size", "seed", "fixed_point_bits")


# ------------------------------------------------------------------------------ parameters


@dataclass(frozen=True)
class HeteroLRParams:
    """Training parameters.

    ``epochs``, ``batch_size``, ``seed`` and ``fixed_point_bits`` must be equal at every party
    (checked in the first message); the others are each party's own choice.

    Parameters
    ----------
    learning_rate : float, default 0.15
        Step size (> 0); epoch e uses ``learning_rate / (1 + decay e)``.
    epochs : int, default 10
        Maximum passes over the rows, 1..100000.
    batch_size : int, default 64
        Rows per mini-batch (the remainder joins the last batch), >= 1.
    l2 : float, default 0.01
        L2 penalty ``l2/2 ||w||^2`` on every party's weights (not the intercept), >= 0.
    optimizer : {"adam", "sgd"}, default "adam"
        Each party's local optimizer.
    decay : float, default 0.0
        Learning-rate decay per epoch, >= 0.
    key_bits : int, default 2048
        This party's Paillier key size: 2048, 3072 or 4096 (used by the guest and the key host).
    fixed_point_bits : int, default 20
        F: fore-gradients and partial scores are encoded as ``round(v 2^F)``, 8..40.
    feature_bits : int, default 16
        Bits per quantized feature in the encrypted products, 8..24.
    tol : float, default 1e-4
        Stop when the epoch loss changes by less than this (0 disables), >= 0. Guest only.
    seed : int, default 0
        Seed of the shared batch order, 0..2^62.
    threads : int, default 0
        Threads for the crypto kernels (0 = one per core), 0..1024.
    """

    learning_rate: float = 0.15
    epochs: int = 10
    batch_size: int = 64
    l2: float = 0.01
    optimizer: str = "adam"
    decay: float = 0.0
    key_bits: int = 2048
    fixed_point_bits: int = 20
    feature_bits: int = 16
    tol: float = 1e-4
    seed: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "learning_rate", _check_real("learning_rate", self.learning_rate, low=0.0, strict=True))
        set_(self, "epochs", _check_int("epochs", self.epochs, 1, 100_000))
        set_(self, "batch_size", _check_int("batch_size", self.batch_size, 1, 1 << 40))
        set_(self, "l2", _check_real("l2", self.l2, low=0.0, strict=False))
        if self.optimizer not in _OPTIMIZERS:
            raise InvalidParameterError(f"optimizer must be one of {', '.join(_OPTIMIZERS)}, got {self.optimizer!r}")
        set_(self, "decay", _check_real("decay", self.decay, low=0.0, strict=False))
        if isinstance(self.key_bits, bool) or self.key_bits not in _KEY_BITS:
            raise InvalidParameterError(
                f"key_bits must be one of {', '.join(map(str, _KEY_BITS))}, got {self.key_bits!r}"
            )
        set_(self, "key_bits", int(self.key_bits))
        set_(self, "fixed_point_bits", _check_int("fixed_point_bits", self.fixed_point_bits, 8, 40))
        set_(self, "feature_bits", _check_int("feature_bits", self.feature_bits, 8, 24))
        set_(self, "tol", _check_real("tol", self.tol, low=0.0, strict=False))
        set_(self, "seed", _check_int("seed", self.seed, 0, 1 << 62))
        set_(self, "threads", _check_int("threads", self.threads, 0, 1024))

    def shared(self) -> dict:
        """The parameters every party must agree on."""
        return {name: getattr(self, name) for name in _SHARED}


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


# ------------------------------------------------------------------------------ crypto helpers


def _generate_keypair(bits: int) -> _native.DecryptionKey:
    return _native.generate_keypair(bits)


def _modulus(key: _native.EncryptionKey) -> int:
    return int.from_bytes(key.n_bytes(), "big")


def _width(key: _native.EncryptionKey) -> int:
    return (key.bits + 7) // 8


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


def _masks(count: int, bits: int) -> list[int]:
    """Uniform in [2^(bits-1), 2^bits): x + R stays positive for any |x| < 2^(bits-1)."""
    return [secrets.randbits(bits - 1) | (1 << (bits - 1)) for _ in range(count)]


def _unmask(values: list[int], masks: list[int], n: int, where: str) -> list[int]:
    """Signed ``v - R mod n``; a result beyond 2^(k/2) means a peer broke the protocol."""
    clear = [centered(v - r, n) for v, r in zip(values, masks, strict=True)]
    limit = 1 << (n.bit_length() // 2)
    if any(abs(c) >= limit for c in clear):
        raise ProtocolError(f"{where}: an unmasked value is out of range (a peer did not follow the protocol)")
    return clear


def _pack(values: list[int], width: int) -> bytes:
    return b"".join(v.to_bytes(width, "big") for v in values)


def _unpack(data: Any, width: int, count: int, where: str) -> list[int]:
    if not isinstance(data, bytes) or len(data) != width * count:
        size = len(data) if isinstance(data, bytes) else type(data).__name__
        raise ProtocolError(f"{where}: expected {count} values of {width} bytes, got {size}")
    return [int.from_bytes(data[i * width : (i + 1) * width], "big") for i in range(count)]


def _from_elements(elements: list[bytes], key: _native.EncryptionKey) -> _native.CiphertextVector:
    return _native.CiphertextVector.from_elements(elements, key)


def _dot_u64_fallback(vector: _native.CiphertextVector, matrix: np.ndarray, threads: int) -> _native.CiphertextVector:
    """out[r] = prod_i c_i^(matrix[r, i]), for use while the native kernel is missing.

    Element-wise native scalar products, then a pairwise tree of native additions.
    """
    key = vector.encryption_key
    rows, length = matrix.shape
    elements = _elements(vector)
    scaled = _from_elements(elements * rows, key).mul_scalar_i64(
        np.ascontiguousarray(matrix.reshape(-1).astype(np.int64)), threads
    )
    current = _elements(scaled)
    one = b"\x01"  # the trivial encryption of 0: the identity of ciphertext products
    while length > 1:
        if length % 2:
            current = [x for r in range(rows) for x in (*current[r * length : (r + 1) * length], one)]
            length += 1
        half = length // 2
        left = [current[r * length + i] for r in range(rows) for i in range(half)]
        right = [current[r * length + half + i] for r in range(rows) for i in range(half)]
        current = _elements(_from_elements(left, key).add(_from_elements(right, key), threads))
        length = half
    return _from_elements(current, key)


def _dot_u64(vector: _native.CiphertextVector, matrix: np.ndarray, threads: int) -> _native.CiphertextVector:
    """Encrypted ``matrix @ m`` for unsigned integer rows (one output per row)."""
    matrix = np.ascontiguousarray(matrix, dtype=np.uint64)
    if matrix.ndim != 2 or matrix.shape[1] != len(vector) or matrix.shape[0] < 1:
        raise InvalidParameterError(f"matrix must have shape (rows >= 1, {len(vector)}), got {matrix.shape}")
    bits = max(1, int(matrix.max()).bit_length()) if matrix.size else 1
    native_dot = getattr(_native.CiphertextVector, "dot_u64", None)
    if native_dot is not None:
        return vector.dot_u64(matrix, bits, threads)
    if bits > 63:
        raise InvalidParameterError(f"matrix entries must be below 2^63 for the fallback, got {bits} bits")
    return _dot_u64_fallback(vector, matrix, threads)


def _signed_dot(vector: _native.CiphertextVector, coefficients: np.ndarray, threads: int) -> _native.CiphertextVector:
    """One ciphertext of ``sum_i coefficients[i] m_i`` for signed int64 coefficients."""
    positive = np.where(coefficients > 0, coefficients, 0).astype(np.uint64)
    negative = np.where(coefficients < 0, -coefficients, 0).astype(np.uint64)
    both = _dot_u64(vector, np.stack([positive, negative]), threads)
    key = vector.encryption_key
    parts = _elements(both)
    return _from_elements([parts[0]], key).add(_from_elements([parts[1]], key).negate(threads), threads)


def _affine_gradient(
    vector: _native.CiphertextVector, codes: np.ndarray, scaling: _Scaling, threads: int, *, with_sum: bool
) -> tuple[_native.CiphertextVector, int]:
    """Encrypted ``sum_i xhat_ij D_i`` at scale 2^(F+E) per column j, and E.

    ``xhat = min + step q``; when ``with_sum``, ``sum_i D_i`` (scale 2^F) follows the columns.
    """
    key = vector.encryption_key
    columns, length = codes.shape
    matrix = np.vstack([codes, np.ones((1, length), dtype=np.uint64)])
    products = _elements(_dot_u64(vector, matrix, threads))
    total = products[-1]
    if columns == 0:
        return _from_elements([total], key), 0
    largest = max(float(np.max(scaling.quant_step)), float(np.max(np.abs(scaling.quant_min))), 2.0**-60)
    exponent = max(0, _INT_LIMIT_BITS - 1 - math.frexp(largest)[1])
    a = np.rint(np.ldexp(scaling.quant_step, exponent)).astype(np.int64)
    b = np.rint(np.ldexp(scaling.quant_min, exponent)).astype(np.int64)
    sums = _from_elements(products[:-1], key).mul_scalar_i64(a, threads)
    offsets = _from_elements([total] * columns, key).mul_scalar_i64(b, threads)
    gradient = sums.add(offsets, threads)
    if with_sum:
        gradient = _from_elements([*_elements(gradient), total], key)
    return gradient, exponent


def _mask_vector(
    vector: _native.CiphertextVector,
    masks: list[int],
    encryptor: _native.EncryptionKey | _native.DecryptionKey,
    n: int,
    threads: int,
) -> _native.CiphertextVector:
    """[[x + R]]: adds a fresh encryption of the masks (which also re-randomizes)."""
    return vector.add(gpu.encrypt_raw(encryptor, _raw(masks, n), "fixed_base", threads), threads)


def _vector_field(
    message: dict, name: str, key: _native.EncryptionKey, sender: str, tag: str, length: int | None
) -> _native.CiphertextVector:
    data = message.get(name)
    if not isinstance(data, bytes):
        raise ProtocolError(f"message {tag!r} from {sender}: field {name!r} must be ciphertext bytes")
    try:
        vector = _native.CiphertextVector.from_bytes(data, key)
    except (ConfideError, ValueError) as error:
        raise ProtocolError(f"message {tag!r} from {sender}: field {name!r}: {error}") from None
    if vector.encoding != "raw" or (length is not None and len(vector) != length):
        raise ProtocolError(
            f"message {tag!r} from {sender}: field {name!r} must hold {length} raw ciphertexts, "
            f"got {len(vector)} ({vector.encoding})"
        )
    return vector


def _public_key(data: Any, sender: str) -> _native.EncryptionKey:
    if not isinstance(data, bytes) or not data:
        raise ProtocolError(f"hello from {sender}: field 'key' must hold a public key")
    try:
        return _native.EncryptionKey.from_bytes(data)
    except (ConfideError, ValueError) as error:
        raise ProtocolError(f"hello from {sender}: field 'key': {error}") from None


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


def train_guest(
    channel: Channel,
    hosts: list[str],
    X: np.ndarray,
    y: np.ndarray,
    params: HeteroLRParams,
    session: str,
    *,
    on_epoch=None,
    resume: dict | None = None,
) -> HeteroLRGuestModel:
    """Run the guest's side of training (see the module docstring for the protocol).

    ``X`` holds the guest's columns (rows aligned with every host's), ``y`` the 0/1 labels;
    ``hosts[0]`` is the key host. Returns the guest's model; the hosts return theirs.
    ``on_epoch(entry, snapshot)``: after every epoch, with its record and a callable returning
    the guest's training state (for a checkpoint). ``resume``: such a state; training continues
    with the next epoch (every host must resume from the same one).
    """
    start_epoch = int(resume["epoch"]) if resume else 0
    if not isinstance(params, HeteroLRParams):
        raise InvalidParameterError(f"params must be a HeteroLRParams, got {type(params).__name__}")
    me = f"guest {channel.party!r}"
    hosts = _check_party_names(channel.party, hosts, session)
    key_host = hosts[0]
    setup_start = time.perf_counter()
    meter = _Meter()

    own_error: Exception | None = None
    rows = columns = -1
    try:
        X = _check_features(X, me, min_columns=0)
        rows, columns = X.shape
        y = _check_labels(y, rows, me)
        _check_batch_privacy(params, rows, columns + 1, me)
    except InvalidParameterError as error:
        own_error = error
    secret = None
    key_bytes = b""
    if own_error is None:
        with meter:
            secret = _generate_keypair(params.key_bits)
        key_bytes = secret.encryption_key.to_bytes()
    hello = _hello(own_error, rows, columns, params, key_bytes, start_epoch)
    hello["hosts"] = list(hosts)
    channel.send(hosts, f"hlr-hello/{session}", hello)

    problems: list[Exception] = []
    host_columns: dict[str, int] = {}
    host_key = None
    for host in hosts:
        message = channel.recv(host, f"hlr-hello/{session}")
        problems += _peer_problems(message, host, rows, params, me, start_epoch)
        host_columns[host] = message.get("n_features") if isinstance(message.get("n_features"), int) else -1
        if host_columns[host] < 1 and not message.get("error"):
            problems.append(ProtocolError(f"hello from {host}: field 'n_features' must be a positive integer"))
        if host == key_host and not message.get("error"):
            try:
                host_key = _public_key(message.get("key"), host)
            except ProtocolError as error:
                problems.append(error)
    first = own_error or next(iter(problems), None)
    channel.send(hosts, f"hlr-start/{session}", {"ok": first is None, "error": "" if first is None else str(first)})
    _raise_first(own_error, problems)
    assert secret is not None and host_key is not None

    guest_key = secret.encryption_key
    n_guest, n_host = _modulus(guest_key), _modulus(host_key)
    width_host = _width(host_key)
    mask_bits = min(guest_key.bits, host_key.bits) - 2
    F = params.fixed_point_bits
    threads = params.threads
    scaling = _scaling_of(X, params.feature_bits)
    standard = scaling.standardize(X)
    codes = _quantize(standard, scaling)
    signs = 2.0 * y - 1.0
    weights = np.zeros(columns + 1)  # [w_G..., b]
    optimizer = _Optimizer(params, columns + 1)
    losses: list[float] = []
    if resume:
        weights, optimizer, losses = _resumed(resume, columns + 1, params, me)
    model = HeteroLRGuestModel(
        weights=weights[:-1].copy(), intercept=0.0, scaling=scaling, hosts=list(hosts), history=[]
    )
    model.setup_seconds = time.perf_counter() - setup_start

    base_round = channel.round
    for epoch in range(start_epoch, params.epochs):
        channel.round = base_round + 1 + epoch
        start, crypto0 = time.perf_counter(), meter.seconds
        sent0, got0 = channel.bytes_sent, channel.bytes_received
        loss_sum = 0.0
        for batch, index in enumerate(_batches(rows, params.batch_size, params.seed, epoch)):
            tag = f"{session}/{epoch}/{batch}"
            size = index.size
            z_guest = standard[index] @ weights[:-1] + weights[-1]
            d_guest = 0.25 * z_guest - 0.5 * signs[index]
            D_guest = _fixed(d_guest, F, "the guest's fore-gradient")
            with meter:
                encrypted_d = gpu.encrypt_i64(secret, D_guest, "fixed_base", threads)
            channel.send(hosts, f"hlr-d/{tag}", {"d": encrypted_d.to_bytes()})

            parts = [
                _vector_field(channel.recv(h, f"hlr-u/{tag}"), "u", host_key, h, f"hlr-u/{tag}", size) for h in hosts
            ]
            with meter:
                u_sum = parts[0] if len(parts) == 1 else _native.CiphertextVector.sum(parts, threads)
                d_full = u_sum.add_plain_i64(D_guest, threads)
                gradient, exponent = _affine_gradient(d_full, codes[:, index], scaling, threads, with_sum=True)
                coefficients = _fixed(z_guest - 2.0 * signs[index], F, "the guest's loss coefficients")
                loss_part = _signed_dot(u_sum, coefficients, threads)
                masks = _masks(columns + 2, mask_bits)
                outgoing = _from_elements([*_elements(gradient), *_elements(loss_part)], host_key)
                outgoing = _mask_vector(outgoing, masks, host_key, n_host, threads)
            channel.send(key_host, f"hlr-gg/{tag}", {"grad": outgoing.to_bytes()})

            for host in hosts:
                hg_tag = f"hlr-hg/{tag}"
                masked = _vector_field(channel.recv(host, hg_tag), "grad", guest_key, host, hg_tag, host_columns[host])
                with meter:
                    values = [int.from_bytes(v, "big") for v in gpu.decrypt_raw(secret, masked, threads)]
                channel.send(host, f"hlr-hgr/{tag}", {"masked": _pack(values, _width(guest_key))})

            ggr_tag = f"hlr-ggr/{tag}"
            reply = channel.recv(key_host, ggr_tag)
            values = _unpack(reply.get("masked"), width_host, columns + 1, f"message {ggr_tag!r} from {key_host}")
            loss_vector = _vector_field(reply, "loss", guest_key, key_host, ggr_tag, 1)
            with meter:
                loss_value = int.from_bytes(gpu.decrypt_raw(secret, loss_vector, threads)[0], "big")
            clear = _unmask(values, masks[:-1], n_host, f"message {ggr_tag!r} from {key_host}")
            grad = np.array([c / (1 << (F + exponent)) / size for c in clear[:-1]] + [clear[-1] / (1 << F) / size])
            grad[:-1] += params.l2 * weights[:-1]
            encrypted_loss = _unmask([loss_value], masks[-1:], n_guest, f"the loss from {key_host}")[0]
            encrypted_loss = encrypted_loss / (1 << (2 * F)) / size
            plain_loss = (
                math.log(2.0)
                - float(signs[index] @ z_guest) / (2.0 * size)
                + float(z_guest @ z_guest) / (8.0 * size)
                + 0.5 * params.l2 * float(weights[:-1] @ weights[:-1])
            )
            loss_sum += (plain_loss + encrypted_loss) * size
            weights = optimizer.step(weights, grad, epoch)

        losses.append(loss_sum / rows)
        stop = epoch == params.epochs - 1 or _converged(losses, params.tol)
        channel.send(hosts, f"hlr-ctl/{session}/{epoch}", {"stop": bool(stop)})
        model.history.append(_epoch_record(epoch, losses[-1], start, meter.seconds - crypto0, channel, sent0, got0))
        if stop and epoch < params.epochs - 1:
            model.history[-1]["stopped_early"] = True  # converged: a checkpoint of this epoch ends the job
        if on_epoch is not None:
            state = _snapshot(epoch + 1, weights, optimizer, losses)
            on_epoch(model.history[-1], lambda state=state: state)
        if stop:
            model.converged = _converged(losses, params.tol)
            break

    model.weights = weights[:-1].copy()
    model.intercept = float(weights[-1])
    return model


def train_host(
    channel: Channel,
    guest: str,
    hosts: list[str],
    X: np.ndarray,
    params: HeteroLRParams,
    session: str,
    *,
    on_epoch=None,
    resume: dict | None = None,
) -> HeteroLRHostModel:
    """Run one host's side of training.

    ``hosts`` is the same ordered list the guest got: ``hosts[0]`` draws K_H and decrypts the
    guest's masked values. ``on_epoch``, ``resume``: as the guest's.
    """
    start_epoch = int(resume["epoch"]) if resume else 0
    if not isinstance(params, HeteroLRParams):
        raise InvalidParameterError(f"params must be a HeteroLRParams, got {type(params).__name__}")
    if not isinstance(guest, str) or not guest:
        raise InvalidParameterError(f"guest must be a party name, got {guest!r}")
    hosts = _check_party_names(guest, hosts, session)
    if channel.party not in hosts:
        raise InvalidParameterError(f"hosts must contain this party {channel.party!r}, got {hosts!r}")
    me = f"host {channel.party!r}"
    key_host = hosts[0]
    is_key_host = channel.party == key_host
    others = [h for h in hosts if h != channel.party]
    setup_start = time.perf_counter()
    meter = _Meter()

    own_error: Exception | None = None
    rows = columns = -1
    try:
        X = _check_features(X, me, min_columns=1)
        rows, columns = X.shape
        _check_batch_privacy(params, rows, columns, me)
    except InvalidParameterError as error:
        own_error = error
    secret = None
    key_bytes = b""
    if is_key_host and own_error is None:
        with meter:
            secret = _generate_keypair(params.key_bits)
        key_bytes = secret.encryption_key.to_bytes()
    hello = _hello(own_error, rows, columns, params, key_bytes, start_epoch)
    channel.send([guest, *others] if is_key_host else [guest], f"hlr-hello/{session}", hello)

    problems: list[Exception] = []
    message = channel.recv(guest, f"hlr-hello/{session}")
    problems += _peer_problems(message, guest, rows, params, me, start_epoch)
    if message.get("hosts", hosts) != hosts:
        problems.append(InvalidParameterError(f"hosts differ: {me} has {hosts}, the guest has {message.get('hosts')}"))
    guest_key = None
    if not message.get("error"):
        try:
            guest_key = _public_key(message.get("key"), guest)
        except ProtocolError as error:
            problems.append(error)
    guest_columns = message.get("n_features")
    host_key = secret.encryption_key if secret is not None else None
    if not is_key_host:
        peer = channel.recv(key_host, f"hlr-hello/{session}")
        if not peer.get("error"):
            try:
                host_key = _public_key(peer.get("key"), key_host)
            except ProtocolError as error:
                problems.append(error)
    _raise_first(own_error, problems)
    start_message = channel.recv(guest, f"hlr-start/{session}")
    if not start_message.get("ok"):
        raise ProtocolError(f"guest {guest!r} stopped the training: {start_message.get('error')}")
    assert guest_key is not None and host_key is not None
    if not isinstance(guest_columns, int) or isinstance(guest_columns, bool) or guest_columns < 0:
        raise ProtocolError(f"hello from {guest}: field 'n_features' must be a non-negative integer")

    n_guest = _modulus(guest_key)
    width_guest = _width(guest_key)
    mask_bits = min(guest_key.bits, host_key.bits) - 2
    F = params.fixed_point_bits
    threads = params.threads
    u_encryptor = secret if secret is not None else host_key
    scaling = _scaling_of(X, params.feature_bits)
    standard = scaling.standardize(X)
    codes = _quantize(standard, scaling)
    weights = np.zeros(columns)
    optimizer = _Optimizer(params, columns)
    if resume:
        weights, optimizer, _ = _resumed(resume, columns, params, me)
    model = HeteroLRHostModel(weights=weights.copy(), scaling=scaling, guest=guest, hosts=list(hosts))
    model.setup_seconds = time.perf_counter() - setup_start
    position = hosts.index(channel.party)

    base_round = channel.round
    for epoch in range(start_epoch, params.epochs):
        channel.round = base_round + 1 + epoch
        start, crypto0 = time.perf_counter(), meter.seconds
        sent0, got0 = channel.bytes_sent, channel.bytes_received
        for batch, index in enumerate(_batches(rows, params.batch_size, params.seed, epoch)):
            tag = f"{session}/{epoch}/{batch}"
            size = index.size
            z_own = standard[index] @ weights
            U_own = _fixed(0.25 * z_own, F, f"the partial score of {me}")
            with meter:
                u_for_guest = gpu.encrypt_i64(u_encryptor, U_own, "fixed_base", threads)
            channel.send(guest, f"hlr-u/{tag}", {"u": u_for_guest.to_bytes()})
            if others:
                with meter:
                    u_for_hosts = gpu.encrypt_i64(guest_key, U_own, "fixed_base", threads)
                channel.send(others, f"hlr-uh/{tag}", {"u": u_for_hosts.to_bytes()})

            encrypted_d = _vector_field(
                channel.recv(guest, f"hlr-d/{tag}"), "d", guest_key, guest, f"hlr-d/{tag}", size
            )
            peer_u = {
                h: _vector_field(channel.recv(h, f"hlr-uh/{tag}"), "u", guest_key, h, f"hlr-uh/{tag}", size)
                for h in others
            }
            with meter:
                d_full = encrypted_d.add_plain_i64(U_own, threads)
                if peer_u:
                    d_full = _native.CiphertextVector.sum([d_full, *peer_u.values()], threads)
                gradient, exponent = _affine_gradient(d_full, codes[:, index], scaling, threads, with_sum=False)
                masks = _masks(columns, mask_bits)
                gradient = _mask_vector(gradient, masks, guest_key, n_guest, threads)
            channel.send(guest, f"hlr-hg/{tag}", {"grad": gradient.to_bytes()})

            # This host's share of the loss: sum z^2 / 8, its L2 term, cross terms with later hosts.
            plain = _big_fixed(float(z_own @ z_own) / 8.0, 2 * F) + _big_fixed(
                0.5 * size * params.l2 * float(weights @ weights), 2 * F
            )
            later = [peer_u[h] for h in hosts[position + 1 :]]
            cross = None
            if later:
                with meter:
                    later_sum = later[0] if len(later) == 1 else _native.CiphertextVector.sum(later, threads)
                    cross = _signed_dot(later_sum, _fixed(z_own, F, f"the partial score of {me}"), threads)
            if not is_key_host:
                with meter:
                    share = gpu.encrypt_raw(guest_key, _raw([plain], n_guest), "fixed_base", threads)
                    if cross is not None:
                        share = share.add(cross, threads)
                channel.send(key_host, f"hlr-lh/{tag}", {"loss": share.to_bytes()})
            else:
                gg_tag = f"hlr-gg/{tag}"
                incoming = _vector_field(
                    channel.recv(guest, gg_tag), "grad", host_key, guest, gg_tag, guest_columns + 2
                )
                shares = [
                    _vector_field(channel.recv(h, f"hlr-lh/{tag}"), "loss", guest_key, h, f"hlr-lh/{tag}", 1)
                    for h in others
                ]
                with meter:
                    values = [int.from_bytes(v, "big") for v in gpu.decrypt_raw(secret, incoming, threads)]
                    total = gpu.encrypt_raw(guest_key, _raw([values[-1] + plain], n_guest), "fixed_base", threads)
                    extra = ([cross] if cross is not None else []) + shares
                    if extra:
                        total = _native.CiphertextVector.sum([total, *extra], threads)
                channel.send(
                    guest,
                    f"hlr-ggr/{tag}",
                    {"masked": _pack(values[:-1], _width(host_key)), "loss": total.to_bytes()},
                )

            hgr_tag = f"hlr-hgr/{tag}"
            values = _unpack(channel.recv(guest, hgr_tag).get("masked"), width_guest, columns, f"message {hgr_tag!r}")
            clear = _unmask(values, masks, n_guest, f"message {hgr_tag!r} from {guest}")
            grad = np.array([c / (1 << (F + exponent)) / size for c in clear]) + params.l2 * weights
            weights = optimizer.step(weights, grad, epoch)

        control = channel.recv(guest, f"hlr-ctl/{session}/{epoch}")
        model.history.append(_epoch_record(epoch, None, start, meter.seconds - crypto0, channel, sent0, got0))
        if control.get("stop") is not False and epoch < params.epochs - 1:
            model.history[-1]["stopped_early"] = True
        if on_epoch is not None:
            state = _snapshot(epoch + 1, weights, optimizer, None)
            on_epoch(model.history[-1], lambda state=state: state)
        if control.get("stop") is not False:
            break

    model.weights = weights.copy()
    return model


# ------------------------------------------------------------------------------ inference


def predict_guest(
    channel: Channel, hosts: list[str], X: np.ndarray, model: HeteroLRGuestModel, session: str
) -> np.ndarray:
    """Probabilities ``sigmoid(z_G + sum_j z_j)`` for the guest's rows.

    Each host sends its per-row partial scores ``z_j = X_j w_j`` in the clear: that is what
    inference reveals to the guest (as in FATE); hosts learn nothing but the row count.
    """
    if not isinstance(model, HeteroLRGuestModel):
        raise InvalidParameterError(f"model must be a HeteroLRGuestModel, got {type(model).__name__}")
    me = f"guest {channel.party!r}"
    hosts = _check_party_names(channel.party, hosts, session)
    own_error: Exception | None = None
    rows = -1
    try:
        X = _check_features(X, me, min_columns=0)
        rows = X.shape[0]
        if X.shape[1] != model.n_features:
            raise InvalidParameterError(f"X of {me} has {X.shape[1]} columns, the model {model.n_features}")
    except InvalidParameterError as error:
        own_error = error
    hello = {"protocol": PROTOCOL, "n_rows": rows, "error": "" if own_error is None else str(own_error)}
    channel.send(hosts, f"hlr-p0/{session}", hello)
    if own_error is not None:
        raise own_error
    score = model.scaling.standardize(X) @ model.weights + model.intercept
    problems: list[Exception] = []
    for host in hosts:
        tag = f"hlr-p1/{session}"
        reply = channel.recv(host, tag)
        if reply.get("error"):
            problems.append(ProtocolError(f"{host} cannot predict: {reply['error']}"))
            continue
        host_rows = reply.get("n_rows")
        if host_rows != rows:
            problems.append(InvalidParameterError(f"row counts differ: {me} has {rows} rows, {host} has {host_rows}"))
            continue
        partial = reply.get("z")
        if not isinstance(partial, np.ndarray) or partial.dtype != np.float64 or partial.shape != (rows,):
            problems.append(ProtocolError(f"message {tag!r} from {host}: field 'z' must be float64 of shape ({rows},)"))
            continue
        if not np.all(np.isfinite(partial)):
            problems.append(ProtocolError(f"message {tag!r} from {host}: field 'z' holds non-finite values"))
            continue
        score = score + partial
    _raise_first(None, problems)
    return 0.5 + 0.5 * np.tanh(0.5 * score)


def predict_host(channel: Channel, guest: str, X: np.ndarray, model: HeteroLRHostModel, session: str) -> None:
    """A host's side of :func:`predict_guest`: sends ``z_j = X_j w_j`` for its rows."""
    if not isinstance(model, HeteroLRHostModel):
        raise InvalidParameterError(f"model must be a HeteroLRHostModel, got {type(model).__name__}")
    if not isinstance(session, str) or not session:
        raise InvalidParameterError(f"session must be a non-empty string, got {session!r}")
    me = f"host {channel.party!r}"
    own_error: Exception | None = None
    rows = -1
    try:
        X = _check_features(X, me, min_columns=1)
        rows = X.shape[0]
        if X.shape[1] != model.n_features:
            raise InvalidParameterError(f"X of {me} has {X.shape[1]} columns, the model {model.n_features}")
    except InvalidParameterError as error:
        own_error = error
    hello = channel.recv(guest, f"hlr-p0/{session}")
    guest_rows = hello.get("n_rows")
    mismatch = None
    if own_error is None and not hello.get("error") and guest_rows != rows:
        mismatch = InvalidParameterError(f"row counts differ: {me} has {rows} rows, guest {guest!r} has {guest_rows}")
    reply: dict = {"n_rows": rows, "error": "" if own_error is None else str(own_error)}
    if own_error is None and mismatch is None and not hello.get("error"):
        reply["z"] = model.scaling.standardize(X) @ model.weights
    channel.send(guest, f"hlr-p1/{session}", reply)
    if own_error is not None:
        raise own_error
    if hello.get("error"):
        raise ProtocolError(f"guest {guest!r} cannot predict: {hello['error']}")
    if mismatch is not None:
        raise mismatch


# ------------------------------------------------------------------------------ reference


def train_plaintext_reference(
    X_parts: Sequence[np.ndarray], y: np.ndarray, params: HeteroLRParams, *, quantized: bool = False
) -> ReferenceResult:
    """The same algorithm centralized in float64.

    Same scaling, batches, Taylor loss, optimizers (one per part, as each party runs its own)
    and stopping rule.

    ``X_parts[0]`` is the guest's block (it gets the intercept), the others the hosts' in
    order. With ``quantized=True`` the gradients use the dequantized features ``min + step q``
    exactly as the encrypted products do, so the secure run differs only by fixed-point
    rounding of the fore-gradients; with ``False`` they use the float features.
    """
    if not isinstance(params, HeteroLRParams):
        raise InvalidParameterError(f"params must be a HeteroLRParams, got {type(params).__name__}")
    if not X_parts:
        raise InvalidParameterError("X_parts must hold at least the guest's block")
    blocks = [_check_features(X, f"part {i}", min_columns=0 if i == 0 else 1) for i, X in enumerate(X_parts)]
    rows = blocks[0].shape[0]
    for i, block in enumerate(blocks):
        if block.shape[0] != rows:
            raise InvalidParameterError(f"row counts differ: part 0 has {rows} rows, part {i} has {block.shape[0]}")
    signs = 2.0 * _check_labels(y, rows, "the reference") - 1.0
    standards, gradient_features = [], []
    for block in blocks:
        scaling = _scaling_of(block, params.feature_bits)
        standard = scaling.standardize(block)
        standards.append(standard)
        gradient_features.append(_dequantize(_quantize(standard, scaling), scaling) if quantized else standard)
    weights = [np.zeros(block.shape[1] + (1 if i == 0 else 0)) for i, block in enumerate(blocks)]
    optimizers = [_Optimizer(params, w.size) for w in weights]
    losses: list[float] = []
    for epoch in range(params.epochs):
        loss_sum = 0.0
        for index in _batches(rows, params.batch_size, params.seed, epoch):
            size = index.size
            z = standards[0][index] @ weights[0][:-1] + weights[0][-1]
            for standard, w in zip(standards[1:], weights[1:], strict=True):
                z = z + standard[index] @ w
            fore = 0.25 * z - 0.5 * signs[index]
            penalty = sum(float(w[:-1] @ w[:-1]) if i == 0 else float(w @ w) for i, w in enumerate(weights))
            loss_sum += size * (
                math.log(2.0)
                - float(signs[index] @ z) / (2.0 * size)
                + float(z @ z) / (8.0 * size)
                + 0.5 * params.l2 * penalty
            )
            new_weights = []
            for i, (features, w) in enumerate(zip(gradient_features, weights, strict=True)):
                grad = features[index].T @ fore / size
                if i == 0:
                    grad = np.append(grad + params.l2 * w[:-1], fore.sum() / size)
                else:
                    grad = grad + params.l2 * w
                new_weights.append(optimizers[i].step(w, grad, epoch))
            weights = new_weights
        losses.append(loss_sum / rows)
        if _converged(losses, params.tol):
            break
    return ReferenceResult(
        weights=[weights[0][:-1].copy(), *(w.copy() for w in weights[1:])],
        intercept=float(weights[0][-1]),
        loss=losses,
    )
