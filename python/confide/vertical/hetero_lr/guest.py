"""The guest's side of Hetero LR: training and prediction."""

from __future__ import annotations

import math
import time

import numpy as np

from confide import _native
from confide.crypto import gpu
from confide.crypto import vectors as cv
from confide.errors import InvalidParameterError, ProtocolError
from confide.vertical.channel import Channel
from confide.vertical.hetero_lr.model import (
    HeteroLRGuestModel,
    _batches,
    _check_batch_privacy,
    _check_features,
    _check_labels,
    _check_party_names,
    _converged,
    _Optimizer,
    _quantize,
    _scaling_of,
)
from confide.vertical.hetero_lr.params import PROTOCOL, HeteroLRParams
from confide.vertical.hetero_lr.protocol import (
    _affine_gradient,
    _epoch_record,
    _fixed,
    _hello,
    _peer_problems,
    _public_key,
    _raise_first,
    _resumed,
    _snapshot,
    _vector_field,
)


def train_guest(
    channel: Channel,
    hosts: list[str],
    X: np.ndarray,
    y: np.ndarray,
    params: HeteroLRParams,
    session: str,
    *,
    on_epoch=None,
    resume: dict | None = None,
) -> HeteroLRGuestModel:
    """Run the guest's side of training (see the module docstring for the protocol).

    ``X`` holds the guest's columns (rows aligned with every host's), ``y`` the 0/1 labels;
    ``hosts[0]`` is the key host. Returns the guest's model; the hosts return theirs.
    ``on_epoch(entry, snapshot)``: after every epoch, with its record and a callable returning
    the guest's training state (for a checkpoint). ``resume``: such a state; training continues
    with the next epoch (every host must resume from the same one).
    """
    start_epoch = int(resume["epoch"]) if resume else 0
    if not isinstance(params, HeteroLRParams):
        raise InvalidParameterError(f"params must be a HeteroLRParams, got {type(params).__name__}")
    me = f"guest {channel.party!r}"
    hosts = _check_party_names(channel.party, hosts, session)
    key_host = hosts[0]
    setup_start = time.perf_counter()
    meter = cv.Meter()

    own_error: Exception | None = None
    rows = columns = -1
    try:
        X = _check_features(X, me, min_columns=0)
        rows, columns = X.shape
        y = _check_labels(y, rows, me)
        _check_batch_privacy(params, rows, columns + 1, me)
    except InvalidParameterError as error:
        own_error = error
    secret = None
    key_bytes = b""
    if own_error is None:
        with meter:
            secret = cv.generate_keypair(params.key_bits)
        key_bytes = secret.encryption_key.to_bytes()
    hello = _hello(own_error, rows, columns, params, key_bytes, start_epoch)
    hello["hosts"] = list(hosts)
    channel.send(hosts, f"hlr-hello/{session}", hello)

    problems: list[Exception] = []
    host_columns: dict[str, int] = {}
    host_key = None
    for host in hosts:
        message = channel.recv(host, f"hlr-hello/{session}")
        problems += _peer_problems(message, host, rows, params, me, start_epoch)
        host_columns[host] = message.get("n_features") if isinstance(message.get("n_features"), int) else -1
        if host_columns[host] < 1 and not message.get("error"):
            problems.append(ProtocolError(f"hello from {host}: field 'n_features' must be a positive integer"))
        if host == key_host and not message.get("error"):
            try:
                host_key = _public_key(message.get("key"), host)
            except ProtocolError as error:
                problems.append(error)
    first = own_error or next(iter(problems), None)
    channel.send(hosts, f"hlr-start/{session}", {"ok": first is None, "error": "" if first is None else str(first)})
    _raise_first(own_error, problems)
    assert secret is not None and host_key is not None

    guest_key = secret.encryption_key
    n_guest, n_host = cv.modulus(guest_key), cv.modulus(host_key)
    width_host = cv.byte_width(host_key)
    mask_bits = min(guest_key.bits, host_key.bits) - 2
    F = params.fixed_point_bits
    threads = params.threads
    scaling = _scaling_of(X, params.feature_bits)
    standard = scaling.standardize(X)
    codes = _quantize(standard, scaling)
    signs = 2.0 * y - 1.0
    weights = np.zeros(columns + 1)  # [w_G..., b]
    optimizer = _Optimizer(params, columns + 1)
    losses: list[float] = []
    if resume:
        weights, optimizer, losses = _resumed(resume, columns + 1, params, me)
    model = HeteroLRGuestModel(
        weights=weights[:-1].copy(), intercept=0.0, scaling=scaling, hosts=list(hosts), history=[]
    )
    model.setup_seconds = time.perf_counter() - setup_start

    base_round = channel.round
    for epoch in range(start_epoch, params.epochs):
        channel.round = base_round + 1 + epoch
        start, crypto0 = time.perf_counter(), meter.seconds
        sent0, got0 = channel.bytes_sent, channel.bytes_received
        loss_sum = 0.0
        for batch, index in enumerate(_batches(rows, params.batch_size, params.seed, epoch)):
            tag = f"{session}/{epoch}/{batch}"
            size = index.size
            z_guest = standard[index] @ weights[:-1] + weights[-1]
            d_guest = 0.25 * z_guest - 0.5 * signs[index]
            D_guest = _fixed(d_guest, F, "the guest's fore-gradient")
            with meter:
                encrypted_d = gpu.encrypt_i64(secret, D_guest, "fixed_base", threads)
            channel.send(hosts, f"hlr-d/{tag}", {"d": encrypted_d.to_bytes()})

            parts = [
                _vector_field(channel.recv(h, f"hlr-u/{tag}"), "u", host_key, h, f"hlr-u/{tag}", size) for h in hosts
            ]
            with meter:
                u_sum = parts[0] if len(parts) == 1 else _native.CiphertextVector.sum(parts, threads)
                d_full = u_sum.add_plain_i64(D_guest, threads)
                gradient, exponent = _affine_gradient(d_full, codes[:, index], scaling, threads, with_sum=True)
                coefficients = _fixed(z_guest - 2.0 * signs[index], F, "the guest's loss coefficients")
                loss_part = cv.signed_dot(u_sum, coefficients, threads)
                masks = cv.positive_masks(columns + 2, mask_bits)
                outgoing = cv.from_elements([*cv.elements(gradient), *cv.elements(loss_part)], host_key)
                outgoing = cv.mask_vector(outgoing, masks, host_key, n_host, threads)
            channel.send(key_host, f"hlr-gg/{tag}", {"grad": outgoing.to_bytes()})

            for host in hosts:
                hg_tag = f"hlr-hg/{tag}"
                masked = _vector_field(channel.recv(host, hg_tag), "grad", guest_key, host, hg_tag, host_columns[host])
                with meter:
                    values = [int.from_bytes(v, "big") for v in gpu.decrypt_raw(secret, masked, threads)]
                channel.send(host, f"hlr-hgr/{tag}", {"masked": cv.pack_fixed(values, cv.byte_width(guest_key))})

            ggr_tag = f"hlr-ggr/{tag}"
            reply = channel.recv(key_host, ggr_tag)
            values = cv.unpack_fixed(
                reply.get("masked"), width_host, columns + 1, f"message {ggr_tag!r} from {key_host}"
            )
            loss_vector = _vector_field(reply, "loss", guest_key, key_host, ggr_tag, 1)
            with meter:
                loss_value = int.from_bytes(gpu.decrypt_raw(secret, loss_vector, threads)[0], "big")
            clear = cv.unmask(values, masks[:-1], n_host, f"message {ggr_tag!r} from {key_host}")
            grad = np.array([c / (1 << (F + exponent)) / size for c in clear[:-1]] + [clear[-1] / (1 << F) / size])
            grad[:-1] += params.l2 * weights[:-1]
            encrypted_loss = cv.unmask([loss_value], masks[-1:], n_guest, f"the loss from {key_host}")[0]
            encrypted_loss = encrypted_loss / (1 << (2 * F)) / size
            plain_loss = (
                math.log(2.0)
                - float(signs[index] @ z_guest) / (2.0 * size)
                + float(z_guest @ z_guest) / (8.0 * size)
                + 0.5 * params.l2 * float(weights[:-1] @ weights[:-1])
            )
            loss_sum += (plain_loss + encrypted_loss) * size
            weights = optimizer.step(weights, grad, epoch)

        losses.append(loss_sum / rows)
        stop = epoch == params.epochs - 1 or _converged(losses, params.tol)
        channel.send(hosts, f"hlr-ctl/{session}/{epoch}", {"stop": bool(stop)})
        model.history.append(_epoch_record(epoch, losses[-1], start, meter.seconds - crypto0, channel, sent0, got0))
        if stop and epoch < params.epochs - 1:
            model.history[-1]["stopped_early"] = True  # converged: a checkpoint of this epoch ends the job
        if on_epoch is not None:
            state = _snapshot(epoch + 1, weights, optimizer, losses)
            on_epoch(model.history[-1], lambda state=state: state)
        if stop:
            model.converged = _converged(losses, params.tol)
            break

    model.weights = weights[:-1].copy()
    model.intercept = float(weights[-1])
    return model


# ------------------------------------------------------------------------------ inference


def predict_guest(
    channel: Channel, hosts: list[str], X: np.ndarray, model: HeteroLRGuestModel, session: str
) -> np.ndarray:
    """Probabilities ``sigmoid(z_G + sum_j z_j)`` for the guest's rows.

    Each host sends its per-row partial scores ``z_j = X_j w_j`` in the clear: that is what
    inference reveals to the guest (as in FATE); hosts learn nothing but the row count.
    """
    if not isinstance(model, HeteroLRGuestModel):
        raise InvalidParameterError(f"model must be a HeteroLRGuestModel, got {type(model).__name__}")
    me = f"guest {channel.party!r}"
    hosts = _check_party_names(channel.party, hosts, session)
    own_error: Exception | None = None
    rows = -1
    try:
        X = _check_features(X, me, min_columns=0)
        rows = X.shape[0]
        if X.shape[1] != model.n_features:
            raise InvalidParameterError(f"X of {me} has {X.shape[1]} columns, the model {model.n_features}")
    except InvalidParameterError as error:
        own_error = error
    hello = {"protocol": PROTOCOL, "n_rows": rows, "error": "" if own_error is None else str(own_error)}
    channel.send(hosts, f"hlr-p0/{session}", hello)
    if own_error is not None:
        raise own_error
    score = model.scaling.standardize(X) @ model.weights + model.intercept
    problems: list[Exception] = []
    for host in hosts:
        tag = f"hlr-p1/{session}"
        reply = channel.recv(host, tag)
        if reply.get("error"):
            problems.append(ProtocolError(f"{host} cannot predict: {reply['error']}"))
            continue
        host_rows = reply.get("n_rows")
        if host_rows != rows:
            problems.append(InvalidParameterError(f"row counts differ: {me} has {rows} rows, {host} has {host_rows}"))
            continue
        partial = reply.get("z")
        if not isinstance(partial, np.ndarray) or partial.dtype != np.float64 or partial.shape != (rows,):
            problems.append(ProtocolError(f"message {tag!r} from {host}: field 'z' must be float64 of shape ({rows},)"))
            continue
        if not np.all(np.isfinite(partial)):
            problems.append(ProtocolError(f"message {tag!r} from {host}: field 'z' holds non-finite values"))
            continue
        score = score + partial
    _raise_first(None, problems)
    return 0.5 + 0.5 * np.tanh(0.5 * score)
