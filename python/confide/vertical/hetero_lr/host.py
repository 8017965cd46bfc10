"""A host's side of Hetero LR: training and prediction."""

from __future__ import annotations

import time

import numpy as np

from confide import _native
from confide.crypto import gpu
from confide.crypto import vectors as cv
from confide.errors import InvalidParameterError, ProtocolError
from confide.vertical.channel import Channel
from confide.vertical.hetero_lr.model import (
    HeteroLRHostModel,
    _batches,
    _check_batch_privacy,
    _check_features,
    _check_party_names,
    _Optimizer,
    _quantize,
    _scaling_of,
)
from confide.vertical.hetero_lr.params import HeteroLRParams
from confide.vertical.hetero_lr.protocol import (
    _affine_gradient,
    _big_fixed,
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


def train_host(
    channel: Channel,
    guest: str,
    hosts: list[str],
    X: np.ndarray,
    params: HeteroLRParams,
    session: str,
    *,
    on_epoch=None,
    resume: dict | None = None,
) -> HeteroLRHostModel:
    """Run one host's side of training.

    ``hosts`` is the same ordered list the guest got: ``hosts[0]`` draws K_H and decrypts the
    guest's masked values. ``on_epoch``, ``resume``: as the guest's.
    """
    start_epoch = int(resume["epoch"]) if resume else 0
    if not isinstance(params, HeteroLRParams):
        raise InvalidParameterError(f"params must be a HeteroLRParams, got {type(params).__name__}")
    if not isinstance(guest, str) or not guest:
        raise InvalidParameterError(f"guest must be a party name, got {guest!r}")
    hosts = _check_party_names(guest, hosts, session)
    if channel.party not in hosts:
        raise InvalidParameterError(f"hosts must contain this party {channel.party!r}, got {hosts!r}")
    me = f"host {channel.party!r}"
    key_host = hosts[0]
    is_key_host = channel.party == key_host
    others = [h for h in hosts if h != channel.party]
    setup_start = time.perf_counter()
    meter = cv.Meter()

    own_error: Exception | None = None
    rows = columns = -1
    try:
        X = _check_features(X, me, min_columns=1)
        rows, columns = X.shape
        _check_batch_privacy(params, rows, columns, me)
    except InvalidParameterError as error:
        own_error = error
    secret = None
    key_bytes = b""
    if is_key_host and own_error is None:
        with meter:
            secret = cv.generate_keypair(params.key_bits)
        key_bytes = secret.encryption_key.to_bytes()
    hello = _hello(own_error, rows, columns, params, key_bytes, start_epoch)
    channel.send([guest, *others] if is_key_host else [guest], f"hlr-hello/{session}", hello)

    problems: list[Exception] = []
    message = channel.recv(guest, f"hlr-hello/{session}")
    problems += _peer_problems(message, guest, rows, params, me, start_epoch)
    if message.get("hosts", hosts) != hosts:
        problems.append(InvalidParameterError(f"hosts differ: {me} has {hosts}, the guest has {message.get('hosts')}"))
    guest_key = None
    if not message.get("error"):
        try:
            guest_key = _public_key(message.get("key"), guest)
        except ProtocolError as error:
            problems.append(error)
    guest_columns = message.get("n_features")
    host_key = secret.encryption_key if secret is not None else None
    if not is_key_host:
        peer = channel.recv(key_host, f"hlr-hello/{session}")
        if not peer.get("error"):
            try:
                host_key = _public_key(peer.get("key"), key_host)
            except ProtocolError as error:
                problems.append(error)
    _raise_first(own_error, problems)
    start_message = channel.recv(guest, f"hlr-start/{session}")
    if not start_message.get("ok"):
        raise ProtocolError(f"guest {guest!r} stopped the training: {start_message.get('error')}")
    assert guest_key is not None and host_key is not None
    if not isinstance(guest_columns, int) or isinstance(guest_columns, bool) or guest_columns < 0:
        raise ProtocolError(f"hello from {guest}: field 'n_features' must be a non-negative integer")

    n_guest = cv.modulus(guest_key)
    width_guest = cv.byte_width(guest_key)
    mask_bits = min(guest_key.bits, host_key.bits) - 2
    F = params.fixed_point_bits
    threads = params.threads
    u_encryptor = secret if secret is not None else host_key
    scaling = _scaling_of(X, params.feature_bits)
    standard = scaling.standardize(X)
    codes = _quantize(standard, scaling)
    weights = np.zeros(columns)
    optimizer = _Optimizer(params, columns)
    if resume:
        weights, optimizer, _ = _resumed(resume, columns, params, me)
    model = HeteroLRHostModel(weights=weights.copy(), scaling=scaling, guest=guest, hosts=list(hosts))
    model.setup_seconds = time.perf_counter() - setup_start
    position = hosts.index(channel.party)

    base_round = channel.round
    for epoch in range(start_epoch, params.epochs):
        channel.round = base_round + 1 + epoch
        start, crypto0 = time.perf_counter(), meter.seconds
        sent0, got0 = channel.bytes_sent, channel.bytes_received
        for batch, index in enumerate(_batches(rows, params.batch_size, params.seed, epoch)):
            tag = f"{session}/{epoch}/{batch}"
            size = index.size
            z_own = standard[index] @ weights
            U_own = _fixed(0.25 * z_own, F, f"the partial score of {me}")
            with meter:
                u_for_guest = gpu.encrypt_i64(u_encryptor, U_own, "fixed_base", threads)
            channel.send(guest, f"hlr-u/{tag}", {"u": u_for_guest.to_bytes()})
            if others:
                with meter:
                    u_for_hosts = gpu.encrypt_i64(guest_key, U_own, "fixed_base", threads)
                channel.send(others, f"hlr-uh/{tag}", {"u": u_for_hosts.to_bytes()})

            encrypted_d = _vector_field(
                channel.recv(guest, f"hlr-d/{tag}"), "d", guest_key, guest, f"hlr-d/{tag}", size
            )
            peer_u = {
                h: _vector_field(channel.recv(h, f"hlr-uh/{tag}"), "u", guest_key, h, f"hlr-uh/{tag}", size)
                for h in others
            }
            with meter:
                d_full = encrypted_d.add_plain_i64(U_own, threads)
                if peer_u:
                    d_full = _native.CiphertextVector.sum([d_full, *peer_u.values()], threads)
                gradient, exponent = _affine_gradient(d_full, codes[:, index], scaling, threads, with_sum=False)
                masks = cv.positive_masks(columns, mask_bits)
                gradient = cv.mask_vector(gradient, masks, guest_key, n_guest, threads)
            channel.send(guest, f"hlr-hg/{tag}", {"grad": gradient.to_bytes()})

            # This host's share of the loss: sum z^2 / 8, its L2 term, cross terms with later hosts.
            plain = _big_fixed(float(z_own @ z_own) / 8.0, 2 * F) + _big_fixed(
                0.5 * size * params.l2 * float(weights @ weights), 2 * F
            )
            later = [peer_u[h] for h in hosts[position + 1 :]]
            cross = None
            if later:
                with meter:
                    later_sum = later[0] if len(later) == 1 else _native.CiphertextVector.sum(later, threads)
                    cross = cv.signed_dot(later_sum, _fixed(z_own, F, f"the partial score of {me}"), threads)
            if not is_key_host:
                with meter:
                    share = gpu.encrypt_raw(guest_key, cv.raw_plaintexts([plain], n_guest), "fixed_base", threads)
                    if cross is not None:
                        share = share.add(cross, threads)
                channel.send(key_host, f"hlr-lh/{tag}", {"loss": share.to_bytes()})
            else:
                gg_tag = f"hlr-gg/{tag}"
                incoming = _vector_field(
                    channel.recv(guest, gg_tag), "grad", host_key, guest, gg_tag, guest_columns + 2
                )
                shares = [
                    _vector_field(channel.recv(h, f"hlr-lh/{tag}"), "loss", guest_key, h, f"hlr-lh/{tag}", 1)
                    for h in others
                ]
                with meter:
                    values = [int.from_bytes(v, "big") for v in gpu.decrypt_raw(secret, incoming, threads)]
                    total = gpu.encrypt_raw(
                        guest_key, cv.raw_plaintexts([values[-1] + plain], n_guest), "fixed_base", threads
                    )
                    extra = ([cross] if cross is not None else []) + shares
                    if extra:
                        total = _native.CiphertextVector.sum([total, *extra], threads)
                channel.send(
                    guest,
                    f"hlr-ggr/{tag}",
                    {"masked": cv.pack_fixed(values[:-1], cv.byte_width(host_key)), "loss": total.to_bytes()},
                )

            hgr_tag = f"hlr-hgr/{tag}"
            values = cv.unpack_fixed(
                channel.recv(guest, hgr_tag).get("masked"), width_guest, columns, f"message {hgr_tag!r}"
            )
            clear = cv.unmask(values, masks, n_guest, f"message {hgr_tag!r} from {guest}")
            grad = np.array([c / (1 << (F + exponent)) / size for c in clear]) + params.l2 * weights
            weights = optimizer.step(weights, grad, epoch)

        control = channel.recv(guest, f"hlr-ctl/{session}/{epoch}")
        model.history.append(_epoch_record(epoch, None, start, meter.seconds - crypto0, channel, sent0, got0))
        if control.get("stop") is not False and epoch < params.epochs - 1:
            model.history[-1]["stopped_early"] = True
        if on_epoch is not None:
            state = _snapshot(epoch + 1, weights, optimizer, None)
            on_epoch(model.history[-1], lambda state=state: state)
        if control.get("stop") is not False:
            break

    model.weights = weights.copy()
    return model


def predict_host(channel: Channel, guest: str, X: np.ndarray, model: HeteroLRHostModel, session: str) -> None:
    """A host's side of :func:`predict_guest`: sends ``z_j = X_j w_j`` for its rows."""
    if not isinstance(model, HeteroLRHostModel):
        raise InvalidParameterError(f"model must be a HeteroLRHostModel, got {type(model).__name__}")
    if not isinstance(session, str) or not session:
        raise InvalidParameterError(f"session must be a non-empty string, got {session!r}")
    me = f"host {channel.party!r}"
    own_error: Exception | None = None
    rows = -1
    try:
        X = _check_features(X, me, min_columns=1)
        rows = X.shape[0]
        if X.shape[1] != model.n_features:
            raise InvalidParameterError(f"X of {me} has {X.shape[1]} columns, the model {model.n_features}")
    except InvalidParameterError as error:
        own_error = error
    hello = channel.recv(guest, f"hlr-p0/{session}")
    guest_rows = hello.get("n_rows")
    mismatch = None
    if own_error is None and not hello.get("error") and guest_rows != rows:
        mismatch = InvalidParameterError(f"row counts differ: {me} has {rows} rows, guest {guest!r} has {guest_rows}")
    reply: dict = {"n_rows": rows, "error": "" if own_error is None else str(own_error)}
    if own_error is None and mismatch is None and not hello.get("error"):
        reply["z"] = model.scaling.standardize(X) @ model.weights
    channel.send(guest, f"hlr-p1/{session}", reply)
    if own_error is not None:
        raise own_error
    if hello.get("error"):
        raise ProtocolError(f"guest {guest!r} cannot predict: {hello['error']}")
    if mismatch is not None:
        raise mismatch
