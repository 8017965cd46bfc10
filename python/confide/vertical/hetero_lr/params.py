"""Hetero LR's hyper-parameters, protocol name and limits."""

from __future__ import annotations

from dataclasses import dataclass

from confide._checks import check_int as _check_int
from confide._checks import check_real as _check_real
from confide.errors import InvalidParameterError

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
