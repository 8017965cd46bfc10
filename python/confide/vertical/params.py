"""A vertical algorithm's parameters from a job specification, by one rule.

Every field of the algorithm's parameter dataclass named like a setting of ``model`` takes that
setting; the field that counts the job's rounds (``n_trees`` or ``epochs``) takes ``rounds``;
``key_bits`` and ``seed`` come from the protection and the job. A setting the job leaves unset
(None) keeps the dataclass's default. So a new hyper-parameter is declared twice (the spec
field, the dataclass field) and copied by nothing but its name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from confide.spec import JobSpec

__all__ = ["hetero_lr_params", "hetero_nn_params", "params_from_spec", "secureboost_params"]

P = TypeVar("P")


def params_from_spec(cls: type[P], spec: JobSpec, *, rounds: str, **overrides: Any) -> P:
    """``cls`` (a parameter dataclass) filled from ``spec``; ``rounds`` names its round-count field."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    values = spec.model.model_dump(include=names, exclude_none=True)
    values.update({rounds: spec.rounds, "key_bits": spec.protection.key_bits, "seed": spec.seed}, **overrides)
    return cls(**{name: value for name, value in values.items() if name in names})


def secureboost_params(spec: JobSpec):
    """SecureBoost hyper-parameters of a job (``rounds`` counts trees)."""
    from confide.vertical.secureboost import SecureBoostParams

    return params_from_spec(SecureBoostParams, spec, rounds="n_trees")


def hetero_lr_params(spec: JobSpec):
    """Hetero LR hyper-parameters of a job (``rounds`` counts epochs)."""
    from confide.vertical.hetero_lr import HeteroLRParams

    return params_from_spec(HeteroLRParams, spec, rounds="epochs")


def hetero_nn_params(spec: JobSpec):
    """Hetero NN hyper-parameters of a job (``rounds`` counts epochs).

    Sub-networks given as layer lists become tuples (the dataclass's defaults are tuples too).
    """
    from confide.vertical.hetero_nn import HeteroNNParams

    networks = {
        name: tuple(value) if isinstance(value, list) else value
        for name in ("guest_bottom", "host_bottom", "top")
        if (value := getattr(spec.model, name)) is not None
    }
    return params_from_spec(HeteroNNParams, spec, rounds="epochs", **networks)
