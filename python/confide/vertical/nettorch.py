"""Hetero NN sub-networks on a framework: the party's own PyTorch module, or Keras 3 on torch.

:class:`TorchNetwork` gives a ``torch.nn.Module`` the interface the Hetero NN protocol drives
(:class:`confide.vertical.netlayers.DenseNetwork`'s): ``forward`` on a batch keeping the graph,
``backward`` from the gradient of the output (what arrives at the cut layer), returning the
parameters' gradients and the input's, and ``params()`` as numpy arrays for Adam. Those arrays
share memory with the module's parameters, so the protocol's optimizer steps the module
itself. ``forward(..., keep=False)`` runs in eval mode without a graph (prediction), so
Dropout and BatchNormalization behave as in PyTorch. Values cross to numpy as float64 (the
protocol quantizes activations to fixed point); the module computes in float32.

A Keras 3 network description on the torch backend is a ``torch.nn.Module`` too
(:class:`KerasNetwork`): Keras builds it, autograd differentiates it, and its weights travel in
Keras's order. Own code is imported at the party (``{torch: "file.py:factory"}``), as
``model.entry`` of the model seam is: a party's code runs with the party's privileges, and a
saved model needs that code to be loaded again.

Initial weights come from the framework's initializers under a seed drawn from the job seed
(``torch.manual_seed`` inside a forked RNG, so the caller's global state is untouched), so the
plaintext reference and the secure run build the same network.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.netspec import NetSpec
from confide.ml.torch_adapter import import_torch as _torch

__all__ = ["KerasNetwork", "TorchNetwork", "build", "from_dict"]


class TorchNetwork:
    """A ``torch.nn.Module`` as a Hetero NN bottom or top model."""

    kind = "torch"

    def __init__(self, module, spec: NetSpec, input_dim: int, who: str) -> None:
        torch = _torch()
        if not isinstance(module, torch.nn.Module):
            raise InvalidParameterError(f"{who}: {spec.entry} returned {type(module).__name__}, not a torch.nn.Module")
        self.module, self.spec, self.input_dim, self.who = module, spec, int(input_dim), who
        #: A top model's required output width (None for a bottom model).
        self.outputs: int | None = None
        self.input_mean: np.ndarray | None = None
        self.input_std: np.ndarray | None = None
        self._tensors = self._trainable()
        self._cache: tuple | None = None
        module.eval()
        try:
            with torch.no_grad():
                probe = self._call(torch.zeros((2, self.input_dim), dtype=torch.float32), training=False)
        except Exception as error:  # noqa: BLE001 - the user's module failed on its input: say so
            raise InvalidParameterError(
                f"{who}: the network cannot run on {self.input_dim} input columns: {type(error).__name__}: {error}"
            ) from None
        if probe.ndim != 2 or probe.shape[0] != 2:
            raise InvalidParameterError(
                f"{who}: the network must map (rows, {self.input_dim}) to (rows, units), got shape {tuple(probe.shape)}"
            )
        self.output_dim = int(probe.shape[1])

    def _trainable(self) -> list:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _call(self, t, training: bool):
        return self.module(t)

    def standardize_inputs(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Feed raw columns: the module sees ``(x - mean) / std``."""
        self.input_mean = np.asarray(mean, dtype=np.float64)
        self.input_std = np.asarray(std, dtype=np.float64)

    def params(self) -> list[np.ndarray]:
        """The trainable parameters as numpy arrays sharing the module's memory."""
        return [p.detach().numpy() for p in self._tensors]

    def _input(self, x: np.ndarray):
        x = np.asarray(x)
        if self.input_mean is not None:
            x = (x - self.input_mean) / self.input_std
        return _torch().from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    def forward(self, x: np.ndarray, keep: bool = True) -> np.ndarray:
        """The output for rows ``x``; ``keep`` trains (train mode, graph kept for :meth:`backward`)."""
        torch = _torch()
        t = self._input(x)
        if not keep:
            self.module.eval()
            with torch.no_grad():
                return self._call(t, training=False).numpy().astype(np.float64)
        self.module.train()
        t.requires_grad_(True)
        out = self._call(t, training=True)
        self._cache = (t, out)
        return out.detach().numpy().astype(np.float64)

    def backward(self, grad: np.ndarray, input_grad: bool = True) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Gradients of the parameters (``params()`` order) and of the input, from d(loss)/d(output)."""
        torch = _torch()
        if self._cache is None:
            raise InvalidParameterError(f"{self.who}: backward before a forward that kept its graph")
        t, out = self._cache
        self._cache = None
        for p in self._tensors:
            p.grad = None
        out.backward(torch.from_numpy(np.ascontiguousarray(grad, dtype=np.float32)))
        grads = [
            p.grad.numpy().copy() if p.grad is not None else np.zeros(tuple(p.shape), dtype=np.float32)
            for p in self._tensors
        ]
        g_in = None
        if input_grad:
            g_in = t.grad.numpy().astype(np.float64)
            if self.input_std is not None:
                g_in = g_in / self.input_std
        return grads, g_in

    def _state(self) -> dict[str, np.ndarray]:
        return {name: value.detach().numpy().copy() for name, value in self.module.state_dict().items()}

    def _load_state(self, state: dict) -> None:
        torch = _torch()
        own = self.module.state_dict()
        if set(state) != set(own):
            raise InvalidParameterError(
                f"{self.who}: the saved network's tensors {sorted(state)[:6]} "
                f"do not match the module's {sorted(own)[:6]}"
            )
        self.module.load_state_dict({k: torch.from_numpy(np.asarray(v).copy()) for k, v in state.items()})

    def to_dict(self) -> dict:
        """The description, input width, weights and input scaling as a wire-encodable mapping."""
        out = {
            "kind": self.kind,
            "spec": self.spec.shared(),
            "input_dim": self.input_dim,
            "outputs": self.outputs or 0,
            "state": self._state(),
        }
        if self.input_mean is not None:
            out.update(input_mean=self.input_mean, input_std=self.input_std)
        return out


class KerasNetwork(TorchNetwork):
    """A Keras 3 network description built on the PyTorch backend (a ``torch.nn.Module``)."""

    kind = "keras"

    def _trainable(self) -> list:
        return [v.value for v in self.module.trainable_variables]

    def _call(self, t, training: bool):
        # Keras layers (Dropout, BatchNormalization) read the training flag, not torch's mode.
        return self.module(t, training=training)

    def _state(self) -> dict[str, np.ndarray]:
        return {f"{i:04d}": np.asarray(w).copy() for i, w in enumerate(self.module.get_weights())}

    def _load_state(self, state: dict) -> None:
        weights = [np.asarray(state[k]) for k in sorted(state)]
        try:
            self.module.set_weights(weights)
        except ValueError as error:
            raise InvalidParameterError(f"{self.who}: the saved weights do not fit the network: {error}") from None


def _with_seed(seed: int, make):
    torch = _torch()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def _keras_module(network: dict, input_dim: int, seed: int, who: str):
    from confide.ml.base import glorot_like
    from confide.ml.keras_model import build_layers, import_keras

    keras = import_keras("torch", who=who)
    layers = build_layers(keras, network, who=who, where="network")
    try:
        model = keras.Sequential([keras.Input(shape=(input_dim,)), *layers])
    except (TypeError, ValueError) as error:
        raise InvalidParameterError(f"{who}: the Keras network cannot be built: {error}") from None
    # As the model seam's Keras networks: random weights drawn with numpy from the seed.
    rng = np.random.default_rng([seed, 0x6B657261])
    for variable in model.weights:
        value = np.asarray(variable.numpy())
        if value.size and not np.all(value == value.flat[0]):
            variable.assign(glorot_like(value.shape, rng, dtype=value.dtype.name))
    return model


def build(spec: NetSpec, input_dim: int, *, seed: int, outputs: int | None, who: str) -> TorchNetwork:
    """The framework network of ``spec`` (``outputs``: the width a top model must end with)."""
    if spec.kind == "keras":
        module = _keras_module(spec.network or {}, input_dim, seed, who)
        net: TorchNetwork = KerasNetwork(module, spec, input_dim, who)
    else:
        from confide.ml.custom import load_entry

        factory = load_entry(spec.entry or "", who=who, field="torch")
        if not callable(factory):
            raise InvalidParameterError(f"{who}: {spec.entry} is not callable")
        extra = {"outputs": outputs} if outputs is not None else {}

        def make() -> Any:
            try:
                return factory(input_dim, **extra, **spec.options)
            except TypeError as error:
                raise InvalidParameterError(
                    f"{who}: {spec.entry}(input_dim{', outputs' if outputs else ''}, **options) failed: {error}"
                ) from None

        net = TorchNetwork(_with_seed(seed, make), spec, input_dim, who)
    net.outputs = outputs
    if outputs is not None and net.output_dim != outputs:
        raise InvalidParameterError(
            f"{who}: the top network ends with {net.output_dim} units; this objective needs {outputs} "
            "(linear logits: the head applies the sigmoid or softmax)"
        )
    return net


def from_dict(data: dict) -> TorchNetwork:
    """A framework network from :meth:`TorchNetwork.to_dict`'s mapping (imports the party's code)."""
    from confide.ml.netspec import parse_network

    spec = parse_network(data["spec"], "saved network")
    outputs = int(data.get("outputs") or 0) or None
    net = build(spec, int(data["input_dim"]), seed=0, outputs=outputs, who="saved network")
    net._load_state(dict(data["state"]))
    if "input_mean" in data:
        net.standardize_inputs(data["input_mean"], data["input_std"])
    return net
