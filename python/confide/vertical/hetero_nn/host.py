"""A host's side of Hetero NN: training and prediction."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from confide.crypto import vectors as cv
from confide.errors import ConfideError, DataProblemError, InvalidParameterError, ProtocolError
from confide.vertical.channel import Channel
from confide.vertical.hetero_nn.model import (
    HeteroNNHostModel,
    _batches,
    _check_features,
    _host_bottom,
    _host_rng,
    _interactive_half,
    _Scaling,
)
from confide.vertical.hetero_nn.params import A_BOUND, E_OFFSET, FA, FD, FW, PREDICT_BATCH, RING, HeteroNNParams
from confide.vertical.hetero_nn.protocol import (
    _adam_from,
    _adam_state,
    _EpochClock,
    _from_ring,
    _hello,
    _host_back,
    _host_forward,
    _host_gradient,
    _Layout,
    _lr_multiplier,
    _peer_problem,
    _public_key,
    _quantize,
    _raise,
    _ring_array,
    _ring_random,
    _scaled_floor,
    _to_ring,
    _vector,
)
from confide.vertical.netlayers import (
    Adam,
)


def train_host(
    channel: Channel,
    guest: str,
    X: np.ndarray,
    params: HeteroNNParams,
    session: str,
    on_epoch: Callable[..., None] | None = None,
    resume: dict | None = None,
) -> HeteroNNHostModel:
    """Host h's side of training. Returns the host's model part (``on_epoch``, ``resume``: as the guest's)."""
    me = f"host {channel.party!r}"
    start_epoch = int(resume["epoch"]) if resume else 0
    meter = cv.Meter()
    hello = channel.recv(guest, f"hnn/{session}/hello")
    own: Exception | None = None
    rows = columns = -1
    try:
        X = _check_features(X, me)
        rows, columns = X.shape
        if columns < 1:
            raise DataProblemError(f"{me}: holds no columns; a host must bring at least one feature")
    except InvalidParameterError as error:
        own = error
    problem = None if own is not None else _peer_problem(hello, guest, rows, params, me, start_epoch)
    hosts = hello.get("hosts") if isinstance(hello.get("hosts"), list) else []
    if own is None and problem is None and channel.party not in hosts:
        problem = ProtocolError(f"{me}: not in the guest's host list {hosts}")
    init = np.zeros((0, 0), dtype=np.uint64)
    share = np.zeros((0, 0), dtype=np.uint64)
    reply_extra: dict = {}
    bottom = None
    if own is None and problem is None:
        try:
            key = _public_key(hello.get("key"), guest, me)
            n = int.from_bytes(key.n_bytes(), "big")
            d_h = params.host_dim(columns)
            if d_h is None:  # a framework bottom: build it now to learn its width
                bottom = _host_bottom(params, columns, None, hosts.index(channel.party), me)
                d_h = bottom.output_dim
            layout = _Layout(params, d_h, n)
        except ConfideError as error:
            problem = error
    if own is None and problem is None:
        rng = _host_rng(params, hosts.index(channel.party))
        half = _interactive_half(rng, d_h, params.interactive_units, 1 + len(hosts))
        share = _ring_random((d_h, params.interactive_units))
        init = _to_ring(half, FW) - share
        reply_extra = {"resume_epoch": start_epoch, "bottom_dim": d_h, **({"init": init} if resume is None else {})}
    channel.send(guest, f"hnn/{session}/hello", _hello(own or problem, rows, columns, params, reply_extra))
    _raise(own, [problem] if problem else [])
    threads = params.threads
    scaling = _Scaling.fit(X)
    if bottom is None:
        bottom = _host_bottom(params, columns, rng, hosts.index(channel.party), me)
    bottom.standardize_inputs(scaling.mean, scaling.std)
    adam = Adam(params.learning_rate)
    model = HeteroNNHostModel(params, scaling, bottom, share)
    if resume is not None:
        model = HeteroNNHostModel.from_dict(resume["model"])
        bottom, share, scaling = model.bottom, model.share, model.scaling
        adam = _adam_from(resume.get("adam"), params.learning_rate)
        if share.shape != (d_h, params.interactive_units) or bottom.input_dim != columns:
            raise ProtocolError(
                f"{me}: the checkpoint does not fit this data ({bottom.input_dim} columns, {columns} now)"
            )

    def snapshot(epoch_done: int) -> Callable[[], dict]:
        return lambda: {"epoch": epoch_done, "model": model.to_dict(), "adam": _adam_state(adam)}

    for epoch in range(start_epoch, params.epochs):
        clock = _EpochClock(epoch, channel, meter)
        clipped = {"activation": 0}
        for index_b, rows_b in enumerate(_batches(rows, params.batch_size, params.seed, epoch)):
            tag = f"hnn/{session}/{epoch}/{index_b}"
            count = len(rows_b)
            where = f"{me}: batch {index_b} of epoch {epoch + 1}"
            a = bottom.forward(X[rows_b])
            message = channel.recv(guest, tag + "/w")
            bases = _vector(message.get("w"), key, layout.per_forward * layout.d_h, where)
            with meter:
                z, n_clip = _host_forward(layout, bases, a, share, key, n, threads)
            clipped["activation"] += n_clip
            channel.send(guest, tag + "/z", {"z": z.to_bytes()})
            message = channel.recv(guest, tag + "/delta")
            by_row = _vector(message.get("row"), key, count, where)
            by_column = _vector(message.get("column"), key, math.ceil(count / layout.per_group) * layout.d_i, where)
            a_q, _ = _quantize(a, FA, A_BOUND)
            with meter:
                gradient, grad_masks = _host_gradient(
                    layout, by_row, (a_q + E_OFFSET).astype(np.uint64), key, n, threads
                )
                back, back_masks = _host_back(layout, by_column, share, count, key, n, threads)
            channel.send(guest, tag + "/grad", {"grad": gradient.to_bytes(), "back": back.to_bytes()})
            message = channel.recv(guest, tag + "/u")
            u = _ring_array(message.get("u"), (count, layout.d_h), where)
            r = np.array([v % RING for v in back_masks.reshape(-1)], dtype=np.uint64).reshape(count, layout.d_h)
            grad_a = _from_ring(u - r, FD + FW)
            grad_a = np.where(np.abs(a) <= A_BOUND, grad_a, 0.0)  # clipped activations pass no gradient
            grads, _ = bottom.backward(grad_a, input_grad=False)
            if grads:
                adam.step(bottom.params(), [g / count for g in grads])
            c = _lr_multiplier(params, count)
            flat = [v for row in grad_masks for v in row]
            share = share + _scaled_floor(flat, c).reshape(layout.d_h, layout.d_i)
        model.share = share
        clock.close(model.history, on_epoch, snapshot(epoch + 1), clipped=clipped)
    model.share = share
    return model


def predict_host(channel: Channel, guest: str, X: np.ndarray, model: HeteroNNHostModel, session: str) -> None:
    """Host h's side of prediction (one forward pass over its rows)."""
    me = f"host {channel.party!r}"
    hello = channel.recv(guest, f"hnnp/{session}/hello")
    error = None
    rows = -1
    try:
        X = _check_features(X, me)
        rows = X.shape[0]
        if X.shape[1] != model.bottom.input_dim:
            raise DataProblemError(f"{me}: model was trained on {model.bottom.input_dim} columns, got {X.shape[1]}")
    except InvalidParameterError as exc:
        error = exc
    channel.send(guest, f"hnnp/{session}/hello", {"rows": rows, "error": None if error is None else str(error)})
    if error is not None:
        raise error
    if hello.get("rows") != rows:
        raise DataProblemError(f"{me}: {guest} has {hello.get('rows')} rows to score, {me} has {rows}")
    key = _public_key(hello.get("key"), guest, me)
    n = int.from_bytes(key.n_bytes(), "big")
    params = model.params
    layout = _Layout(params, model.share.shape[0], n)
    for start in range(0, rows, PREDICT_BATCH):
        part = slice(start, min(rows, start + PREDICT_BATCH))
        tag = f"hnnp/{session}/{start}"
        bases = _vector(channel.recv(guest, tag + "/w").get("w"), key, layout.per_forward * layout.d_h, me)
        z, _ = _host_forward(
            layout,
            bases,
            model.bottom.forward(X[part], keep=False),
            model.share,
            key,
            n,
            params.threads,
        )
        channel.send(guest, tag + "/z", {"z": z.to_bytes()})
