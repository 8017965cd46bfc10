"""The plaintext reference (the same network, unprotected) the tests compare with."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from confide.vertical.hetero_nn.model import (
    _batches,
    _check_features,
    _check_labels,
    _GuestNet,
    _head,
    _host_bottom,
    _host_rng,
    _interactive_half,
    _predictions,
    _Scaling,
)
from confide.vertical.hetero_nn.params import HeteroNNParams
from confide.vertical.netlayers import (
    Adam,
    DenseNetwork,
)

# ----------------------------------------------------------------------------- plaintext reference


@dataclass
class ReferenceModel:
    """The centrally trained network: every party's bottom model, the interactive layer, the top."""

    params: HeteroNNParams
    guest: str
    hosts: list[str]
    scalings: dict[str, _Scaling]
    net: _GuestNet
    bottoms: dict[str, DenseNetwork]
    weights: dict[str, np.ndarray]
    history: list[dict] = field(default_factory=list)


def train_reference(parts: dict[str, np.ndarray], y: np.ndarray, params: HeteroNNParams, guest: str) -> ReferenceModel:
    """The same network, initial weights, batches and optimizers, trained centrally in float."""
    hosts = [p for p in parts if p != guest]
    X = {p: _check_features(parts[p], p) for p in parts}
    rows = X[guest].shape[0]
    y = _check_labels(y, rows, params, guest)
    scalings = {p: _Scaling.fit(X[p]) for p in parts}
    # Framework bottoms are built first (their width is known once built); numpy ones below, in
    # the order of the secure run's draws.
    early = {
        h: _host_bottom(params, X[h].shape[1], None, i, f"host {h!r}")
        for i, h in enumerate(hosts)
        if params.host_dim(X[h].shape[1]) is None
    }
    d_hs = {h: early[h].output_dim if h in early else params.host_dim(X[h].shape[1]) for h in hosts}
    parts_count = 1 + len(hosts)
    rng = np.random.default_rng([params.seed, 0])
    net = _GuestNet(params, X[guest].shape[1], parts_count, rng)
    net.bottom.standardize_inputs(scalings[guest].mean, scalings[guest].std)
    guest_halves = {h: _interactive_half(rng, d_hs[h], params.interactive_units, parts_count) for h in hosts}
    bottoms, weights, adams = {}, {}, {}
    for i, h in enumerate(hosts):
        host_rng = _host_rng(params, i)
        weights[h] = guest_halves[h] + _interactive_half(host_rng, d_hs[h], params.interactive_units, parts_count)
        bottoms[h] = early[h] if h in early else _host_bottom(params, X[h].shape[1], host_rng, i, f"host {h!r}")
        bottoms[h].standardize_inputs(scalings[h].mean, scalings[h].std)
        adams[h] = Adam(params.learning_rate)
    model = ReferenceModel(params, guest, hosts, scalings, net, bottoms, weights)
    for epoch in range(params.epochs):
        losses, counts = [], []
        for rows_b in _batches(rows, params.batch_size, params.seed, epoch):
            count = len(rows_b)
            alphas = {h: bottoms[h].forward(X[h][rows_b]) for h in hosts}
            z_hosts = sum((alphas[h] @ weights[h] for h in hosts), np.zeros((count, params.interactive_units)))
            out = net.forward(X[guest][rows_b], z_hosts)
            loss, grad = _head(params.objective, out, y[rows_b])
            losses.append(loss)
            counts.append(count)
            delta = net.backward(grad, count)
            for h in hosts:
                grad_a = delta @ weights[h].T
                weights[h] = weights[h] - params.interactive_learning_rate / count * (alphas[h].T @ delta)
                grads, _ = bottoms[h].backward(grad_a, input_grad=False)
                if grads:
                    adams[h].step(bottoms[h].params(), [g / count for g in grads])
        model.history.append({"epoch": epoch + 1, "loss": float(np.average(losses, weights=counts))})
    return model


def predict_reference(model: ReferenceModel, parts: dict[str, np.ndarray]) -> np.ndarray:
    """Scores of the centrally trained reference for every party's rows."""
    X = {p: np.asarray(parts[p]) for p in parts}
    rows = X[model.guest].shape[0]
    z_hosts = np.zeros((rows, model.params.interactive_units))
    for h in model.hosts:
        z_hosts += model.bottoms[h].forward(X[h], keep=False) @ model.weights[h]
    return _predictions(model.params.objective, model.net.forward(X[model.guest], z_hosts, keep=False))
