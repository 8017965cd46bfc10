"""A thin adapter from plain PyTorch to the model seam: your ``nn.Module`` and your training loop.

PyTorch users keep writing PyTorch::

    net = Net()                                   # any torch.nn.Module

    def train(net, loader, epochs):               # your loop, your optimizer, your loss
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        for _ in range(epochs):
            for images, labels in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(net(images), labels)
                loss.backward()
                optimizer.step()
        return {"loss": loss.item()}

    def federated_model():                        # model.entry: "digits_cnn.py:federated_model"
        return TorchModel(net, train)

What the adapter does around that:

* weights are the module's ``state_dict`` floating tensors, by their names (integer buffers such
  as BatchNorm's ``num_batches_tracked`` stay local);
* the loader is a ``DataLoader`` over the party's rows whose order is drawn from the round's
  seed (``torch.Generator``), so a resumed job draws the same batches;
* FedProx: a gradient hook adds ``mu (w - w_global)`` to every parameter's gradient during the
  round, which is the proximal term's gradient whatever optimizer your loop uses;
* ``evaluate`` defaults to cross-entropy and accuracy on the module's logits (binary: one
  logit and BCE); pass your own ``evaluate(net, loader) -> dict`` to change that.

``input_transform`` turns a numpy batch into the tensor your module expects (for example
channels-last images to channels-first); the default is ``torch.from_numpy``.

Record-level DP-SGD (``privacy.mechanism: dp_sgd``) keeps your loop too. Opacus computes
per-record gradients (``GradSampleModule``, so use layers it supports: GroupNorm, not
BatchNorm) and samples the loader's rows at random (``DPDataLoader``, Poisson); a hook runs
before every step of whatever optimizer your loop made, clips each record's gradient to the
clip norm, adds Gaussian noise and divides by the expected batch, so your optimizer steps on
the private gradient. Call ``backward`` once per ``step`` (no gradient accumulation): the steps
are counted and accounted as they ran.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.base import DTYPES, FitConfig, FitResult, Weights

__all__ = ["TorchModel", "import_torch"]


def import_torch():
    """PyTorch, or a clear error naming the extra that installs it."""
    try:
        import torch
    except ImportError as error:
        raise InvalidParameterError(
            f"PyTorch is not installed at this party ({error}); pip install 'confide[torch]'"
        ) from None
    return torch


class TorchModel:
    """A ``torch.nn.Module`` and the user's training function behind :class:`FederatedModel`."""

    def __init__(
        self,
        module: Any,
        train: Callable[..., Any],
        *,
        evaluate: Callable[..., dict] | None = None,
        batch_size: int = 32,
        epochs: int = 1,
        input_transform: Callable[[np.ndarray], Any] | None = None,
    ) -> None:
        torch = import_torch()
        if not isinstance(module, torch.nn.Module):
            raise InvalidParameterError(f"TorchModel needs a torch.nn.Module, got {type(module).__name__}")
        if not callable(train):
            raise InvalidParameterError("TorchModel needs train(net, loader, epochs), a callable")
        self.torch = torch
        self.module = module
        self.train_function = train
        self.evaluate_function = evaluate
        self.batch_size = int(batch_size)
        self.epochs = int(epochs)
        self.input_transform = input_transform

    def _names(self) -> list[str]:
        return [k for k, v in self.module.state_dict().items() if str(v.dtype).removeprefix("torch.") in DTYPES]

    def build(self, example_shape: tuple[int, ...], classes: int) -> None:
        """Check the module takes examples of ``example_shape`` and gives one output per class."""
        probe = np.zeros((2, *example_shape), dtype=np.float32)
        self.module.eval()
        try:
            with self.torch.no_grad():
                out = self.module(self._tensor(probe))
        except Exception as error:  # noqa: BLE001 - the user's module: report what it said
            raise InvalidParameterError(
                f"the PyTorch module cannot take examples of shape {list(example_shape)}: "
                f"{type(error).__name__}: {error}"
            ) from None
        outputs = out.shape[-1] if out.ndim > 1 else 1
        if classes and outputs not in (classes, 1):
            raise InvalidParameterError(f"the PyTorch module has {outputs} outputs, the data has {classes} classes")

    def _tensor(self, X: np.ndarray):
        return self.input_transform(X) if self.input_transform is not None else self.torch.from_numpy(np.asarray(X))

    def _loader(self, X: np.ndarray, y: np.ndarray, seed: tuple[int, ...] | None):
        torch = self.torch
        features = self._tensor(np.asarray(X, dtype=np.float32))
        labels = torch.from_numpy(np.asarray(y))
        dataset = torch.utils.data.TensorDataset(features, labels)
        if seed is None:
            return torch.utils.data.DataLoader(dataset, batch_size=max(self.batch_size, 256), shuffle=False)
        generator = torch.Generator().manual_seed(int(np.random.default_rng(list(seed)).integers(0, 2**62)))
        return torch.utils.data.DataLoader(dataset, batch_size=self.batch_size, shuffle=True, generator=generator)

    def get_weights(self) -> Weights:
        """Floating ``state_dict`` entries as numpy arrays."""
        state = self.module.state_dict()
        return {name: state[name].detach().cpu().numpy().copy() for name in self._names()}

    def set_weights(self, weights: Weights) -> None:
        """Load them back (integer buffers untouched)."""
        state = self.module.state_dict()
        update = {
            name: self.torch.from_numpy(np.ascontiguousarray(weights[name])).to(state[name].dtype)
            for name in self._names()
        }
        self.module.load_state_dict(update, strict=False)

    #: Runs record-level DP-SGD (through Opacus) when ``FitConfig.dp_sgd`` asks for it.
    supports_dp_sgd = True

    def fit(self, X: Any, y: np.ndarray, config: FitConfig) -> FitResult:
        """The user's ``train(net, loader, epochs)``; FedProx through gradient hooks."""
        if config.dp_sgd is not None:
            return self._fit_private(X, y, config)
        torch = self.torch
        torch.manual_seed(int(np.random.default_rng([*config.seed, 1]).integers(0, 2**62)))
        hooks = []
        if config.proximal_mu > 0 and config.global_weights is not None:
            mu = config.proximal_mu
            for name, parameter in self.module.named_parameters():
                anchor = torch.from_numpy(np.asarray(config.global_weights[name])).to(parameter.dtype)
                hooks.append(parameter.register_hook(lambda g, p=parameter, a=anchor: g + mu * (p.detach() - a)))
        self.module.train()
        try:
            result = self.train_function(self.module, self._loader(X, y, config.seed), config.epochs or self.epochs)
        finally:
            for hook in hooks:
                hook.remove()
        metrics = result if isinstance(result, dict) else ({"loss": float(result)} if result is not None else {})
        return FitResult(num_examples=len(y), metrics={k: float(v) for k, v in metrics.items()})

    def _fit_private(self, X: Any, y: np.ndarray, config: FitConfig) -> FitResult:
        """The user's loop over a Poisson loader, every optimizer step on a clipped, noised gradient."""
        torch = self.torch
        from opacus import GradSampleModule
        from opacus.data_loader import DPDataLoader
        from opacus.validators import ModuleValidator
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        z, clip, rate = (float(v) for v in config.dp_sgd)
        self.module.train()
        problems = ModuleValidator.validate(self.module, strict=False)
        if problems:
            raise InvalidParameterError(
                "privacy.mechanism dp_sgd: Opacus cannot compute per-record gradients of this module: "
                + "; ".join(str(p) for p in problems[:3])
            )
        seed = int.from_bytes(os.urandom(8), "little") >> 1
        loader = DPDataLoader.from_data_loader(
            self._loader(X, y, config.seed), generator=torch.Generator().manual_seed(seed)
        )
        if abs(loader.sample_rate - rate) > 1e-12:
            raise InvalidParameterError(
                f"privacy: the loader samples at {loader.sample_rate:.6f} but the budget was calibrated for {rate:.6f}"
            )
        noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        expected = rate * len(y)
        parameters = [p for p in self.module.parameters() if p.requires_grad]
        owned = {id(p) for p in parameters}
        anchors = None
        if config.proximal_mu > 0 and config.global_weights is not None:
            named = dict(self.module.named_parameters())
            anchors = {
                id(named[n]): torch.from_numpy(np.asarray(config.global_weights[n])).to(named[n].dtype) for n in named
            }
        steps = 0

        def private_gradient(optimizer, _args, _kwargs):
            nonlocal steps
            if not any(id(p) in owned for group in optimizer.param_groups for p in group["params"]):
                return
            samples = [p.grad_sample for p in parameters if getattr(p, "grad_sample", None) is not None]
            if samples:
                norms = torch.stack([g.reshape(g.shape[0], -1).norm(2, dim=1) for g in samples]).norm(2, dim=0)
                factor = (clip / (norms + 1e-12)).clamp(max=1.0)
            for p in parameters:
                sample = getattr(p, "grad_sample", None)
                total = torch.einsum("i,i...->...", factor, sample) if sample is not None else torch.zeros_like(p)
                total = total + torch.normal(0.0, z * clip, p.shape, generator=noise, dtype=p.dtype).to(p.device)
                p.grad = total / expected
                if anchors is not None:
                    p.grad += config.proximal_mu * (p.detach() - anchors[id(p)])
                p.grad_sample = None
            steps += 1

        torch.manual_seed(int(np.random.default_rng([*config.seed, 1]).integers(0, 2**62)))
        wrapped = GradSampleModule(self.module, loss_reduction="mean")
        handle = register_optimizer_step_pre_hook(private_gradient)
        self.module.train()
        try:
            with warnings.catch_warnings():
                # Opacus' per-record hooks fire on module outputs when the inputs need no gradient
                # (they never do here); torch warns about exactly that, harmlessly.
                warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
                result = self.train_function(wrapped, loader, config.epochs or self.epochs)
        finally:
            handle.remove()
            wrapped._close()
        metrics = result if isinstance(result, dict) else ({"loss": float(result)} if result is not None else {})
        return FitResult(
            num_examples=len(y), metrics={**{k: float(v) for k, v in metrics.items()}, "dp_sgd_steps": float(steps)}
        )

    def predict(self, X: Any) -> np.ndarray:
        """Sigmoid of a single logit (P(label = 1)), else the softmax over the classes."""
        torch = self.torch
        self.module.eval()
        outputs = []
        with torch.no_grad():
            for features, _ in self._loader(X, np.zeros(len(X)), None):
                outputs.append(self.module(features))
        logits = torch.cat(outputs)
        if logits.ndim == 1 or logits.shape[-1] == 1:
            return torch.sigmoid(logits.reshape(-1)).double().numpy()
        return torch.softmax(logits, dim=1).double().numpy()

    def evaluate(self, X: Any, y: np.ndarray, metrics: list[str]) -> dict[str, float]:
        """The user's ``evaluate(net, loader)``, or cross-entropy, accuracy and (binary) AUC."""
        torch = self.torch
        loader = self._loader(X, y, None)
        self.module.eval()
        if self.evaluate_function is not None:
            return {k: float(v) for k, v in self.evaluate_function(self.module, loader).items()}
        outputs = []
        with torch.no_grad():
            for features, _ in loader:
                outputs.append(self.module(features))
        logits = torch.cat(outputs)
        labels = torch.from_numpy(np.asarray(y))
        if logits.ndim == 1 or logits.shape[-1] == 1:
            logits = logits.reshape(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.float()).item()
            scores = logits.numpy()
            predicted = (scores > 0).astype(np.int64)
        else:
            loss = torch.nn.functional.cross_entropy(logits, labels.long()).item()
            scores = torch.softmax(logits, dim=1).numpy()
            predicted = scores.argmax(axis=1)
        out = {"loss": float(loss)}
        if "accuracy" in metrics and len(y):
            out["accuracy"] = float(np.mean(predicted == np.asarray(y)))
        if "auc" in metrics and len(np.unique(y)) == 2:
            from confide.ml.metrics import roc_auc

            out["auc"] = roc_auc(y, scores if scores.ndim == 1 else scores[:, -1])
        return out
