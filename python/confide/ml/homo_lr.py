r"""Logistic regression for horizontal federated learning (FedAvg of LR), numpy only.

Every party holds rows with the same ``d`` features and a binary label ``y in {0, 1}``.
The model is ``w = (coef, intercept)`` with decision value ``z = x . coef + intercept``.

Loss (what :meth:`HomoLR.loss` returns) over ``n`` rows::

    L(w) = 1/n sum_i [ log(1 + exp(z_i)) - y_i z_i ]  +  l2/2 ||coef||^2

``log(1 + exp(z))`` is evaluated as ``np.logaddexp(0, z)``, which never overflows, and the
sigmoid as ``0.5 + 0.5 tanh(z / 2)``, which is exact in real arithmetic and stable for any z.
The intercept is not penalised.

Gradient over a mini-batch ``B`` of ``m`` rows, with ``p_i = sigmoid(z_i)``::

    g_coef      = 1/m sum_{i in B} (p_i - y_i) x_i  +  l2 coef
    g_intercept = 1/m sum_{i in B} (p_i - y_i)

Update (plain mini-batch SGD with a constant learning rate ``lr``)::

    coef      <- coef - lr g_coef          (computed as (1 - lr l2) coef - lr/m X_B^T r)
    intercept <- intercept - lr g_intercept

One local epoch is one pass over the rows in a fresh random order (a permutation drawn from
the instance's ``np.random.Generator``, seeded by ``seed``), cut into batches of
``batch_size`` rows; the last batch may be smaller.

Federated round (FedAvg): each party loads the global weights with :meth:`HomoLR.set_weights`,
runs :meth:`HomoLR.local_train` for ``local_epochs`` epochs on its own rows, and sends
:meth:`HomoLR.get_weights` (a flat ``[coef..., intercept]`` vector) together with its sample
count ``n_k``. The new global model is ``sum_k n_k w_k / sum_k n_k``. That weighted average, and
its protection, happen in the federated runtime (aggregator and party), not in this module.

Inputs: ``X`` is a dense numpy array or a ``scipy.sparse`` matrix (kept sparse, converted to
CSR when it is not CSR already; never densified). The heavy products run in ``X``'s own
floating dtype (float32 stays float32; integer or bool inputs are converted to float64 once),
while the master weights are always float64.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np

from confide._checks import check_int as _check_int
from confide._checks import check_real as _check_float
from confide.checkpoints import UNREADABLE_FILE_ERRORS
from confide.errors import InvalidParameterError
from confide.ml.base import FitResult, classification_metrics

__all__ = ["HomoLR", "HomoLRModel", "build"]

_FORMAT = "confide.HomoLR/1"
_MAX_FEATURES = 100_000_000


def _is_sparse(X: Any) -> bool:
    """Tell whether X is a scipy.sparse matrix or array (this module never imports scipy)."""
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and bool(sparse.issparse(X))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """Logistic function, stable for any z (no overflow), in z's dtype."""
    out = np.multiply(z, 0.5, dtype=z.dtype)
    np.tanh(out, out=out)
    out *= 0.5
    out += 0.5
    return out


def _check_proximal(proximal: tuple[float, Any] | None, shape: tuple[int, ...]) -> tuple[float, np.ndarray] | None:
    """FedProx's ``(mu, anchor)`` with the anchor as float64 of the weights' shape; None when mu is 0."""
    if proximal is None:
        return None
    mu, anchor = float(proximal[0]), np.asarray(proximal[1], dtype=np.float64)
    if anchor.shape != shape:
        raise InvalidParameterError(f"proximal anchor must have shape {shape}, got {anchor.shape}")
    return (mu, anchor) if mu > 0 else None


def _descend(
    w: np.ndarray,
    shrink: float,
    step: float,
    coef_gradient: np.ndarray,
    intercept_delta: float,
    lr: float,
    proximal: tuple[float, np.ndarray] | None,
) -> None:
    """One descent step on ``w`` (coefficients, then the intercept) in place.

    The L2 shrink, ``step`` times the coefficients' gradient, the intercept's change, then
    FedProx's pull towards the anchor: the one step minibatch SGD, DP-SGD and full-batch
    descent over partitions all take (each computes its own step size and intercept change).
    """
    if shrink != 1.0:
        w[:-1] *= shrink
    w[:-1] -= step * coef_gradient
    w[-1] -= intercept_delta
    if proximal is not None:
        w -= (lr * proximal[0]) * (w - proximal[1])


class HomoLR:
    """Binary logistic regression trained by mini-batch SGD, ready for FedAvg.

    Parameters
    ----------
    learning_rate : float, default 0.1
        SGD step size, > 0.
    local_epochs : int, default 1
        Passes over the local rows per :meth:`local_train` call, >= 1.
    batch_size : int, default 64
        Rows per mini-batch, >= 1; 0 is the full batch (one step per epoch over every row).
    l2 : float, default 0.0
        L2 penalty ``l2/2 ||coef||^2`` (intercept not penalised), >= 0.
    seed : int, default 0
        Seed of the generator that shuffles rows, >= 0. Two models built with the same
        seed and given the same calls produce the same weights.

    Attributes
    ----------
    n_features_in_ : int
        Number of features ``d`` (after :meth:`initialize`, :meth:`set_weights` or :meth:`fit`).
    coef_ : numpy.ndarray
        float64 weights, shape ``(d,)`` (a copy).
    intercept_ : float
        The bias.

    Notes
    -----
    The module docstring states the loss, gradient and update. The weighted average of
    the parties' weights (FedAvg) is done by the federated runtime, not here.
    """

    def __init__(
        self,
        learning_rate: float = 0.1,
        local_epochs: int = 1,
        batch_size: int = 64,
        l2: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.learning_rate = _check_float("learning_rate", learning_rate, low=0.0, strict=True)
        self.local_epochs = _check_int("local_epochs", local_epochs, 1)
        self.batch_size = _check_int("batch_size", batch_size, 0)
        self.l2 = _check_float("l2", l2, low=0.0, strict=False)
        self.seed = _check_int("seed", seed, 0)
        self._rng = np.random.default_rng(self.seed)
        self._w: np.ndarray | None = None  # float64 [coef..., intercept]

    def __repr__(self) -> str:
        return (
            f"HomoLR(learning_rate={self.learning_rate!r}, local_epochs={self.local_epochs!r}, "
            f"batch_size={self.batch_size!r}, l2={self.l2!r}, seed={self.seed!r})"
        )

    # ------------------------------------------------------------------ weights

    @property
    def n_features_in_(self) -> int:
        """Number of features ``d`` the model was initialised for."""
        return self._weights().size - 1

    @property
    def coef_(self) -> np.ndarray:
        """float64 coefficients, shape ``(d,)`` (a copy)."""
        return self._weights()[:-1].copy()

    @property
    def intercept_(self) -> float:
        """The intercept (bias)."""
        return float(self._weights()[-1])

    def _weights(self) -> np.ndarray:
        if self._w is None:
            raise InvalidParameterError("weights are not initialized; call initialize(n_features), set_weights or fit")
        return self._w

    def reseed(self, seed: int | list[int]) -> None:
        """Restart the batch-order generator from ``seed`` (an int or a list of ints).

        A federated runner reseeds before every round from (job seed, party, round), so a job
        resumed from a checkpoint draws exactly the batches an uninterrupted run would have.
        """
        self._rng = np.random.default_rng(seed)

    def initialize(self, n_features: int) -> None:
        """Set all weights (coefficients and intercept) to zero for ``n_features`` features.

        Parameters
        ----------
        n_features : int
            Number of features ``d``, in [1, 100_000_000].
        """
        d = _check_int("n_features", n_features, 1, _MAX_FEATURES)
        self._w = np.zeros(d + 1, dtype=np.float64)

    def get_weights(self) -> np.ndarray:
        """Return the weights as one flat float64 vector ``[coef..., intercept]`` (a copy).

        Returns
        -------
        numpy.ndarray
            Shape ``(d + 1,)``.
        """
        return self._weights().copy()

    def set_weights(self, weights: Any) -> None:
        """Load a flat ``[coef..., intercept]`` vector, for example the global model of a round.

        Parameters
        ----------
        weights : array_like
            1-D, finite, length ``d + 1``. On a model that is not initialised yet, ``d`` is taken
            from the length (which must then be >= 2).

        Raises
        ------
        InvalidParameterError
            Wrong shape or length, or a non-finite value.
        """
        try:
            w = np.array(weights, dtype=np.float64, copy=True)
        except (TypeError, ValueError) as exc:
            raise InvalidParameterError(f"weights must be a 1-D array of real numbers: {exc}") from None
        if w.ndim != 1:
            raise InvalidParameterError(f"weights must be 1-D, got shape {w.shape}")
        expected = None if self._w is None else self._w.size
        if expected is not None and w.size != expected:
            raise InvalidParameterError(f"weights must have length n_features + 1 = {expected}, got {w.size}")
        if w.size < 2 or w.size - 1 > _MAX_FEATURES:
            raise InvalidParameterError(f"weights must have length in [2, {_MAX_FEATURES + 1}], got {w.size}")
        if not np.isfinite(w).all():
            raise InvalidParameterError("weights must be finite (no NaN or inf)")
        self._w = w

    # ------------------------------------------------------------------ inputs

    def _check_X(self, X: Any, name: str = "X") -> Any:
        """Validate X against the model width; return a float dense array or a float CSR matrix."""
        d = self.n_features_in_
        if _is_sparse(X):
            if X.ndim != 2:
                raise InvalidParameterError(f"{name} must be 2-D, got {X.ndim}-D")
            if X.format != "csr":
                X = X.tocsr()
            if X.dtype not in (np.float32, np.float64):
                X = X.astype(np.float32 if X.dtype == np.float16 else np.float64)
            data = X.data
        else:
            X = np.asarray(X)
            if X.dtype not in (np.float32, np.float64):
                if X.dtype.kind not in "biuf":
                    raise InvalidParameterError(f"{name} must hold real numbers, got dtype {X.dtype}")
                X = X.astype(np.float32 if X.dtype == np.float16 else np.float64)
            if X.ndim != 2:
                raise InvalidParameterError(f"{name} must be 2-D (rows x features), got shape {X.shape}")
            data = X
        if X.shape[0] < 1:
            raise InvalidParameterError(f"{name} must have at least 1 row, got 0")
        if X.shape[1] != d:
            raise InvalidParameterError(f"{name} must have n_features_in_ = {d} columns, got {X.shape[1]}")
        if not np.isfinite(data).all():
            raise InvalidParameterError(f"{name} must be finite (no NaN or inf)")
        return X

    @staticmethod
    def _check_y(y: Any, n: int, dtype: np.dtype) -> np.ndarray:
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise InvalidParameterError(f"y must be 1-D, got shape {y.shape}")
        if y.shape[0] != n:
            raise InvalidParameterError(f"y must have one label per row of X ({n}), got {y.shape[0]}")
        if y.dtype.kind not in "biuf":
            raise InvalidParameterError(f"y must hold 0/1 labels, got dtype {y.dtype}")
        if not ((y == 0) | (y == 1)).all():
            raise InvalidParameterError("y must be binary with values in {0, 1}")
        return y.astype(dtype)

    # ------------------------------------------------------------------ training

    def local_train(
        self,
        X: Any,
        y: Any,
        *,
        epochs: int | None = None,
        proximal: tuple[float, np.ndarray] | None = None,
        dp_sgd: tuple[float, float, float] | None = None,
    ) -> float:
        """Run mini-batch SGD from the current weights over the local rows.

        Parameters
        ----------
        X : numpy.ndarray or scipy.sparse matrix
            Shape ``(n, d)``; sparse input stays sparse.
        y : array_like
            Shape ``(n,)``, values in {0, 1}.
        epochs : int, optional
            Passes over the shuffled rows (>= 1); defaults to ``local_epochs``.
        proximal : (mu, anchor), optional
            FedProx: after every step, ``w <- w - lr * mu * (w - anchor)`` (``anchor``: the global
            weights, shape ``(d + 1,)``).
        dp_sgd : (noise_multiplier, clip_norm, sample_rate), optional
            Record-level DP-SGD instead of shuffled batches: ``epochs * ceil(n / batch_size)``
            steps, each sampling every row with probability ``sample_rate`` (Poisson),
            clipping each row's gradient to L2 norm ``clip_norm`` and adding Gaussian noise of
            deviation ``noise_multiplier * clip_norm`` to their sum, divided by the expected
            batch size ``sample_rate * n``. The noise comes from the OS, not from ``seed``.

        Returns
        -------
        float
            :meth:`loss` on ``(X, y)`` after training.
        """
        w = self._weights()
        epochs = self.local_epochs if epochs is None else _check_int("epochs", epochs, 1)
        lr = _check_float("learning_rate", self.learning_rate, low=0.0, strict=True)
        l2 = _check_float("l2", self.l2, low=0.0, strict=False)
        bs = _check_int("batch_size", self.batch_size, 0)
        X = self._check_X(X)
        n = X.shape[0]
        y = self._check_y(y, n, X.dtype)
        bs = n if bs == 0 else min(bs, n)
        buf = None if _is_sparse(X) else np.empty((bs, X.shape[1]), dtype=X.dtype)
        shrink = 1.0 - lr * l2
        w = w.copy()  # committed only if training stays finite
        proximal = _check_proximal(proximal, w.shape)
        with np.errstate(over="ignore", invalid="ignore"):  # divergence is checked once, below
            if dp_sgd is not None:
                self._dp_sgd(X, y, w, epochs, lr, shrink, bs, proximal, dp_sgd)
            else:
                self._sgd(X, y, w, epochs, lr, shrink, bs, buf, proximal)
        self._commit(w)
        return self.loss(X, y)

    def _commit(self, w: np.ndarray) -> None:
        """Keep the trained weights ``w``, unless training diverged (the model is then left unchanged)."""
        if not np.isfinite(w).all():
            raise InvalidParameterError(
                f"training diverged (non-finite weights, model left unchanged); lower learning_rate "
                f"(got {self.learning_rate})"
            )
        self._w = w

    def _sgd(
        self,
        X: Any,
        y: np.ndarray,
        w: np.ndarray,
        epochs: int,
        lr: float,
        shrink: float,
        bs: int,
        buf: Any,
        proximal: tuple[float, np.ndarray] | None = None,
    ) -> None:
        n, dt, sparse = X.shape[0], X.dtype, buf is None
        coef = w[:-1]  # view: updated in place
        for _ in range(epochs):
            order = self._rng.permutation(n)
            for start in range(0, n, bs):
                idx = order[start : start + bs]
                m = idx.size
                if sparse:
                    xb = X[idx]
                else:
                    xb = np.take(X, idx, axis=0, out=buf[:m])
                z = xb @ coef.astype(dt, copy=False)
                z += dt.type(w[-1])
                r = _sigmoid(z)
                r -= y[idx]
                g = xb.T @ r
                _descend(w, shrink, lr / m, g, lr * float(np.mean(r, dtype=np.float64)), lr, proximal)

    def _dp_sgd(
        self,
        X: Any,
        y: np.ndarray,
        w: np.ndarray,
        epochs: int,
        lr: float,
        shrink: float,
        bs: int,
        proximal: tuple[float, np.ndarray] | None,
        dp_sgd: tuple[float, float, float],
    ) -> None:
        from confide.privacy.noise import generator

        z, clip, rate = (float(v) for v in dp_sgd)
        n, dt = X.shape[0], X.dtype
        expected = rate * n
        # |gradient of row i| = |r_i| * sqrt(|x_i|^2 + 1) for (coef, intercept).
        if _is_sparse(X):
            row_norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel() + 1.0)
        else:
            row_norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64) + 1.0)
        rng = generator()
        coef = w[:-1]
        for _ in range(epochs * math.ceil(n / bs)):
            idx = np.flatnonzero(rng.random(n) < rate)
            total = np.zeros(w.size, dtype=np.float64)
            if idx.size:
                xb = X[idx]
                z_b = xb @ coef.astype(dt, copy=False) + dt.type(w[-1])
                r = (_sigmoid(np.asarray(z_b)) - y[idx]).astype(np.float64)
                r *= np.minimum(1.0, clip / np.maximum(np.abs(r) * row_norms[idx], 1e-300))
                total[:-1] = np.asarray(xb.T @ r.astype(dt)).ravel()
                total[-1] = r.sum()
            total += rng.normal(0.0, z * clip, w.size)
            step = lr / expected
            _descend(w, shrink, step, total[:-1], step * total[-1], lr, proximal)

    def train_partitioned(self, data: Any, *, proximal: tuple[float, np.ndarray] | None = None) -> float:
        """Full-batch gradient descent over partitioned rows; returns the loss after training.

        ``data`` is a :class:`confide.compute.partitions.PartitionedData`: each of the
        ``local_epochs`` steps sends the weights to every partition's holder, which returns the
        sum over its rows of ``(p - y) [x, 1]``; the sums are added in partition order and applied
        as one step of the full batch (``batch_size`` 0). Never sees a row.
        """
        if self.batch_size != 0:
            raise InvalidParameterError(
                f"model.batch_size is {self.batch_size}: on partitioned data Homo LR trains full batch "
                "(gradients per partition, summed); set model.batch_size: 0"
            )
        lr = _check_float("learning_rate", self.learning_rate, low=0.0, strict=True)
        shrink = 1.0 - lr * _check_float("l2", self.l2, low=0.0, strict=False)
        w = self._weights().copy()
        proximal = _check_proximal(proximal, w.shape)
        for _ in range(self.local_epochs):
            sums = data.call("lr_gradient", w)
            n = sum(count for _g, _loss, count in sums)
            if n == 0:
                raise InvalidParameterError("the partitions hold no training rows")
            gradient = np.sum([g for g, _loss, _count in sums], axis=0)
            _descend(w, shrink, lr / n, gradient[:-1], lr * gradient[-1] / n, lr, proximal)
        self._commit(w)
        return self.partitioned_loss(data)

    def partitioned_loss(self, data: Any) -> float:
        """:meth:`loss` over partitioned rows (``data.which``: training or test rows)."""
        w = self._weights()
        sums = data.call("lr_loss", w, data.which)
        n = sum(count for _loss, count in sums)
        mean = sum(loss for loss, _count in sums) / max(n, 1)
        return float(mean) + 0.5 * self.l2 * float(w[:-1] @ w[:-1])

    def fit(self, X: Any, y: Any, *, epochs: int = 10) -> HomoLR:
        """Centralised training with the same optimiser as :meth:`local_train`.

        Initialises zero weights for ``X``'s width when the model has none; otherwise training
        continues from the current weights (whose width must match ``X``).

        Parameters
        ----------
        X : numpy.ndarray or scipy.sparse matrix
            Shape ``(n, d)``.
        y : array_like
            Shape ``(n,)``, values in {0, 1}.
        epochs : int, default 10
            Passes over the data, >= 1.

        Returns
        -------
        HomoLR
            ``self``.
        """
        epochs = _check_int("epochs", epochs, 1)
        if self._w is None:
            shape = getattr(X, "shape", None)
            if shape is None:
                shape = np.shape(X)
            if len(shape) != 2:
                raise InvalidParameterError(f"X must be 2-D (rows x features), got shape {tuple(shape)}")
            self.initialize(shape[1])
        self.local_train(X, y, epochs=epochs)
        return self

    # ------------------------------------------------------------------ inference

    def _z(self, X: Any) -> np.ndarray:
        w = self._weights()
        z = X @ w[:-1].astype(X.dtype, copy=False)
        z += X.dtype.type(w[-1])
        return np.asarray(z).reshape(-1)

    def loss(self, X: Any, y: Any) -> float:
        """Mean logistic loss plus ``l2/2 ||coef||^2``.

        Parameters
        ----------
        X : numpy.ndarray or scipy.sparse matrix
            Shape ``(n, d)``.
        y : array_like
            Shape ``(n,)``, values in {0, 1}.

        Returns
        -------
        float
            The loss (see the module docstring).
        """
        X = self._check_X(X)
        y = self._check_y(y, X.shape[0], X.dtype)
        z = self._z(X)
        per_row = np.logaddexp(0, z)
        per_row -= y * z
        coef = self._weights()[:-1]
        return float(np.mean(per_row, dtype=np.float64)) + 0.5 * self.l2 * float(coef @ coef)

    def decision_function(self, X: Any) -> np.ndarray:
        """Decision values ``X . coef + intercept``.

        Parameters
        ----------
        X : numpy.ndarray or scipy.sparse matrix
            Shape ``(n, d)``.

        Returns
        -------
        numpy.ndarray
            float64, shape ``(n,)``.
        """
        return self._z(self._check_X(X)).astype(np.float64)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, like scikit-learn: column 0 is P(y=0), column 1 is P(y=1).

        Parameters
        ----------
        X : numpy.ndarray or scipy.sparse matrix
            Shape ``(n, d)``.

        Returns
        -------
        numpy.ndarray
            float64, shape ``(n, 2)``.
        """
        p = _sigmoid(self.decision_function(X))
        return np.column_stack((1.0 - p, p))

    def predict(self, X: Any) -> np.ndarray:
        """Predicted labels (1 where the decision value is > 0).

        Parameters
        ----------
        X : numpy.ndarray or scipy.sparse matrix
            Shape ``(n, d)``.

        Returns
        -------
        numpy.ndarray
            int64 labels in {0, 1}, shape ``(n,)``.
        """
        return (self.decision_function(X) > 0).astype(np.int64)

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the weights and hyper-parameters to ``path`` as an ``.npz`` archive.

        The file is written at exactly ``path`` (no suffix is added). The shuffling
        generator's state is not saved: a loaded model restarts it from ``seed``.

        Parameters
        ----------
        path : str or os.PathLike
            Destination file.
        """
        w = self._weights()
        with open(path, "wb") as fh:
            np.savez(
                fh,
                format=np.array(_FORMAT),
                weights=w,
                learning_rate=np.float64(self.learning_rate),
                local_epochs=np.int64(self.local_epochs),
                batch_size=np.int64(self.batch_size),
                l2=np.float64(self.l2),
                seed=np.int64(self.seed),
            )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HomoLR:
        """Read a model written by :meth:`save`.

        Parameters
        ----------
        path : str or os.PathLike
            File written by :meth:`save`.

        Returns
        -------
        HomoLR
            The model, with its hyper-parameters and weights.

        Raises
        ------
        InvalidParameterError
            The file is not a saved HomoLR model or its contents are invalid.
        """
        keys = ("format", "weights", "learning_rate", "local_epochs", "batch_size", "l2", "seed")
        try:
            loaded = np.load(path, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            with loaded as npz:
                data = {k: npz[k] for k in keys}
        except UNREADABLE_FILE_ERRORS as exc:
            raise InvalidParameterError(f"path {os.fspath(path)!r} is not a saved HomoLR model: {exc}") from None
        if str(data["format"]) != _FORMAT:
            raise InvalidParameterError(f"format must be {_FORMAT!r}, got {str(data['format'])!r}")
        model = cls(
            learning_rate=float(data["learning_rate"]),
            local_epochs=int(data["local_epochs"]),
            batch_size=int(data["batch_size"]),
            l2=float(data["l2"]),
            seed=int(data["seed"]),
        )
        model.set_weights(data["weights"])
        return model


class HomoLRModel:
    """:class:`HomoLR` on the model seam: tensors ``lr/coef`` ``(d,)`` and ``lr/intercept`` ``(1,)``.

    Flattened in that order they are exactly HomoLR's ``[coef..., intercept]`` vector, and both
    tensors form one layer (one dACIQ threshold), so a job trains as it did before the seam.
    """

    #: Runs record-level DP-SGD itself (``FitConfig.dp_sgd``).
    supports_dp_sgd = True

    def __init__(self, estimator: HomoLR) -> None:
        self.estimator = estimator

    @property
    def batch_size(self) -> int:
        """Rows per step (what DP-SGD's sample rate is computed from)."""
        return self.estimator.batch_size

    def build(self, example_shape: tuple[int, ...], classes: int) -> None:
        """Zero weights for ``example_shape = (d,)`` features; binary labels only."""
        if len(example_shape) != 1:
            raise InvalidParameterError(
                f"model.algorithm homo_lr takes rows of features, got examples of shape {example_shape}"
            )
        if classes not in (0, 2):
            raise InvalidParameterError(f"model.algorithm homo_lr is binary, the data has {classes} classes")
        self.estimator.initialize(example_shape[0])

    def get_weights(self) -> dict[str, np.ndarray]:
        """``lr/coef`` and ``lr/intercept`` (float64 copies)."""
        w = self.estimator.get_weights()
        return {"lr/coef": w[:-1], "lr/intercept": w[-1:]}

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load the two tensors."""
        self.estimator.set_weights(np.concatenate([np.ravel(weights["lr/coef"]), np.ravel(weights["lr/intercept"])]))

    def fit(self, X: Any, y: np.ndarray, config: Any) -> Any:
        """``local_epochs`` of SGD from the current weights, batch order drawn from ``config.seed``."""
        self.estimator.reseed(list(config.seed))
        proximal = None
        if config.proximal_mu > 0 and config.global_weights is not None:
            g = config.global_weights
            proximal = (config.proximal_mu, np.concatenate([np.ravel(g["lr/coef"]), np.ravel(g["lr/intercept"])]))
        dp_sgd = getattr(config, "dp_sgd", None)
        if _is_partitioned(X):
            if dp_sgd is not None:
                raise InvalidParameterError("privacy.mechanism dp_sgd does not run on partitioned (Ray) data yet")
            loss = self.estimator.train_partitioned(X, proximal=proximal)
        else:
            loss = self.estimator.local_train(X, y, proximal=proximal, dp_sgd=dp_sgd)
        return FitResult(num_examples=int(X.shape[0]), metrics={"loss": float(loss)})

    def predict(self, X: Any) -> np.ndarray:
        """P(label = 1) per row."""
        return self.estimator.predict_proba(X)[:, 1]

    def evaluate(self, X: Any, y: np.ndarray, metrics: list[str]) -> dict[str, float]:
        """Log loss, accuracy at 0.5 and AUC (on partitioned rows: accuracy and AUC gather the scores)."""
        if _is_partitioned(X):
            loss = self.estimator.partitioned_loss(X)
            if not set(metrics) & {"accuracy", "auc"}:
                return {"loss": loss}
            pairs = X.call("lr_scores", self.estimator._weights(), X.which)
            scores = np.concatenate([s for s, _y in pairs])
            labels = np.concatenate([labels for _s, labels in pairs])
            return classification_metrics(scores, labels, metrics, loss)
        return classification_metrics(
            self.estimator.decision_function(X), np.asarray(y), metrics, self.estimator.loss(X, y)
        )


def _is_partitioned(X: Any) -> bool:
    return hasattr(X, "holders") and hasattr(X, "which")


def build(spec: Any, *, seed: int, party_id: str, **_options: Any) -> HomoLRModel:
    """The seam's factory for ``model.algorithm: homo_lr``."""
    return HomoLRModel(
        HomoLR(
            learning_rate=spec.learning_rate,
            local_epochs=spec.local_epochs,
            batch_size=spec.batch_size,
            l2=spec.l2,
            seed=seed,
        )
    )
