"""The guest's side of Hetero NN: training and prediction."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from confide.crypto import gpu
from confide.crypto import vectors as cv
from confide.errors import DataProblemError, InvalidParameterError, ProtocolError
from confide.vertical.channel import Channel
from confide.vertical.hetero_nn.model import (
    HeteroNNGuestModel,
    _batches,
    _check_features,
    _check_labels,
    _GuestNet,
    _head,
    _interactive_half,
    _predictions,
    _Scaling,
)
from confide.vertical.hetero_nn.params import FW, PREDICT_BATCH, HeteroNNParams
from confide.vertical.hetero_nn.protocol import (
    _adam_state,
    _bottom_dim,
    _encode_delta,
    _encrypt_shares,
    _EpochClock,
    _guest_back_open,
    _guest_forward_open,
    _hello,
    _Layout,
    _lr_multiplier,
    _peer_problem,
    _raise,
    _resumed_guest,
    _ring_array,
    _scaled_floor,
    _to_ring,
    _vector,
)


def train_guest(
    channel: Channel,
    hosts: list[str],
    X: np.ndarray,
    y: np.ndarray,
    params: HeteroNNParams,
    session: str,
    on_epoch: Callable[..., None] | None = None,
    resume: dict | None = None,
) -> HeteroNNGuestModel:
    """The guest's side of training (module docstring). Returns the guest's model part.

    ``on_epoch(entry, snapshot)``: after every epoch, with its record and a callable returning
    the guest's whole training state (for a checkpoint). ``resume``: such a state; training
    continues with the next epoch (every host must resume from the same epoch).
    """
    me = f"guest {channel.party!r}"
    start_epoch = int(resume["epoch"]) if resume else 0
    setup = time.perf_counter()
    meter = cv.Meter()
    own: Exception | None = None
    rows = columns = -1
    rng = np.random.default_rng([params.seed, 0])
    net = None
    try:
        X = _check_features(X, me)
        rows, columns = X.shape
        y = _check_labels(y, rows, params, me)
        # Built before the hello, so a network that cannot be built stops every party at once.
        net = _GuestNet(params, columns, 1 + len(hosts), rng)
    except InvalidParameterError as error:
        own = error
    key_bytes = b""
    secret = None
    if own is None:
        with meter:
            secret = cv.generate_keypair(params.key_bits, precompute=True)
        key_bytes = secret.encryption_key.to_bytes()
    extra = {"key": key_bytes, "hosts": list(hosts), "resume_epoch": start_epoch}
    channel.send(hosts, f"hnn/{session}/hello", _hello(own, rows, columns, params, extra))
    replies = {h: channel.recv(h, f"hnn/{session}/hello") for h in hosts}
    problems = [p for h in hosts if (p := _peer_problem(replies[h], h, rows, params, me, start_epoch)) is not None]
    _raise(own, problems)
    if secret is None or net is None:
        raise ProtocolError(f"{me}: no key pair or network was made")
    key = secret.encryption_key
    n = int.from_bytes(key.n_bytes(), "big")
    threads = params.threads
    scaling = _Scaling.fit(X)
    d_hs = {h: _bottom_dim(replies[h], h, params, me) for h in hosts}
    net.bottom.standardize_inputs(scaling.mean, scaling.std)
    layouts = {h: _Layout(params, d_hs[h], n) for h in hosts}
    shares: dict[str, np.ndarray] = {}
    for h in hosts:
        half = _to_ring(_interactive_half(rng, d_hs[h], params.interactive_units, 1 + len(hosts)), FW)
        if resume is None:
            theirs = _ring_array(replies[h].get("init"), (d_hs[h], params.interactive_units), f"{me}: init from {h}")
            shares[h] = half + theirs
    model = HeteroNNGuestModel(params, list(hosts), scaling, net, shares, setup_seconds=time.perf_counter() - setup)
    if resume is not None:
        model = _resumed_guest(resume, hosts, d_hs, params, me)
        net, shares, scaling = model.net, model.shares, model.scaling

    def snapshot(epoch_done: int) -> Callable[[], dict]:
        return lambda: {"epoch": epoch_done, "model": model.to_dict(), "adam": _adam_state(net.adam)}

    for epoch in range(start_epoch, params.epochs):
        clock = _EpochClock(epoch, channel, meter)
        losses, weights = [], []
        clipped = {"delta": 0}
        for index, rows_b in enumerate(_batches(rows, params.batch_size, params.seed, epoch)):
            tag = f"hnn/{session}/{epoch}/{index}"
            count = len(rows_b)
            for h in hosts:
                with meter:
                    enc = _encrypt_shares(layouts[h], shares[h], partial(gpu.encrypt_raw, secret), n, threads)
                channel.send(h, tag + "/w", {"w": enc.to_bytes()})
            z_hosts = np.zeros((count, params.interactive_units))
            for h in hosts:
                message = channel.recv(h, tag + "/z")
                lay = layouts[h]
                vector = _vector(message.get("z"), key, math.ceil(count / lay.per_forward), f"{me}: forward from {h}")
                with meter:
                    z_hosts += _guest_forward_open(
                        lay, secret, vector, shares[h], count, n, threads, f"{me}: forward from {h}"
                    )
            out = net.forward(X[rows_b], z_hosts)
            loss, grad = _head(params.objective, out, y[rows_b])
            losses.append(loss)
            weights.append(count)
            delta = net.backward(grad, count)
            lay0 = layouts[hosts[0]]
            with meter:
                by_row, by_column, d_q, n_clip = _encode_delta(
                    lay0, delta, partial(gpu.encrypt_raw, secret), n, threads
                )
            clipped["delta"] += n_clip
            channel.send(hosts, tag + "/delta", {"row": by_row.to_bytes(), "column": by_column.to_bytes()})
            c = _lr_multiplier(params, count)
            for h in hosts:
                lay = layouts[h]
                message = channel.recv(h, tag + "/grad")
                where = f"{me}: gradient from {h}"
                grad_v = _vector(message.get("grad"), key, lay.d_h, where)
                back_v = _vector(message.get("back"), key, math.ceil(count / lay.per_group) * lay.d_h, where)
                with meter:
                    masked = []
                    for v in cv.decrypt_centered(secret, grad_v, n, threads):
                        masked += cv.unpack_signed(v, lay.w_g, lay.d_i, where)
                    u = _guest_back_open(lay, secret, back_v, d_q, shares[h], n, threads, where)
                channel.send(h, tag + "/u", {"u": u})
                shares[h] = shares[h] - _scaled_floor(masked, c).reshape(lay.d_h, lay.d_i)
        model.shares = shares
        loss = float(np.average(losses, weights=weights))
        clock.close(model.history, on_epoch, snapshot(epoch + 1), loss=loss, clipped=clipped)
    return model


# ----------------------------------------------------------------------------- prediction


def predict_guest(
    channel: Channel, hosts: list[str], X: np.ndarray, model: HeteroNNGuestModel, session: str
) -> np.ndarray:
    """Scores for the rows of ``X`` (aligned with every host's rows): probabilities or values."""
    me = f"guest {channel.party!r}"
    params = model.params
    X = _check_features(X, me)
    rows = X.shape[0]
    secret = cv.generate_keypair(params.key_bits, precompute=True)
    key = secret.encryption_key
    n = int.from_bytes(key.n_bytes(), "big")
    channel.send(hosts, f"hnnp/{session}/hello", {"rows": rows, "key": key.to_bytes()})
    replies = {h: channel.recv(h, f"hnnp/{session}/hello") for h in hosts}
    for h in hosts:
        if replies[h].get("error"):
            raise ProtocolError(f"{me}: {h} cannot predict: {replies[h]['error']}")
        if replies[h].get("rows") != rows:
            raise DataProblemError(f"{me}: {h} has {replies[h].get('rows')} rows to score, {me} has {rows}")
    layouts = {h: _Layout(params, model.shares[h].shape[0], n) for h in hosts}
    outputs = []
    for start in range(0, rows, PREDICT_BATCH):
        part = slice(start, min(rows, start + PREDICT_BATCH))
        count = part.stop - part.start
        tag = f"hnnp/{session}/{start}"
        for h in hosts:
            enc = _encrypt_shares(layouts[h], model.shares[h], partial(gpu.encrypt_raw, secret), n, params.threads)
            channel.send(h, tag + "/w", {"w": enc.to_bytes()})
        z_hosts = np.zeros((count, params.interactive_units))
        for h in hosts:
            lay = layouts[h]
            vector = _vector(
                channel.recv(h, tag + "/z").get("z"), key, math.ceil(count / lay.per_forward), f"{me}: {h}"
            )
            z_hosts += _guest_forward_open(lay, secret, vector, model.shares[h], count, n, params.threads, f"{me}: {h}")
        outputs.append(model.net.forward(X[part], z_hosts, keep=False))
    return _predictions(params.objective, np.vstack(outputs))
