"""``model.algorithm: keras``: a Keras 3 network from the job spec, on the backend each party has.

Keras 3 runs one network description on JAX, PyTorch or TensorFlow. A party picks its backend
(``confide party --keras-backend``, else ``model.backends[party]``, else ``model.backend``);
Keras reads ``KERAS_BACKEND`` once per process, and each party is its own process, so one
federation can mix backends. Weights travel as named numpy arrays (``network/<layer>/<var>``,
layers named ``<class>_<index>`` so every backend names them alike).

What keeps mixed backends in step:

* Initial weights are drawn with numpy from the job seed (:func:`confide.ml.base.glorot_like`
  for every variable Keras initialised randomly; constant ones — zero biases, unit scales —
  are kept), so a JAX party and a PyTorch party start from the same model.
* The batch order of a round comes from numpy (the round's seed); Keras gets pre-shuffled
  rows with ``shuffle=False``.
* The global model is set from the same aggregate at every party, so after each round the
  parties hold the same weights to float32 rounding of the backend's own storage.

Local optimizer state (Adam's moments) persists across rounds at each party, as in
BatchCrypt's setting, and travels with the party's checkpoints (``state``/``load_state``), so a
resumed job continues exactly. FedProx's proximal pull ``w <- w - min(1, lr mu) (w - w_global)``
runs once after every local epoch, not after every step: Keras's compiled train step has no
per-batch hook that all three backends honour. docs/models.md says so.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Any

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.base import FitConfig, FitResult, Weights, glorot_like
from confide.ml.keras_spec import validate_network

__all__ = ["KerasModel", "build", "build_layers", "import_keras"]


#: Optional packages Keras imports at its own import when they are installed, for features no
#: party uses: scikit-learn for its estimator wrappers (keras.wrappers), matplotlib for its
#: image gallery (keras.visualization). They took 1.7 s of the 4.3 s of CPU a Keras-on-JAX party
#: spent importing Keras; a party imports neither otherwise (docs/architecture.md). Keras treats
#: them as absent, so a model entry that wants those two Keras features imports Keras itself first.
KERAS_SKIPS = ("sklearn", "matplotlib")


@contextlib.contextmanager
def _unimportable(names: tuple[str, ...]):
    """Importing any of ``names`` not yet imported raises ImportError within the block.

    After it they import normally.
    """
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment] # the import system's "not importable"
    try:
        yield
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def import_keras(backend: str, *, who: str = "this party"):
    """Import Keras on ``backend`` (once per process); a clear error when it cannot run here."""
    loaded = sys.modules.get("keras")
    if loaded is not None:
        current = loaded.backend.backend()
        if current != backend:
            raise InvalidParameterError(
                f"{who}: Keras is already loaded on backend {current!r} in this process, cannot switch to {backend!r}"
            )
        return loaded
    module = {"jax": "jax", "torch": "torch", "tensorflow": "tensorflow"}[backend]
    try:
        __import__(module)
    except ImportError as error:
        raise InvalidParameterError(
            f"{who}: model backend {backend!r} is not installed here ({error}); install it "
            f"(pip install 'confide[{backend}]') or choose another with model.backends / --keras-backend"
        ) from None
    os.environ["KERAS_BACKEND"] = backend
    try:
        with _unimportable(KERAS_SKIPS):
            import keras
    except ImportError as error:
        raise InvalidParameterError(
            f"{who}: Keras 3 is not installed here ({error}); pip install 'confide[keras]'"
        ) from None
    if keras.backend.backend() != backend:
        raise InvalidParameterError(f"{who}: Keras chose backend {keras.backend.backend()!r}, not {backend!r}")
    return keras


def build_layers(keras, network: dict, *, who: str, where: str) -> list:
    """The layer objects of a validated network description; a layer Keras refuses is named."""
    layers = []
    for i, layer in enumerate(network["layers"]):
        config = dict(layer.get("config") or {})
        config.setdefault("name", f"{layer['class_name'].lower()}_{i}")
        try:
            layers.append(getattr(keras.layers, layer["class_name"])(**config))
        except (TypeError, ValueError) as error:
            raise InvalidParameterError(
                f"{who}: {where}.layers[{i}] ({layer['class_name']}) cannot be built: {error}"
            ) from None
    return layers


class KerasModel:
    """A Keras 3 network behind :class:`confide.ml.base.FederatedModel`."""

    def __init__(
        self,
        network: dict,
        *,
        backend: str,
        learning_rate: float,
        local_epochs: int,
        batch_size: int,
        seed: int,
        who: str = "this party",
    ) -> None:
        self.network = validate_network(network)
        self.backend = backend
        self.learning_rate = learning_rate
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.seed = seed
        self.who = who
        self.keras = import_keras(backend, who=who)
        self.model = None
        self._binary = False

    # ------------------------------------------------------------------ building

    def build(self, example_shape: tuple[int, ...], classes: int) -> None:
        """Build and compile the network, then draw its random weights with numpy from the job seed."""
        keras = self.keras
        shape = tuple(self.network.get("input_shape") or example_shape)
        if tuple(shape) != tuple(example_shape):
            raise InvalidParameterError(
                f"{self.who}: model.network.input_shape is {list(shape)} but the data's examples have shape "
                f"{list(example_shape)}"
            )
        layers = build_layers(keras, self.network, who=self.who, where="model.network")
        try:
            model = keras.Sequential([keras.Input(shape=shape), *layers], name="network")
            model.compile(
                optimizer=self._optimizer(),
                loss=self.network.get("loss", "sparse_categorical_crossentropy"),
                metrics=list(self.network.get("metrics", [])),
            )
        except (TypeError, ValueError) as error:
            raise InvalidParameterError(f"{self.who}: model.network cannot be built: {error}") from None
        output = model.output_shape[-1]
        if classes and output not in (classes, 1):
            raise InvalidParameterError(
                f"{self.who}: the network's last layer has {output} outputs, the data has {classes} classes"
            )
        self._binary = output == 1
        self.model = model
        rng = np.random.default_rng([self.seed, 0x6B657261])
        for variable in model.weights:
            value = self._numpy(variable)
            if value.size and not np.all(value == value.flat[0]):
                variable.assign(glorot_like(value.shape, rng, dtype=value.dtype.name))
        # The optimizer's variables exist once it has been built for the trainable weights.
        model.optimizer.build(model.trainable_variables)

    def _optimizer(self):
        spec = self.network.get("optimizer", "Adam")
        name = spec if isinstance(spec, str) else spec["class_name"]
        config = {} if isinstance(spec, str) else dict(spec.get("config") or {})
        config.setdefault("learning_rate", self.learning_rate)
        return getattr(self.keras.optimizers, name)(**config)

    def _numpy(self, variable) -> np.ndarray:
        # keras.Variable.numpy() warns under numpy 2 (no copy keyword in __array__); so does
        # converting a torch tensor through numpy's protocol, hence torch's own .numpy().
        value = variable.value
        if hasattr(value, "detach"):
            return value.detach().cpu().numpy().copy()
        return np.array(self.keras.ops.convert_to_numpy(value))

    def _require(self):
        if self.model is None:
            raise InvalidParameterError(f"{self.who}: the Keras model is used before build()")
        return self.model

    # ------------------------------------------------------------------ weights

    def get_weights(self) -> Weights:
        """Every variable (trainable and not) by its path."""
        return {v.path: self._numpy(v) for v in self._require().weights}

    def set_weights(self, weights: Weights) -> None:
        """Assign every variable by path."""
        for variable in self._require().weights:
            variable.assign(np.asarray(weights[variable.path], dtype=variable.dtype))

    def state(self) -> Weights:
        """The optimizer's variables (local state a checkpoint keeps)."""
        return {f"optimizer/{i}": self._numpy(v) for i, v in enumerate(self._require().optimizer.variables)}

    def load_state(self, state: Weights) -> None:
        """Restore :meth:`state`."""
        for i, variable in enumerate(self._require().optimizer.variables):
            if f"optimizer/{i}" in state:
                variable.assign(np.asarray(state[f"optimizer/{i}"], dtype=variable.dtype))

    # ------------------------------------------------------------------ training

    @property
    def supports_dp_sgd(self) -> bool:
        """Record-level DP-SGD runs on the JAX backend (per-record gradients by ``jax.vmap``)."""
        return self.backend == "jax"

    def fit(self, X: Any, y: np.ndarray, config: FitConfig) -> FitResult:
        """``local_epochs`` over the rows in numpy-drawn order; FedProx's pull after each epoch."""
        if config.dp_sgd is not None:
            return self._fit_private(X, y, config)
        model = self._require()
        X, y = np.asarray(X), np.asarray(y)
        rng = np.random.default_rng(list(config.seed))
        self.keras.utils.set_random_seed(int(rng.integers(0, 2**31 - 1)))
        loss = float("nan")
        for _ in range(config.epochs):
            order = rng.permutation(len(X))
            history = model.fit(X[order], y[order], batch_size=self.batch_size, epochs=1, shuffle=False, verbose=0)
            loss = float(history.history["loss"][-1])
            if config.proximal_mu > 0 and config.global_weights is not None:
                pull = min(1.0, self.learning_rate * config.proximal_mu)
                for variable in model.trainable_variables:
                    anchor = np.asarray(config.global_weights[variable.path])
                    value = self._numpy(variable)
                    variable.assign((value - pull * (value - anchor)).astype(value.dtype))
        return FitResult(num_examples=len(X), metrics={"loss": loss})

    def _fit_private(self, X: Any, y: np.ndarray, config: FitConfig) -> FitResult:
        """DP-SGD, the JAX way: per-record gradients by ``vmap(grad)`` over ``stateless_call``.

        Each of ``epochs * ceil(n / batch_size)`` steps samples every row with probability q
        (Poisson), clips each row's gradient (all tensors together) to the clip norm, adds
        Gaussian noise N(0, (z C)^2) to the sum, divides by qn and hands it to the network's
        own optimizer. Batches are padded to a power of two (masked) so few shapes compile.
        BatchNormalization is refused: a record's gradient would depend on its batch.
        """
        import jax
        import jax.numpy as jnp

        from confide.privacy.noise import generator

        if self.backend != "jax":
            raise InvalidParameterError(f"{self.who}: privacy.mechanism dp_sgd runs Keras networks on the jax backend")
        model = self._require()
        if any(type(layer).__name__.startswith("BatchNormalization") for layer in model.layers):
            raise InvalidParameterError(
                f"{self.who}: privacy.mechanism dp_sgd: BatchNormalization mixes the records of a batch; use "
                "LayerNormalization or GroupNormalization"
            )
        z, clip, rate = (float(v) for v in config.dp_sgd)
        X, y = np.asarray(X, dtype=np.float32), np.asarray(y)
        n = len(X)
        loss_fn = self.keras.losses.get(self.network.get("loss", "sparse_categorical_crossentropy"))
        trainable, frozen = model.trainable_variables, model.non_trainable_variables

        def record_loss(tv, ntv, x, t):
            out, _ = model.stateless_call(tv, ntv, x[None], training=True)
            return jnp.mean(loss_fn(t[None], out))

        @jax.jit
        def clipped_sum(tv, ntv, xb, yb, mask):
            grads = jax.vmap(jax.grad(record_loss), in_axes=(None, None, 0, 0))(tv, ntv, xb, yb)
            norms = jnp.sqrt(sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in grads))
            factor = jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-12)) * mask
            return [jnp.tensordot(factor, g, axes=1) for g in grads]

        rng = generator()
        steps = config.epochs * math.ceil(n / self.batch_size)
        for _ in range(steps):
            index = np.flatnonzero(rng.random(n) < rate)
            tv = [v.value for v in trainable]
            if index.size:
                size = 1 << (int(index.size) - 1).bit_length()
                xb = np.zeros((size, *X.shape[1:]), dtype=np.float32)
                yb = np.zeros((size, *y.shape[1:]), dtype=y.dtype)
                xb[: index.size], yb[: index.size] = X[index], y[index]
                mask = (np.arange(size) < index.size).astype(np.float32)
                sums = clipped_sum(tv, [v.value for v in frozen], xb, yb, mask)
            else:
                sums = [jnp.zeros_like(t) for t in tv]
            noisy = [
                (s + rng.normal(0.0, z * clip, s.shape).astype(np.float32)) / (rate * n) for s in map(np.asarray, sums)
            ]
            model.optimizer.apply(noisy, trainable)
            if config.proximal_mu > 0 and config.global_weights is not None:
                pull = min(1.0, self.learning_rate * config.proximal_mu)
                for variable in trainable:
                    value = self._numpy(variable)
                    anchor = np.asarray(config.global_weights[variable.path])
                    variable.assign((value - pull * (value - anchor)).astype(value.dtype))
        loss = float(model.evaluate(X, y, batch_size=max(self.batch_size, 256), verbose=0, return_dict=True)["loss"])
        return FitResult(num_examples=n, metrics={"loss": loss, "dp_sgd_steps": float(steps)})

    def predict(self, X: Any) -> np.ndarray:
        """P(label = 1) per row for a binary network, class probabilities ``(n, k)`` otherwise."""
        scores = np.asarray(self._require().predict(np.asarray(X), batch_size=max(self.batch_size, 256), verbose=0))
        return scores[:, 0].astype(np.float64) if self._binary else scores.astype(np.float64)

    def export_onnx(self, path: str) -> None:
        """Keras's own ONNX export (it needs this model on the ``torch`` backend)."""
        if self.backend != "torch":
            raise InvalidParameterError(f"ONNX export runs on the torch backend, this model is on {self.backend!r}")
        model = self._require()
        shape = tuple(int(d) for d in model.input_shape[1:])
        model.predict(np.zeros((1, *shape), dtype="float32"), verbose=0)  # the exporter traces a called model
        try:
            model.export(str(path), format="onnx", verbose=False)
        except Exception as error:  # noqa: BLE001 - the exporter's own failure, named for the user
            raise InvalidParameterError(
                f"Keras could not export this network to ONNX: {type(error).__name__}: {error}"
            ) from None

    def evaluate(self, X: Any, y: np.ndarray, metrics: list[str]) -> dict[str, float]:
        """Loss from Keras; accuracy and AUC from the predictions."""
        model = self._require()
        X, y = np.asarray(X), np.asarray(y)
        loss = model.evaluate(X, y, batch_size=max(self.batch_size, 256), verbose=0, return_dict=True)["loss"]
        out = {"loss": float(loss)}
        if not {"accuracy", "auc"} & set(metrics):
            return out
        scores = np.asarray(model.predict(X, batch_size=max(self.batch_size, 256), verbose=0))
        if "accuracy" in metrics and len(y):
            predicted = (scores[:, 0] > 0.5).astype(np.int64) if self._binary else np.argmax(scores, axis=1)
            out["accuracy"] = float(np.mean(predicted == y.astype(np.int64)))
        if "auc" in metrics and len(np.unique(y)) == 2:
            from confide.ml.metrics import roc_auc

            out["auc"] = roc_auc(y, scores[:, 0] if self._binary else scores[:, -1])
        return out


def build(
    spec: Any,
    *,
    seed: int,
    party_id: str,
    network: dict | None = None,
    keras_backend: str | None = None,
    **_options: Any,
) -> KerasModel:
    """The seam's factory for ``model.algorithm: keras`` (``network``: the job's resolved description)."""
    if network is None:
        raise InvalidParameterError("model.algorithm keras needs model.network or model.network_file")
    backend = keras_backend or spec.backends.get(party_id) or spec.backend
    return KerasModel(
        network,
        backend=backend,
        learning_rate=spec.learning_rate,
        local_epochs=spec.local_epochs,
        batch_size=spec.batch_size,
        seed=seed,
        who=f"party {party_id!r}",
    )
