"""How a small network is described: Hetero NN's bottom and top models, parsed and checked.

Three forms (:mod:`confide.vertical.netlayers` builds and runs them):

* Keras 3 ``Dense``/``Activation`` layers or their short form ``[{units: 16, activation: relu}]``,
  run in numpy;
* a Keras 3 network description ``{backend: torch, layers: [...]}`` with any layer of
  :mod:`confide.ml.keras_spec`;
* the party's own PyTorch code, ``{torch: "file.py:factory", options: {...}}``.

This module only parses and checks, so the job specification (:mod:`confide.spec`) validates a
Hetero NN job with the same rules the protocol applies, without importing the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confide.errors import InvalidParameterError

__all__ = ["ACTIVATIONS", "MAX_BATCH_SIZE", "MAX_UNITS", "NetSpec", "parse_layers", "parse_network"]

#: Hidden-layer activations (the head's sigmoid/softmax belongs to the loss).
ACTIVATIONS = ("linear", "relu", "tanh", "sigmoid")
MAX_UNITS = 65536
#: The largest Hetero NN mini-batch (rows per exchange between guest and hosts).
MAX_BATCH_SIZE = 8192


def parse_layers(spec: Any, where: str) -> list[tuple[int, str]]:
    """``[(units, activation), ...]`` from a short or Keras-form layer list."""
    if spec is None:
        return []
    if isinstance(spec, dict) and "layers" in spec:
        spec = spec["layers"]
    if not isinstance(spec, (list, tuple)):
        raise InvalidParameterError(f"{where} must be a list of Dense layers, got {type(spec).__name__}")
    layers: list[tuple[int, str]] = []
    for i, layer in enumerate(spec):
        at = f"{where}[{i}]"
        if not isinstance(layer, dict):
            raise InvalidParameterError(f"{at} must be a mapping, got {type(layer).__name__}")
        if "class_name" in layer:
            name = layer["class_name"]
            config = layer.get("config") or {}
            if not isinstance(config, dict):
                raise InvalidParameterError(f"{at}.config must be a mapping")
            if name == "Activation":
                activation = config.get("activation")
                if not layers:
                    raise InvalidParameterError(f"{at}: an Activation layer must follow a Dense layer")
                if layers[-1][1] != "linear":
                    raise InvalidParameterError(f"{at}: the Dense layer before it already has an activation")
                layers[-1] = (layers[-1][0], _activation(activation, f"{at}.config.activation"))
                continue
            if name != "Dense":
                raise InvalidParameterError(
                    f"{at}.class_name {name!r}: a numpy network takes Dense and Activation layers; for other "
                    "Keras layers write {backend: torch, layers: [...]}, for own code {torch: 'file.py:factory'}"
                )
            extra = set(config) - {"units", "activation", "use_bias", "name"}
            if extra:
                raise InvalidParameterError(f"{at}.config: unsupported Dense arguments {sorted(extra)}")
            if config.get("use_bias", True) is not True:
                raise InvalidParameterError(f"{at}.config.use_bias: only true is supported")
        else:
            config = layer
            extra = set(config) - {"units", "activation"}
            if extra:
                raise InvalidParameterError(f"{at}: unknown keys {sorted(extra)} (expected units, activation)")
        units = config.get("units")
        if not isinstance(units, int) or isinstance(units, bool) or not 1 <= units <= MAX_UNITS:
            raise InvalidParameterError(f"{at}.units must be an integer in 1..{MAX_UNITS}, got {units!r}")
        layers.append((units, _activation(config.get("activation", "linear"), f"{at}.activation")))
    return layers


@dataclass(frozen=True)
class NetSpec:
    """A parsed sub-network description (:func:`parse_network`)."""

    #: ``dense`` (numpy), ``keras`` (Keras 3 on the PyTorch backend) or ``torch`` (own code).
    kind: str
    #: dense: ``((units, activation), ...)``.
    layers: tuple = ()
    #: keras: the validated network description (``{"layers": [...]}``).
    network: dict | None = None
    #: torch: ``file.py:factory`` or ``package.module:factory``, and its keyword arguments.
    entry: str | None = None
    options: dict = field(default_factory=dict)

    def shared(self) -> Any:
        """The form every party compares (the guest and hosts must agree on the host bottom)."""
        if self.kind == "dense":
            return [[u, a] for u, a in self.layers]
        if self.kind == "keras":
            return {"backend": "torch", "layers": self.network["layers"] if self.network else []}
        return {"torch": self.entry, "options": self.options}


def parse_network(spec: Any, where: str) -> NetSpec:
    """A sub-network description in any of the module's three forms; errors name ``where``."""
    if spec is None or isinstance(spec, (list, tuple)):
        return NetSpec("dense", tuple(parse_layers(list(spec or ()), where)))
    if not isinstance(spec, dict):
        raise InvalidParameterError(
            f"{where} must be a list of Dense layers, a Keras network {{backend: torch, layers}} or "
            f"{{torch: 'file.py:factory'}}, got {type(spec).__name__}"
        )
    if "torch" in spec:
        extra = sorted(set(spec) - {"torch", "options"})
        if extra:
            raise InvalidParameterError(f"{where}: unknown keys {extra} next to torch (allowed: torch, options)")
        entry, options = spec["torch"], spec.get("options") or {}
        location, _, attribute = entry.rpartition(":") if isinstance(entry, str) else ("", "", "")
        if not location or not attribute.replace(".", "").replace("_", "").isalnum():
            raise InvalidParameterError(
                f"{where}.torch must name a factory as 'file.py:name' or 'package.module:name', got {entry!r}"
            )
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise InvalidParameterError(f"{where}.options must be a mapping of keyword arguments, got {options!r}")
        return NetSpec("torch", entry=entry, options=dict(options))
    if "layers" not in spec:
        raise InvalidParameterError(f"{where} must hold 'layers' (a Keras network) or 'torch' (a factory)")
    backend = spec.get("backend", "numpy")
    if backend == "numpy":
        extra = sorted(set(spec) - {"layers", "backend"})
        if extra:
            raise InvalidParameterError(f"{where}: unknown keys {extra} (allowed: layers, backend)")
        return NetSpec("dense", tuple(parse_layers(spec["layers"], f"{where}.layers")))
    if backend != "torch":
        raise InvalidParameterError(
            f"{where}.backend {backend!r}: Hetero NN sub-networks run in numpy (Dense/Activation) or on "
            "Keras 3's torch backend (any Keras layer); jax and tensorflow are not supported here"
        )
    from confide.ml.keras_spec import validate_network

    extra = sorted(set(spec) - {"layers", "backend"})
    if extra:
        raise InvalidParameterError(f"{where}: unknown keys {extra} (allowed: layers, backend)")
    network = validate_network({"layers": spec["layers"]}, where=where)
    return NetSpec("keras", network={"layers": [dict(layer) for layer in network["layers"]]})


def _activation(name: Any, where: str) -> str:
    name = "linear" if name is None else name
    if name not in ACTIVATIONS:
        raise InvalidParameterError(f"{where} {name!r} is not one of {list(ACTIVATIONS)}")
    return str(name)
