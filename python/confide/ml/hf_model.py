"""``model.algorithm: hf``: a pretrained Hugging Face ``transformers`` model, fine-tuned with adapters.

A party loads the model from its own files (``model.hf.pretrained``: a folder that
``save_pretrained`` wrote; nothing is fetched from a hub: ``local_files_only``), puts a
sequence-classification head on it, and wraps it with a ``peft`` LoRA adapter. Only what trains
travels: the adapter's matrices and the head (peft's ``modules_to_save``). The base model's
weights stay frozen and never leave the party; their SHA-256 (:func:`base_digest`) is compared
between all parties before round 1, so a party that loaded another checkpoint is named before
anything trains. ``model.hf.adapter: none`` fine-tunes every weight instead (the comparison for
what LoRA saves on the wire).

Rows are token ids (``int``, ``(n, length)``, 0 or the model's ``pad_token_id`` as padding); the
attention mask is the non-padding positions. Tokenizing stays with the party's own pipeline.

The own-code route: a party's ``model.entry`` returns :class:`HFModel` around any model that
takes ``input_ids`` and ``attention_mask`` and returns ``.logits`` (a peft model the party built,
for instance), with its own ``train(model, dataset, epochs)`` if it wants one: ``dataset``
yields dicts of ``input_ids``, ``attention_mask`` and ``labels``, which is what a
``transformers.Trainer`` takes as its ``train_dataset``.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from confide.errors import InvalidParameterError
from confide.ml.base import FitConfig, FitResult, Weights, classification_metrics
from confide.ml.torch_adapter import import_torch

__all__ = ["HFModel", "base_digest", "build", "import_transformers"]


def import_transformers():
    """``transformers`` and ``peft``, or a clear error naming the extra that installs them."""
    try:
        import peft
        import transformers
    except ImportError as error:
        raise InvalidParameterError(
            f"model.algorithm hf needs transformers and peft at this party ({error}); pip install 'confide[hf]'"
        ) from None
    return transformers, peft


def base_digest(named_tensors: Iterable[tuple[str, Any]]) -> str:
    """SHA-256 over frozen tensors: names, dtypes, shapes and bytes, in name order."""
    torch = import_torch()
    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        array = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{array.dtype}|{tuple(array.shape)}|".encode())
        digest.update(memoryview(array.reshape(-1).view(torch.uint8).numpy()))  # any dtype, bfloat16 too
    return digest.hexdigest()


class _Rows:
    """The party's rows as the dicts a transformers model (and ``Trainer``) takes."""

    def __init__(self, torch, ids: np.ndarray, labels: np.ndarray, pad: int) -> None:
        self.ids = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))
        self.mask = (self.ids != pad).long()
        self.labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class HFModel:
    """A transformers model (adapter-wrapped or not) behind :class:`confide.ml.base.FederatedModel`.

    The weights are the parameters that train (``requires_grad``), by name; the others are the
    base model, summarised by :attr:`base_digest`.
    """

    def __init__(
        self,
        model: Any,
        *,
        train: Callable[..., Any] | None = None,
        learning_rate: float = 1e-3,
        batch_size: int = 32,
        epochs: int = 1,
        pad_token_id: int | None = None,
        base_sha256: str | None = None,
        describe: dict | None = None,
    ) -> None:
        torch = import_torch()
        if not isinstance(model, torch.nn.Module):
            raise InvalidParameterError(
                f"HFModel needs a torch.nn.Module (a transformers model), got {type(model).__name__}"
            )
        self.torch = torch
        self.module = model
        self.train_function = train
        self.learning_rate = float(learning_rate)
        self.batch_size = max(1, int(batch_size))
        self.epochs = int(epochs)
        config = getattr(model, "config", None)
        pad = pad_token_id if pad_token_id is not None else getattr(config, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else 0
        self._trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self._trainable:
            raise InvalidParameterError(
                "HFModel: no parameter of the model trains (requires_grad): nothing to federate"
            )
        if base_sha256 is None:
            frozen = [
                (n, p) for n, p in model.named_parameters() if not p.requires_grad and ".original_module." not in n
            ]
            base_sha256 = base_digest(frozen) if frozen else None
        #: SHA-256 of the frozen base model (compared between parties before round 1); None: nothing is frozen.
        self.base_digest = base_sha256
        self.frozen_parameters = sum(p.numel() for n, p in model.named_parameters() if not p.requires_grad)
        #: What the party report states about the model (adapter, base model).
        self.report_fields = dict(describe or {})

    # ------------------------------------------------------------------ the seam

    def build(self, example_shape: tuple[int, ...], classes: int) -> None:
        """Check the rows are token sequences the model can take, and its head has ``classes`` outputs."""
        if len(example_shape) != 1:
            raise InvalidParameterError(
                f"model.algorithm hf takes rows of token ids (n, length), got examples of shape {list(example_shape)}"
            )
        limit = getattr(getattr(self.module, "config", None), "max_position_embeddings", None)
        if limit is not None and example_shape[0] > limit:
            raise InvalidParameterError(
                f"the rows hold {example_shape[0]} tokens; the model takes at most {limit} (max_position_embeddings)"
            )
        probe = np.full((1, example_shape[0]), self.pad_token_id + 1, dtype=np.int64)
        with self.torch.no_grad():
            self.module.eval()
            logits = self._logits(self.torch.from_numpy(probe))
        outputs = logits.shape[-1]
        if classes and outputs != classes:
            raise InvalidParameterError(f"the model's head has {outputs} outputs, the data has {classes} classes")

    def _logits(self, ids):
        return self.module(input_ids=ids, attention_mask=(ids != self.pad_token_id).long()).logits

    def get_weights(self) -> Weights:
        """The trainable parameters, as numpy copies (bfloat16 ones widened to float32: numpy has no bfloat16)."""
        torch = self.torch
        return {
            name: (p.detach().float() if p.dtype == torch.bfloat16 else p.detach()).cpu().numpy().copy()
            for name, p in self._trainable
        }

    def set_weights(self, weights: Weights) -> None:
        """Copy them into the parameters (the base model is untouched)."""
        with self.torch.no_grad():
            for name, p in self._trainable:
                p.copy_(self.torch.from_numpy(np.ascontiguousarray(weights[name])).to(p.dtype))

    def fit(self, X: Any, y: np.ndarray, config: FitConfig) -> FitResult:
        """The party's ``train(model, dataset, epochs)``, or AdamW on cross-entropy; FedProx through gradient hooks."""
        torch = self.torch
        torch.manual_seed(int(np.random.default_rng([*config.seed, 1]).integers(0, 2**62)))
        rows = _Rows(torch, np.asarray(X), y, self.pad_token_id)
        epochs = config.epochs or self.epochs
        hooks = []
        if config.proximal_mu > 0 and config.global_weights is not None:
            mu = config.proximal_mu
            for name, p in self._trainable:
                anchor = torch.from_numpy(np.asarray(config.global_weights[name])).to(p.dtype)
                hooks.append(p.register_hook(lambda g, p=p, a=anchor: g + mu * (p.detach() - a)))
        self.module.train()
        try:
            if self.train_function is not None:
                result = self.train_function(self.module, rows, epochs)
                metrics = (
                    result if isinstance(result, dict) else ({"loss": float(result)} if result is not None else {})
                )
            else:
                metrics = self._train(rows, epochs, config.seed)
        finally:
            for hook in hooks:
                hook.remove()
        return FitResult(num_examples=len(y), metrics={k: float(v) for k, v in metrics.items()})

    def _train(self, rows: _Rows, epochs: int, seed: tuple[int, ...]) -> dict:
        torch = self.torch
        generator = torch.Generator().manual_seed(int(np.random.default_rng(list(seed)).integers(0, 2**62)))
        loader = torch.utils.data.DataLoader(rows, batch_size=self.batch_size, shuffle=True, generator=generator)
        optimizer = torch.optim.AdamW([p for _, p in self._trainable], lr=self.learning_rate, weight_decay=0.0)
        total, count = 0.0, 0
        for _ in range(epochs):
            for batch in loader:
                optimizer.zero_grad()
                logits = self.module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(batch["labels"])
                count += len(batch["labels"])
        return {"loss": total / max(count, 1)}

    def predict(self, X: Any) -> np.ndarray:
        """Softmax over the classes (binary: P(label = 1))."""
        torch = self.torch
        ids = torch.from_numpy(np.ascontiguousarray(np.asarray(X), dtype=np.int64))
        self.module.eval()
        with torch.no_grad():
            logits = torch.cat([self._logits(ids[i : i + 256]) for i in range(0, len(ids), 256)])
        scores = torch.softmax(logits.float(), dim=1).double().numpy()
        return scores[:, 1] if scores.shape[1] == 2 else scores

    def evaluate(self, X: Any, y: np.ndarray, metrics: list[str]) -> dict[str, float]:
        """Cross-entropy, and accuracy and (binary) AUC where asked."""
        scores = self.predict(X)
        probabilities = np.stack([1 - scores, scores], axis=1) if scores.ndim == 1 else scores
        labels = np.asarray(y, dtype=np.int64)
        loss = float(-np.mean(np.log(np.clip(probabilities[np.arange(len(labels)), labels], 1e-12, None))))
        return classification_metrics(probabilities, labels, metrics, loss)


def build(spec: Any, *, seed: int, party_id: str, **_options: Any) -> HFModel:
    """The seam's factory for ``model.algorithm: hf``: load, add the head, wrap with LoRA."""
    return _Builder(spec, seed=seed, party_id=party_id)


class _Builder(HFModel):
    """Loads at :meth:`build`, when the number of classes is known."""

    def __init__(self, spec: Any, *, seed: int, party_id: str) -> None:  # noqa: D107 - the seam's factory
        self.torch = import_torch()
        self.spec = spec
        self.seed = seed
        self.who = f"party {party_id!r}"
        self.party_id = party_id
        hf = spec.hf
        where = hf.pretrained.get(party_id) if isinstance(hf.pretrained, dict) else hf.pretrained
        if where is None:
            raise InvalidParameterError(f"{self.who}: model.hf.pretrained names no folder for this party")
        self.path = Path(where)
        if not (self.path / "config.json").is_file():
            raise InvalidParameterError(
                f"{self.who}: model.hf.pretrained {str(self.path)!r} is not a saved transformers model (no config.json)"
            )

    def build(self, example_shape: tuple[int, ...], classes: int) -> None:
        transformers, peft = import_transformers()
        transformers.utils.logging.disable_progress_bar()  # a party's log is read by people, not a terminal
        torch = self.torch
        hf = self.spec.hf
        labels = classes or 2
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)  # the head (and LoRA's A matrices) are drawn alike at every party
            try:
                with warnings.catch_warnings():
                    # Its loading report: the head is new by design (the base checkpoint has none).
                    warnings.simplefilter("ignore")
                    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
                        self.path, num_labels=labels, local_files_only=True, output_loading_info=True
                    )
            except (OSError, ValueError) as error:
                raise InvalidParameterError(
                    f"{self.who}: model.hf.pretrained {str(self.path)!r} cannot be loaded: {error}"
                ) from None
            fresh = set(info.get("missing_keys") or ())
            digest = base_digest((n, t) for n, t in model.state_dict().items() if n not in fresh)
            total = sum(p.numel() for p in model.parameters())
            if hf.adapter == "lora":
                config = peft.LoraConfig(
                    task_type=peft.TaskType.SEQ_CLS,
                    r=hf.r,
                    lora_alpha=hf.alpha,
                    lora_dropout=hf.dropout,
                    target_modules=hf.target_modules,
                )
                try:
                    with warnings.catch_warnings():
                        # peft asks for an attribute transformers 5 deprecated (is_gradient_checkpointing).
                        warnings.filterwarnings("ignore", category=FutureWarning)
                        model = peft.get_peft_model(model, config)
                except ValueError as error:
                    raise InvalidParameterError(f"{self.who}: model.hf: peft cannot wrap this model: {error}") from None
        HFModel.__init__(
            self,
            model,
            learning_rate=self.spec.learning_rate,
            batch_size=self.spec.batch_size or 32,
            epochs=self.spec.local_epochs,
            base_sha256=digest,
            describe={"adapter": hf.adapter, "base_parameters": total, "base_sha256": digest},
        )
        super().build(example_shape, classes)
