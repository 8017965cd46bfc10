"""Models and aggregation strategies for horizontal federated learning, as registered plug-ins.

Every horizontal model implements :class:`FederatedModel` (:mod:`confide.ml.base`); the party
runner drives only that protocol. :data:`MODELS` maps ``model.algorithm`` to a module-level
factory ``build(spec, seed=..., party_id=...)``; :data:`confide.ml.strategies.STRATEGIES` maps
``strategy.name`` to a :class:`Strategy`. Adding either is one file plus one line here.

========== ============================================================= =====================
algorithm  what                                                          needs
========== ============================================================= =====================
homo_lr    binary logistic regression, numpy (:class:`HomoLR`)           nothing extra
keras      a Keras 3 network from the job spec, on jax, torch or         ``confide[keras]`` +
           tensorflow (chosen per party)                                 one backend
custom     the party's own object or factory, ``model.entry:             what the code imports
           module:attribute``; adapters for PyTorch and scikit-learn
hf         a pretrained transformers model from the party's files,       ``confide[hf]``
           fine-tuned with a peft LoRA adapter (``model.hf``)
========== ============================================================= =====================
"""

from __future__ import annotations

import importlib
from typing import Any

from confide.errors import InvalidParameterError
from confide.ml.base import FederatedModel, FitConfig, FitResult, WeightLayout, Weights
from confide.ml.homo_lr import HomoLR, HomoLRModel
from confide.ml.strategies import STRATEGIES, Strategy, make_strategy

__all__ = [
    "MODELS",
    "STRATEGIES",
    "FederatedModel",
    "FitConfig",
    "FitResult",
    "HomoLR",
    "HomoLRModel",
    "Strategy",
    "WeightLayout",
    "Weights",
    "build_model",
    "make_strategy",
]

#: model.algorithm -> module whose ``build(spec, *, seed, party_id)`` makes the model.
MODELS: dict[str, str] = {
    "homo_lr": "confide.ml.homo_lr",
    "keras": "confide.ml.keras_model",
    "custom": "confide.ml.custom",
    "hf": "confide.ml.hf_model",
}


def build_model(spec: Any, *, seed: int, party_id: str, **options: Any) -> FederatedModel:
    """The model ``spec.algorithm`` names, built by its registered factory.

    ``options`` go to the factory (the Keras backend a party chose, for example).
    """
    name = spec.algorithm
    if name not in MODELS:
        raise InvalidParameterError(f"model.algorithm must be one of {', '.join(MODELS)}, got {name!r}")
    module = importlib.import_module(MODELS[name])
    model = module.build(spec, seed=seed, party_id=party_id, **options)
    if not isinstance(model, FederatedModel):
        raise InvalidParameterError(
            f"model.algorithm {name}: the factory returned {type(model).__name__}, which lacks "
            "build/get_weights/set_weights/fit/evaluate"
        )
    return model
