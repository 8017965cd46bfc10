"""The plaintext reference the tests compare the secure protocol with."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from confide.errors import InvalidParameterError
from confide.vertical.hetero_lr.model import (
    ReferenceResult,
    _batches,
    _check_features,
    _check_labels,
    _converged,
    _dequantize,
    _Optimizer,
    _quantize,
    _scaling_of,
)
from confide.vertical.hetero_lr.params import HeteroLRParams

# ------------------------------------------------------------------------------ reference


def train_plaintext_reference(
    X_parts: Sequence[np.ndarray], y: np.ndarray, params: HeteroLRParams, *, quantized: bool = False
) -> ReferenceResult:
    """The same algorithm centralized in float64.

    Same scaling, batches, Taylor loss, optimizers (one per part, as each party runs its own)
    and stopping rule.

    ``X_parts[0]`` is the guest's block (it gets the intercept), the others the hosts' in
    order. With ``quantized=True`` the gradients use the dequantized features ``min + step q``
    exactly as the encrypted products do, so the secure run differs only by fixed-point
    rounding of the fore-gradients; with ``False`` they use the float features.
    """
    if not isinstance(params, HeteroLRParams):
        raise InvalidParameterError(f"params must be a HeteroLRParams, got {type(params).__name__}")
    if not X_parts:
        raise InvalidParameterError("X_parts must hold at least the guest's block")
    blocks = [_check_features(X, f"part {i}", min_columns=0 if i == 0 else 1) for i, X in enumerate(X_parts)]
    rows = blocks[0].shape[0]
    for i, block in enumerate(blocks):
        if block.shape[0] != rows:
            raise InvalidParameterError(f"row counts differ: part 0 has {rows} rows, part {i} has {block.shape[0]}")
    signs = 2.0 * _check_labels(y, rows, "the reference") - 1.0
    standards, gradient_features = [], []
    for block in blocks:
        scaling = _scaling_of(block, params.feature_bits)
        standard = scaling.standardize(block)
        standards.append(standard)
        gradient_features.append(_dequantize(_quantize(standard, scaling), scaling) if quantized else standard)
    weights = [np.zeros(block.shape[1] + (1 if i == 0 else 0)) for i, block in enumerate(blocks)]
    optimizers = [_Optimizer(params, w.size) for w in weights]
    losses: list[float] = []
    for epoch in range(params.epochs):
        loss_sum = 0.0
        for index in _batches(rows, params.batch_size, params.seed, epoch):
            size = index.size
            z = standards[0][index] @ weights[0][:-1] + weights[0][-1]
            for standard, w in zip(standards[1:], weights[1:], strict=True):
                z = z + standard[index] @ w
            fore = 0.25 * z - 0.5 * signs[index]
            penalty = sum(float(w[:-1] @ w[:-1]) if i == 0 else float(w @ w) for i, w in enumerate(weights))
            loss_sum += size * (
                math.log(2.0)
                - float(signs[index] @ z) / (2.0 * size)
                + float(z @ z) / (8.0 * size)
                + 0.5 * params.l2 * penalty
            )
            new_weights = []
            for i, (features, w) in enumerate(zip(gradient_features, weights, strict=True)):
                grad = features[index].T @ fore / size
                if i == 0:
                    grad = np.append(grad + params.l2 * w[:-1], fore.sum() / size)
                else:
                    grad = grad + params.l2 * w
                new_weights.append(optimizers[i].step(w, grad, epoch))
            weights = new_weights
        losses.append(loss_sum / rows)
        if _converged(losses, params.tol):
            break
    return ReferenceResult(
        weights=[weights[0][:-1].copy(), *(w.copy() for w in weights[1:])],
        intercept=float(weights[0][-1]),
        loss=losses,
    )
