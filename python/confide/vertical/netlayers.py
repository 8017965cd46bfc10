"""The bottom and top models of Hetero NN: small dense networks in numpy, or a framework's.

A sub-network (``guest_bottom``, ``host_bottom``, ``top``) is described in one of three forms:

* Keras 3 ``Dense``/``Activation`` layers (the same form as a job's ``model.network.layers``)
  or their short form, run here in numpy (:class:`DenseNetwork`)::

      [{units: 16, activation: relu}, {units: 8, activation: tanh}]
      [{class_name: Dense, config: {units: 16, activation: relu}}]

* a Keras 3 network description with any of the layers of :mod:`confide.ml.keras_spec`, built
  by the party with Keras on the PyTorch backend (``backend: torch``)::

      {backend: torch, layers: [{class_name: Dense, config: {units: 16}},
                                {class_name: BatchNormalization}, {class_name: Activation,
                                config: {activation: relu}}, {class_name: Dropout, config: {rate: 0.1}}]}

* the party's own PyTorch code: ``{torch: "file.py:factory", options: {...}}``, a callable
  ``factory(input_dim, outputs=None, **options) -> torch.nn.Module`` (``outputs``: the width
  the top model must end with; None for a bottom model).

Only what split learning needs from a framework is used: forward with a cache, backward from a
given output gradient that returns the gradient of the input (the cut layer), and the
parameters as arrays for Adam (:mod:`confide.vertical.nettorch` for the framework forms). The
numpy networks' weights are Glorot-uniform, biases zero, so the plaintext reference and the
secure protocol start from the same numbers for the same seed; framework networks are built
under a seed too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from confide.ml.netspec import ACTIVATIONS, MAX_UNITS, NetSpec, parse_layers, parse_network

__all__ = [
    "ACTIVATIONS",
    "MAX_UNITS",
    "Adam",
    "DenseNetwork",
    "NetSpec",
    "activation_grad",
    "build_network",
    "forward_activation",
    "network_from_dict",
    "parse_layers",
    "parse_network",
]


def build_network(
    spec: NetSpec, input_dim: int, rng: np.random.Generator, *, seed: int, outputs: int | None = None, who: str
):
    """The network of ``spec`` on ``input_dim`` inputs.

    ``outputs``: a top model's output width (numpy: a linear layer of that width is appended;
    frameworks: the network must end with it). Numpy networks draw from ``rng``; framework
    networks are initialised under ``seed``.
    """
    if spec.kind == "dense":
        layers = [*spec.layers, *([(outputs, "linear")] if outputs else [])]
        return DenseNetwork(input_dim, layers, rng)
    from confide.vertical.nettorch import build

    return build(spec, input_dim, seed=seed, outputs=outputs, who=who)


def network_from_dict(data: dict):
    """A network from any network's ``to_dict`` mapping."""
    if data.get("kind") in ("torch", "keras"):
        from confide.vertical.nettorch import from_dict

        return from_dict(data)
    return DenseNetwork.from_dict(data)


def forward_activation(name: str, z: np.ndarray) -> np.ndarray:
    """``name`` applied to pre-activations ``z``."""
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "tanh":
        return np.tanh(z)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    return z


def activation_grad(name: str, z: np.ndarray, a: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """Gradient through ``name`` at ``z`` (output ``a``) of the gradient ``grad`` of its output."""
    if name == "relu":
        return grad * (z > 0)
    if name == "tanh":
        return grad * (1.0 - a * a)
    if name == "sigmoid":
        return grad * a * (1.0 - a)
    return grad


def glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=(fan_in, fan_out))


@dataclass
class Adam:
    """Adam on a list of arrays (updated in place)."""

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: list = field(default_factory=list)
    v: list = field(default_factory=list)

    def step(self, params: list[np.ndarray], grads: list[np.ndarray]) -> None:
        """One Adam step on ``params`` (in place)."""
        if not self.m:
            self.m = [np.zeros_like(p) for p in params]
            self.v = [np.zeros_like(p) for p in params]
        self.t += 1
        c1 = 1.0 - self.beta1**self.t
        c2 = 1.0 - self.beta2**self.t
        for p, g, m, v in zip(params, grads, self.m, self.v, strict=True):
            m *= self.beta1
            m += (1.0 - self.beta1) * g
            v *= self.beta2
            v += (1.0 - self.beta2) * g * g
            p -= self.learning_rate * (m / c1) / (np.sqrt(v / c2) + self.eps)


class DenseNetwork:
    """A stack of Dense layers; ``forward`` caches what ``backward`` needs."""

    def __init__(self, input_dim: int, layers: list[tuple[int, str]], rng: np.random.Generator) -> None:
        self.layers = list(layers)
        self.input_dim = int(input_dim)
        self.weights: list[np.ndarray] = []
        self.biases: list[np.ndarray] = []
        fan_in = self.input_dim
        for units, _ in self.layers:
            self.weights.append(glorot(rng, fan_in, units))
            self.biases.append(np.zeros(units))
            fan_in = units
        self._cache: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.input_mean: np.ndarray | None = None
        self.input_std: np.ndarray | None = None

    def standardize_inputs(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Feed raw columns: the first layer computes on ``(x - mean) / std`` without a copy.

        ``(x - m)/s @ W = x @ (W/s) - (m/s) @ W``, and the weight gradient gets the same
        correction, so a wide float32 table is multiplied in float32 and never standardized
        (or converted to float64) as a whole.
        """
        self.input_mean = np.asarray(mean, dtype=np.float64)
        self.input_std = np.asarray(std, dtype=np.float64)

    @property
    def output_dim(self) -> int:
        """Width of the last layer (the input width when there are no layers)."""
        return self.layers[-1][0] if self.layers else self.input_dim

    def params(self) -> list[np.ndarray]:
        """Weights then biases, in layer order (the order of :meth:`backward`'s gradients)."""
        return [*self.weights, *self.biases]

    def forward(self, x: np.ndarray, keep: bool = True) -> np.ndarray:
        """The output for rows ``x``; ``keep`` caches what :meth:`backward` needs."""
        cache = []
        a = x
        scaled = self.input_mean is not None
        if scaled and not self.layers:
            return (np.asarray(x, dtype=np.float64) - self.input_mean) / self.input_std
        for i, ((_, activation), w, b) in enumerate(zip(self.layers, self.weights, self.biases, strict=True)):
            if i == 0 and scaled:
                effective = w / self.input_std[:, None]
                z = (a @ effective.astype(a.dtype, copy=False)).astype(np.float64) + (
                    b - (self.input_mean / self.input_std) @ w
                )
            else:
                z = a @ w + b
            out = forward_activation(activation, z)
            cache.append((a, z, out))
            a = out
        if keep:
            self._cache = cache
        return a

    def backward(self, grad: np.ndarray, input_grad: bool = True) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Gradients of (weights..., biases...) and of the input (``None`` unless ``input_grad``)."""
        gw: list[np.ndarray] = [np.empty(0)] * len(self.layers)
        gb: list[np.ndarray] = [np.empty(0)] * len(self.layers)
        for i in range(len(self.layers) - 1, -1, -1):
            a_in, z, out = self._cache[i]
            g = activation_grad(self.layers[i][1], z, out, grad)
            gb[i] = g.sum(axis=0)
            if i == 0 and self.input_mean is not None:
                raw = (a_in.T @ g.astype(a_in.dtype, copy=False)).astype(np.float64)
                gw[i] = (raw - np.outer(self.input_mean, gb[i])) / self.input_std[:, None]
            else:
                gw[i] = a_in.T @ g
            if i > 0 or input_grad:
                grad = g @ self.weights[i].T
        if input_grad and self.input_mean is not None and self.layers:
            grad = grad / self.input_std
        return [*gw, *gb], (grad if input_grad else None)

    def to_dict(self) -> dict:
        """Layers and weights as a wire-encodable mapping."""
        return {
            "input_dim": self.input_dim,
            "units": np.asarray([u for u, _ in self.layers], dtype=np.int64),
            "activations": [a for _, a in self.layers],
            "weights": [w.copy() for w in self.weights],
            "biases": [b.copy() for b in self.biases],
            **({"input_mean": self.input_mean, "input_std": self.input_std} if self.input_mean is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> DenseNetwork:
        """A network from :meth:`to_dict`'s mapping."""
        layers = [(int(u), str(a)) for u, a in zip(data["units"], data["activations"], strict=True)]
        net = cls(int(data["input_dim"]), layers, np.random.default_rng(0))
        net.weights = [np.asarray(w, dtype=np.float64) for w in data["weights"]]
        net.biases = [np.asarray(b, dtype=np.float64) for b in data["biases"]]
        if "input_mean" in data:
            net.standardize_inputs(data["input_mean"], data["input_std"])
        return net
