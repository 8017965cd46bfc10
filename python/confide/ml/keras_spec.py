"""Keras 3 network descriptions in a job spec, validated where Keras need not be installed.

The controller validates a job at submit time and may not have Keras; parties build the
network on their own backend (:mod:`confide.ml.keras`). The description is Jupiter's
programming abstraction: the developer says *what* network, each hospital runs it on the
framework it has::

    network:
      input_shape: [8, 8, 1]            # optional: default, the shape of one example
      layers:
        - {class_name: Conv2D, config: {filters: 16, kernel_size: 3, activation: relu}}
        - {class_name: MaxPooling2D}
        - {class_name: Flatten}
        - {class_name: Dense, config: {units: 10, activation: softmax}}
      optimizer: {class_name: Adam}      # learning rate: model.learning_rate unless given here
      loss: sparse_categorical_crossentropy
      metrics: [accuracy]

``config`` holds the layer's own Keras arguments (``keras.layers.<class_name>(**config)``);
Keras checks them when a party builds the network, and a party that cannot build it fails
the job before round 1 with the party's name and Keras's message.
"""

from __future__ import annotations

import difflib
from typing import Any

from confide.errors import InvalidParameterError

__all__ = ["LAYERS", "LOSSES", "OPTIMIZERS", "validate_network"]

#: Layer classes a network may use (keras.layers names).
LAYERS = frozenset(
    """Dense EinsumDense Conv1D Conv2D Conv3D SeparableConv2D DepthwiseConv2D Conv2DTranspose
    MaxPooling1D MaxPooling2D MaxPooling3D AveragePooling1D AveragePooling2D GlobalAveragePooling1D
    GlobalAveragePooling2D GlobalMaxPooling1D GlobalMaxPooling2D Flatten Reshape Permute RepeatVector
    Dropout SpatialDropout1D SpatialDropout2D GaussianNoise GaussianDropout AlphaDropout
    BatchNormalization LayerNormalization GroupNormalization UnitNormalization
    Activation ReLU LeakyReLU ELU PReLU Softmax ZeroPadding1D ZeroPadding2D Cropping1D Cropping2D
    UpSampling1D UpSampling2D Embedding LSTM GRU SimpleRNN Rescaling""".split()
)
#: Optimizer classes (keras.optimizers names).
OPTIMIZERS = frozenset("SGD Adam AdamW RMSprop Adagrad Adadelta Adamax Nadam Lion".split())
#: Losses by their Keras names.
LOSSES = frozenset(
    """sparse_categorical_crossentropy categorical_crossentropy binary_crossentropy
    mean_squared_error mean_absolute_error huber mse mae""".split()
)
METRICS = frozenset("accuracy sparse_categorical_accuracy categorical_accuracy binary_accuracy auc mae mse".split())
_KEYS = frozenset({"input_shape", "layers", "optimizer", "loss", "metrics", "name"})
MAX_LAYERS = 1000


def _unknown(where: str, value: Any, known: frozenset[str], what: str) -> InvalidParameterError:
    close = difflib.get_close_matches(str(value), sorted(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InvalidParameterError(f"{where}: {value!r} is not a {what} this platform builds{hint}")


def validate_network(network: Any, *, where: str = "model.network") -> dict:
    """Check a network description; returns it. Errors name the field (``model.network.layers[2]``)."""
    if not isinstance(network, dict):
        raise InvalidParameterError(f"{where} must be a mapping, got {type(network).__name__}")
    extra = sorted(set(network) - _KEYS)
    if extra:
        raise InvalidParameterError(f"{where}: unknown fields {extra} (allowed: {sorted(_KEYS)})")
    shape = network.get("input_shape")
    if shape is not None and (
        not isinstance(shape, list | tuple)
        or not shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 1_000_000 for d in shape)
    ):
        raise InvalidParameterError(f"{where}.input_shape must be a list of positive integers, got {shape!r}")
    layers = network.get("layers")
    if not isinstance(layers, list) or not 1 <= len(layers) <= MAX_LAYERS:
        raise InvalidParameterError(f"{where}.layers must be a list of 1 to {MAX_LAYERS} layers, got {layers!r}")
    for i, layer in enumerate(layers):
        here = f"{where}.layers[{i}]"
        if not isinstance(layer, dict):
            raise InvalidParameterError(f"{here} must be a mapping with class_name and config, got {layer!r}")
        extra = sorted(set(layer) - {"class_name", "config"})
        if extra:
            raise InvalidParameterError(f"{here}: unknown fields {extra} (allowed: class_name, config)")
        if layer.get("class_name") not in LAYERS:
            raise _unknown(f"{here}.class_name", layer.get("class_name"), LAYERS, "Keras layer")
        config = layer.get("config", {})
        if not isinstance(config, dict):
            raise InvalidParameterError(f"{here}.config must be a mapping of the layer's arguments, got {config!r}")
    optimizer = network.get("optimizer", "Adam")
    name = optimizer.get("class_name") if isinstance(optimizer, dict) else optimizer
    if name not in OPTIMIZERS:
        raise _unknown(f"{where}.optimizer", name, OPTIMIZERS, "Keras optimizer")
    if isinstance(optimizer, dict):
        extra = sorted(set(optimizer) - {"class_name", "config"})
        if extra or not isinstance(optimizer.get("config", {}), dict):
            raise InvalidParameterError(
                f"{where}.optimizer must be a name or {{class_name, config}}, got {optimizer!r}"
            )
    loss = network.get("loss", "sparse_categorical_crossentropy")
    if loss not in LOSSES:
        raise _unknown(f"{where}.loss", loss, LOSSES, "Keras loss")
    metrics = network.get("metrics", [])
    if not isinstance(metrics, list):
        raise InvalidParameterError(f"{where}.metrics must be a list, got {metrics!r}")
    for i, metric in enumerate(metrics):
        if metric not in METRICS:
            raise _unknown(f"{where}.metrics[{i}]", metric, METRICS, "Keras metric")
    return network
