"""The model seam: what the party runner needs of any horizontal model, and nothing more.

A horizontal model is a :class:`FederatedModel`: named weight tensors as numpy arrays in and
out, ``fit`` on the party's own rows (returning the number of examples and metrics),
``evaluate`` on held-out rows, and its weights saved in checkpoints by the runner. The runner
never knows which model it drives, and the protection modes never know either: they see one
flat vector per round (float32, or float64 where a tensor is), cut out of the named tensors by
a :class:`WeightLayout`.

Round, as the runner drives it (docs/models.md has the whole picture)::

    global  = layout.flatten(model.get_weights())       # identical at every party
    result  = model.fit(X, y, FitConfig(round, seed, proximal_mu, global_weights))
    delta   = layout.flatten(model.get_weights()) - global
    vector  = strategy.contribution(delta, n_k / N)     # what gets protected and summed
    global  = strategy.apply(global, sum_k vector_k)    # the same at every party
    model.set_weights(layout.unflatten(global))

The layout also gives the protection its segments (one per tensor): ``paillier`` clips each
tensor with its own dACIQ threshold, as BatchCrypt clips each layer.

Adding a model is one file with a class implementing :class:`FederatedModel` and a factory
``build(spec, seed, party_id) -> FederatedModel``, plus one line in :data:`confide.ml.MODELS`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from confide.errors import InvalidParameterError

__all__ = ["FederatedModel", "FitConfig", "FitResult", "TensorSpec", "WeightLayout", "Weights", "glorot_like"]

#: Named weight tensors, in the model's own order.
Weights = dict[str, np.ndarray]

#: dtypes a tensor may have: what the codecs accept (float16 travels widened to float32).
DTYPES = ("float16", "float32", "float64")


@dataclass(frozen=True)
class FitConfig:
    """What the runner tells a model for one local fit.

    ``seed`` draws this round's batch order (the same in a resumed run). ``proximal_mu`` > 0
    asks for FedProx's proximal term ``mu/2 ||w - global||^2``; models apply it as a
    decoupled step ``w <- w - lr * mu * (w - global)`` after every optimizer step.
    """

    round: int
    seed: tuple[int, ...]
    epochs: int = 1
    proximal_mu: float = 0.0
    global_weights: Weights | None = None
    #: Record-level DP-SGD: (noise multiplier, per-record clip norm, Poisson sample rate); models
    #: with ``supports_dp_sgd`` (homo_lr, PyTorch through Opacus) train with it, the runner
    #: refuses the others before the job starts.
    dp_sgd: tuple[float, float, float] | None = None


@dataclass
class FitResult:
    """The outcome of one local fit."""

    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class FederatedModel(Protocol):
    """A model the party runner can train in any protection mode.

    ``build`` is called once with the shape of one example (``X.shape[1:]``) and the labels
    seen by *the job* (not only this party), before any other call. Weights must be the same
    at every party after ``build``: draw random ones from ``seed`` with numpy
    (:func:`glorot_like`), never from a framework's own generator, which differs between
    frameworks and versions.
    """

    def build(self, example_shape: tuple[int, ...], classes: int) -> None:
        """Create the weights for inputs of ``example_shape`` and ``classes`` labels (0 for regression)."""

    def get_weights(self) -> Weights:
        """The current weights, by name (copies)."""

    def set_weights(self, weights: Weights) -> None:
        """Load weights (same names, shapes and dtypes as :meth:`get_weights`)."""

    def fit(self, X: Any, y: np.ndarray, config: FitConfig) -> FitResult:
        """Train on the local rows from the current weights."""

    def evaluate(self, X: Any, y: np.ndarray, metrics: list[str]) -> dict[str, float]:
        """Metrics on held-out rows: ``loss`` always; ``accuracy`` and ``auc`` where asked and defined."""


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor of a layout."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        """Number of values."""
        return math.prod(self.shape)


class WeightLayout:
    """Where each named tensor sits in the flat vector that rounds protect and sum."""

    def __init__(self, tensors: list[TensorSpec]) -> None:
        if not tensors:
            raise InvalidParameterError("a model must have at least one weight tensor")
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            raise InvalidParameterError(f"weight names must be distinct, got {names}")
        for tensor in tensors:
            if tensor.dtype not in DTYPES:
                raise InvalidParameterError(
                    f"weight {tensor.name!r} has dtype {tensor.dtype}; the codecs accept {', '.join(DTYPES)}"
                )
        self.tensors = tuple(tensors)
        offsets = np.cumsum([0] + [t.size for t in tensors])
        self._offsets = [int(o) for o in offsets]

    @classmethod
    def of(cls, weights: Mapping[str, np.ndarray]) -> WeightLayout:
        """The layout of ``weights``."""
        return cls(
            [
                TensorSpec(name, tuple(int(d) for d in np.shape(v)), np.asarray(v).dtype.name)
                for name, v in weights.items()
            ]
        )

    @property
    def size(self) -> int:
        """Length of the flat vector."""
        return self._offsets[-1]

    @property
    def dtype(self) -> np.dtype:
        """The flat vector's dtype: float64 if any tensor is, else float32 (float16 tensors widen to it).

        Rounds run in this dtype, so a float32 model's round never holds a float64 copy of it.
        """
        if any(t.dtype == "float64" for t in self.tensors):
            return np.dtype(np.float64)
        return np.dtype(np.float32)

    @property
    def nbytes(self) -> int:
        """Bytes of the model's own tensors, each in its dtype."""
        return sum(t.size * np.dtype(t.dtype).itemsize for t in self.tensors)

    def segments(self) -> list[tuple[int, int]]:
        """(start, stop) of every tensor in the flat vector."""
        return [(self._offsets[i], self._offsets[i + 1]) for i in range(len(self.tensors))]

    def layers(self) -> list[tuple[int, int]]:
        """(start, stop) of every layer.

        A layer is a run of consecutive tensors whose names share a prefix before the last ``/``
        or ``.`` (``dense_1/kernel`` + ``dense_1/bias``; ``fc1.weight`` + ``fc1.bias``).

        ``paillier`` picks one dACIQ clipping threshold per layer, as BatchCrypt does.
        """
        out: list[tuple[int, int]] = []
        previous = None
        for tensor, (start, stop) in zip(self.tensors, self.segments(), strict=True):
            name = tensor.name
            cut = max(name.rfind("/"), name.rfind("."))
            key = name[:cut] if cut > 0 else name
            if out and key == previous:
                out[-1] = (out[-1][0], stop)
            else:
                out.append((start, stop))
            previous = key
        return out

    def flatten(
        self, weights: Mapping[str, np.ndarray], *, who: str = "model", dtype=None, consume: bool = False
    ) -> np.ndarray:
        """One vector of ``weights`` in layout order, in :attr:`dtype` unless told (checks names and shapes).

        ``consume``: take each tensor out of ``weights`` (a dict the caller drops) once it is
        copied, so a model's copy and the vector are not both whole at once.
        """
        self.check(weights, who=who)
        out = np.empty(self.size, dtype=self.dtype if dtype is None else dtype)
        for tensor, (start, stop) in zip(self.tensors, self.segments(), strict=True):
            value = weights.pop(tensor.name) if consume and isinstance(weights, dict) else weights[tensor.name]
            out[start:stop] = np.asarray(value).ravel()
            del value
        return out

    def unflatten(self, vector: np.ndarray, *, copy: bool = True) -> Weights:
        """Named tensors (in their own dtypes) from a flat vector.

        With ``copy=False`` a tensor whose dtype is the vector's is a view of it (no second copy
        of the model): for a vector the caller drops, or reads only.
        """
        vector = np.asarray(vector)
        if vector.shape != (self.size,):
            raise InvalidParameterError(f"weight vector has shape {vector.shape}, the layout needs ({self.size},)")
        return {
            tensor.name: vector[start:stop].astype(tensor.dtype, copy=copy).reshape(tensor.shape)
            for tensor, (start, stop) in zip(self.tensors, self.segments(), strict=True)
        }

    def check(self, weights: Mapping[str, np.ndarray], *, who: str = "model") -> None:
        """Raise, naming the tensor, where ``weights`` differ from this layout."""
        expected = [t.name for t in self.tensors]
        if list(weights) != expected:
            missing = [n for n in expected if n not in weights]
            extra = [n for n in weights if n not in expected]
            raise InvalidParameterError(
                f"{who}: weights differ in names: missing {missing[:5]}, unexpected {extra[:5]}"
            )
        for tensor in self.tensors:
            shape = tuple(np.shape(weights[tensor.name]))
            if shape != tensor.shape:
                raise InvalidParameterError(f"{who}: weight {tensor.name!r} has shape {shape}, expected {tensor.shape}")

    def to_dict(self) -> list[dict]:
        """JSON form: [{name, shape, dtype}]."""
        return [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in self.tensors]

    @classmethod
    def from_dict(cls, items: list[dict]) -> WeightLayout:
        """Inverse of :meth:`to_dict`."""
        return cls([TensorSpec(str(i["name"]), tuple(int(d) for d in i["shape"]), str(i["dtype"])) for i in items])

    def digest(self) -> str:
        """SHA-256 of the JSON form (parties compare it before the first round)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def difference(self, other: WeightLayout) -> str:
        """A sentence naming the first tensor where ``other`` differs (empty when equal)."""
        mine = {t.name: t for t in self.tensors}
        theirs = {t.name: t for t in other.tensors}
        for name in list(mine) + [n for n in theirs if n not in mine]:
            a, b = mine.get(name), theirs.get(name)
            if a is None:
                return f"weight {name!r} is not in our model"
            if b is None:
                return f"weight {name!r} is missing"
            if a.shape != b.shape:
                return f"weight {name!r} has shape {b.shape}, ours {a.shape}"
            if a.dtype != b.dtype:
                return f"weight {name!r} has dtype {b.dtype}, ours {a.dtype}"
        if [t.name for t in self.tensors] != [t.name for t in other.tensors]:
            return "weights are in another order"
        return ""


def glorot_like(shape: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32") -> np.ndarray:
    """Glorot-uniform values for a kernel of ``shape`` (Keras's fan convention), drawn with numpy.

    Dense ``(in, out)``: fan_in = in, fan_out = out. Convolutions ``(*kernel, in, out)``: both fans
    times the receptive field. 1-D tensors get fan_in = fan_out = size.
    """
    if len(shape) >= 2:
        receptive = math.prod(shape[:-2]) if len(shape) > 2 else 1
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
    else:
        fan_in = fan_out = max(1, math.prod(shape))
    limit = math.sqrt(6.0 / max(1, fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(dtype)


def check_metrics_names(metrics: list[str]) -> None:
    """Refuse metric names no model reports."""
    for name in metrics:
        if name not in ("loss", "accuracy", "auc"):
            raise InvalidParameterError(f"metrics: {name!r} is not one of loss, accuracy, auc")


def classification_metrics(scores: np.ndarray, y: np.ndarray, metrics: list[str], loss: float) -> dict[str, float]:
    """loss, accuracy and (binary) AUC from class scores ``(n,)`` (binary decision values) or ``(n, k)``."""
    out = {"loss": float(loss)}
    y = np.asarray(y)
    if "accuracy" in metrics and len(y):
        predicted = (scores > 0).astype(y.dtype) if scores.ndim == 1 else np.argmax(scores, axis=1)
        out["accuracy"] = float(np.mean(predicted == y))
    if "auc" in metrics and len(np.unique(y)) == 2:
        from confide.ml.metrics import roc_auc

        out["auc"] = roc_auc(y, scores if scores.ndim == 1 else scores[:, -1])
    return out
