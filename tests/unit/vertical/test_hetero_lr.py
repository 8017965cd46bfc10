"""Hetero LR (two keys, no arbiter): equals the float64 reference, AUC, privacy, bad input."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from confide import _native
from confide.crypto import vectors as cv
from confide.errors import InvalidParameterError, ProtocolError
from confide.vertical import hetero_lr as hlr
from confide.vertical.channel import LocalChannel
from confide.vertical.hetero_lr import model as hlr_model
from confide.vertical.hetero_lr import protocol as hlr_protocol
from tests.fixtures.keys import fixed_native_key
from tests.fixtures.messages import fields

KEY = fixed_native_key()
N_KEY = int.from_bytes(KEY.encryption_key.n_bytes(), "big")


def run_parties(jobs: dict, *, timeout: float = 120.0) -> tuple[dict, dict]:
    """One thread per party; returns (results, errors) by party name."""
    results, errors = {}, {}

    def run(name, job):
        try:
            results[name] = job()
        except BaseException as error:  # noqa: BLE001 - reported to the test
            errors[name] = error

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a party hung"
    return results, errors


def secure_fit(X_guest, X_hosts, y, params, *, session="t", channels=None):
    hosts = [f"h{k + 1}" for k in range(len(X_hosts))]
    channels = channels or LocalChannel.group(["g", *hosts], timeout_s=30.0)
    jobs = {"g": lambda: hlr.train_guest(channels["g"], hosts, X_guest, y, params, session)}
    for k, X in enumerate(X_hosts):
        jobs[hosts[k]] = lambda c=channels[hosts[k]], X=X: hlr.train_host(c, "g", hosts, X, params, session)
    return (*run_parties(jobs), channels)


def secure_predict(channels, models, X_guest, X_hosts, session="p"):
    hosts = [f"h{k + 1}" for k in range(len(X_hosts))]
    jobs = {"g": lambda: hlr.predict_guest(channels["g"], hosts, X_guest, models["g"], session)}
    for k, X in enumerate(X_hosts):
        name = hosts[k]
        jobs[name] = lambda c=channels[name], X=X, m=models[name]: hlr.predict_host(c, "g", X, m, session)
    results, errors = run_parties(jobs)
    assert not errors, errors
    return results["g"]


@pytest.fixture(scope="module")
def breast():
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=42, stratify=y)
    scaler = StandardScaler().fit(X_train)
    reference = LogisticRegression(max_iter=1000).fit(scaler.transform(X_train), y_train)
    sklearn_auc = roc_auc_score(y_test, reference.decision_function(scaler.transform(X_test)))
    return X_train, X_test, y_train.astype(float), y_test, sklearn_auc


def _trained(breast, splits, params):
    X_train, X_test, y_train, y_test, sklearn_auc = breast
    keys: dict[bytes, _native.DecryptionKey] = {}
    real = cv.generate_keypair

    def capture(bits):
        key = real(bits)
        keys[key.encryption_key.to_bytes()] = key
        return key

    parts = np.split(X_train, splits, axis=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cv, "generate_keypair", capture)
        models, errors, channels = secure_fit(parts[0], parts[1:], y_train, params)
    assert not errors, errors
    test_parts = np.split(X_test, splits, axis=1)
    probabilities = secure_predict(channels, models, test_parts[0], test_parts[1:])
    return {
        "models": models,
        "channels": channels,
        "keys": keys,
        "parts": parts,
        "y": y_train,
        "params": params,
        "auc": roc_auc_score(y_test, probabilities),
        "sklearn_auc": sklearn_auc,
        "probabilities": probabilities,
    }


@pytest.fixture(scope="module")
def one_host(breast):
    """Guest: first 10 columns + labels; one host: the other 20. SGD with decay."""
    params = hlr.HeteroLRParams(learning_rate=0.3, decay=0.3, optimizer="sgd", epochs=3, batch_size=64, tol=0.0)
    return _trained(breast, [10], params)


@pytest.fixture(scope="module")
def two_hosts(breast):
    """Guest 10 columns + labels, hosts 10 + 10. Adam (the default optimizer)."""
    params = hlr.HeteroLRParams(epochs=3, batch_size=64, tol=0.0)
    return _trained(breast, [10, 20], params)


# ------------------------------------------------------------------------------ kernels


def _signed(value: int, n: int) -> int:
    value %= n
    return value - n if value > n // 2 else value


def test_dot_u64_native_and_fallback_equal_integer_products():
    rng = np.random.default_rng(1)
    values = rng.integers(-(1 << 40), 1 << 40, 23)
    matrix = rng.integers(0, 1 << 20, (4, 23)).astype(np.uint64)
    matrix[1] = 0
    matrix[2, :5] = (1 << 20) - 1
    vector = KEY.encrypt_i64(values, "fixed_base", 0)
    expected = [sum(int(m) * int(v) for m, v in zip(row, values, strict=True)) for row in matrix]
    for out in (cv.dot_u64(vector, matrix, 0), cv._dot_u64_fallback(vector, matrix, 0)):
        got = [_signed(int.from_bytes(b, "big"), N_KEY) for b in KEY.decrypt_raw(out, 0)]
        assert got == expected
    single = KEY.encrypt_i64(values[:1], "fixed_base", 0)
    out = cv._dot_u64_fallback(single, matrix[:, :1], 0)
    assert [_signed(int.from_bytes(b, "big"), N_KEY) for b in KEY.decrypt_raw(out, 0)] == [
        int(m) * int(values[0]) for m in matrix[:, 0]
    ]


def test_signed_dot_matches_integers():
    rng = np.random.default_rng(2)
    values = rng.integers(-(1 << 30), 1 << 30, 19)
    coefficients = rng.integers(-(1 << 45), 1 << 45, 19)
    out = cv.signed_dot(KEY.encrypt_i64(values, "fixed_base", 0), coefficients, 0)
    got = _signed(int.from_bytes(KEY.decrypt_raw(out, 0)[0], "big"), N_KEY)
    assert got == sum(int(c) * int(v) for c, v in zip(coefficients, values, strict=True))


@pytest.mark.parametrize("bits", [8, 16, 20])
def test_affine_gradient_decodes_to_float64(bits):
    """Encrypted X^T d with unsigned codes + the min/step correction equals the float64 product."""
    rng = np.random.default_rng(bits)
    X = rng.normal(size=(50, 4)) * [1.0, 10.0, 0.01, 3.0] + [0.0, -5.0, 2.0, 0.0]
    X[:, 3] = 7.0  # a constant column
    scaling = hlr_model._scaling_of(X, bits)
    standard = scaling.standardize(X)
    codes = hlr_model._quantize(standard, scaling)
    assert codes.dtype == np.uint64 and codes.shape == (4, 50) and int(codes.max()) < 1 << bits
    fixed = 20
    d = rng.normal(size=50) * 0.7
    D = hlr_protocol._fixed(d, fixed, "d")
    vector, exponent = hlr_protocol._affine_gradient(
        KEY.encrypt_i64(D, "fixed_base", 0), codes, scaling, 0, with_sum=True
    )
    clear = [_signed(int.from_bytes(b, "big"), N_KEY) for b in KEY.decrypt_raw(vector, 0)]
    got = np.array([c / (1 << (fixed + exponent)) for c in clear[:-1]])
    dequantized = hlr_model._dequantize(codes, scaling)
    np.testing.assert_allclose(got, dequantized.T @ (D / (1 << fixed)), rtol=1e-12, atol=1e-9)
    assert clear[-1] == int(D.sum())
    # the quantized product is close to the unquantized one (error ~ step / 2 per entry)
    np.testing.assert_allclose(got, standard.T @ d, atol=50 * float(scaling.quant_step.max()))


# ------------------------------------------------------------------------------ training


@pytest.mark.parametrize("run", ["one_host", "two_hosts"])
def test_secure_weights_match_reference(run, request):
    result = request.getfixturevalue(run)
    models, parts, y, params = result["models"], result["parts"], result["y"], result["params"]
    hosts = [f"h{k + 1}" for k in range(len(parts) - 1)]
    guest = models["g"]
    secure = [guest.weights, *(models[h].weights for h in hosts)]
    exact = hlr.train_plaintext_reference(parts, y, params, quantized=True)
    floating = hlr.train_plaintext_reference(parts, y, params)
    # Same quantized features: only the 2^-20 rounding of d and u differs.
    for mine, theirs in zip(secure, exact.weights, strict=True):
        np.testing.assert_allclose(mine, theirs, atol=2e-6)
    assert guest.intercept == pytest.approx(exact.intercept, abs=2e-6)
    # Float features in the gradient: the quantization (16 bits per column) adds ~1e-5.
    for mine, theirs in zip(secure, floating.weights, strict=True):
        np.testing.assert_allclose(mine, theirs, atol=2e-4)
    assert guest.intercept == pytest.approx(floating.intercept, abs=2e-4)
    losses = [item["loss"] for item in guest.history]
    np.testing.assert_allclose(losses, exact.loss, atol=1e-6)
    assert losses[-1] < losses[0] < np.log(2.0)


@pytest.mark.parametrize("run", ["one_host", "two_hosts"])
def test_auc_within_001_of_sklearn(run, request):
    result = request.getfixturevalue(run)
    assert result["auc"] >= result["sklearn_auc"] - 0.01, (result["auc"], result["sklearn_auc"])
    assert np.all((result["probabilities"] > 0.0) & (result["probabilities"] < 1.0))


def test_history_timings_and_model_round_trip(one_host):
    guest, host = one_host["models"]["g"], one_host["models"]["h1"]
    assert len(guest.history) == len(host.history) == 3
    for item in guest.history + host.history:
        assert item["seconds"] > 0 and 0 < item["crypto_seconds"] <= item["seconds"] * 1.05
        assert item["bytes_sent"] > 0 and item["bytes_received"] > 0
    assert all(item["loss"] is None for item in host.history)
    again = hlr.HeteroLRGuestModel.from_dict(guest.to_dict())
    np.testing.assert_array_equal(again.weights, guest.weights)
    assert again.intercept == guest.intercept and again.hosts == ["h1"]
    np.testing.assert_array_equal(again.scaling.quant_step, guest.scaling.quant_step)
    host_again = hlr.HeteroLRHostModel.from_dict(host.to_dict())
    np.testing.assert_array_equal(host_again.weights, host.weights)
    assert host_again.guest == "g"
    with pytest.raises(InvalidParameterError, match="format"):
        hlr.HeteroLRHostModel.from_dict(guest.to_dict())


@pytest.mark.slow
def test_three_hosts_and_a_guest_without_columns(breast):
    """Loss cross terms between three hosts; the guest holds only the labels (and intercept)."""
    X_train, _, y_train, _, _ = breast
    X, y = X_train[:240], y_train[:240]
    parts = np.split(X, [0, 8, 18], axis=1)
    params = hlr.HeteroLRParams(epochs=2, batch_size=120, tol=0.0)
    models, errors, _ = secure_fit(parts[0], parts[1:], y, params)
    assert not errors, errors
    reference = hlr.train_plaintext_reference(parts, y, params, quantized=True)
    np.testing.assert_allclose([item["loss"] for item in models["g"].history], reference.loss, atol=1e-6)
    assert models["g"].n_features == 0
    assert models["g"].intercept == pytest.approx(reference.intercept, abs=2e-6)
    for k in range(3):
        np.testing.assert_allclose(models[f"h{k + 1}"].weights, reference.weights[k + 1], atol=2e-6)


def test_convergence_stops_every_party_at_the_same_epoch(breast):
    X_train, _, y_train, _, _ = breast
    params = hlr.HeteroLRParams(learning_rate=0.3, optimizer="sgd", epochs=6, batch_size=200, tol=0.05)
    models, errors, _ = secure_fit(X_train[:200, :10], [X_train[:200, 10:]], y_train[:200], params)
    assert not errors, errors
    reference = hlr.train_plaintext_reference([X_train[:200, :10], X_train[:200, 10:]], y_train[:200], params)
    assert models["g"].converged
    assert len(models["g"].history) == len(models["h1"].history) == len(reference.loss) < 6


@pytest.mark.slow
def test_training_resumes_from_an_epoch_snapshot_to_the_uninterrupted_model(breast):
    from confide.vertical import wire

    X_train, _, y_train, _, _ = breast
    X_g, X_h, y = X_train[:240, :10], [X_train[:240, 10:20], X_train[:240, 20:]], y_train[:240]
    params = hlr.HeteroLRParams(learning_rate=0.05, epochs=4, batch_size=80)
    straight, errors, _ = secure_fit(X_g, X_h, y, params, session="a")
    assert not errors, errors
    saved: dict = {}

    def keep(party):
        def hook(entry, snapshot):
            if entry["epoch"] == 1:  # after two epochs: what a checkpoint file holds, through the wire
                saved[party] = wire.decode(wire.encode(snapshot()))

        return hook

    def train(session, hooks=None, resume=None):
        channels = LocalChannel.group(["g", "h1", "h2"], timeout_s=30.0)
        hooks, resume = hooks or {}, resume or {}
        jobs = {
            "g": lambda: hlr.train_guest(
                channels["g"], ["h1", "h2"], X_g, y, params, session, on_epoch=hooks.get("g"), resume=resume.get("g")
            )
        }
        for k, name in enumerate(["h1", "h2"]):
            jobs[name] = lambda c=channels[name], X=X_h[k], n=name: hlr.train_host(
                c, "g", ["h1", "h2"], X, params, session, on_epoch=hooks.get(n), resume=resume.get(n)
            )
        return run_parties(jobs)

    _, errors = train("b", hooks={p: keep(p) for p in ("g", "h1", "h2")})
    assert not errors, errors
    assert saved["g"]["epoch"] == saved["h1"]["epoch"] == 2 and len(saved["g"]["losses"]) == 2
    resumed, errors = train("c", resume=saved)
    assert not errors, errors
    assert [e["epoch"] for e in resumed["g"].history] == [2, 3]
    # Fresh keys and masks, the same fixed-point values: the weights of the uninterrupted run.
    np.testing.assert_allclose(resumed["g"].weights, straight["g"].weights, atol=1e-9)
    assert resumed["g"].intercept == pytest.approx(straight["g"].intercept, abs=1e-9)
    for name in ("h1", "h2"):
        np.testing.assert_allclose(resumed[name].weights, straight[name].weights, atol=1e-9)
    assert resumed["g"].history[-1]["loss"] == pytest.approx(straight["g"].history[-1]["loss"], abs=1e-9)
    # Parties resuming from different epochs are refused, naming both.
    _, errors = train("d", resume={**saved, "h2": {**saved["h2"], "epoch": 1}})
    assert errors and any("resumes after epoch 1" in str(e) for e in errors.values()), errors


# ------------------------------------------------------------------------------ privacy


def _huge(values: list[int], n: int) -> bool:
    """Masked: far beyond any fixed-point value these protocols produce (< 2^300)."""
    return all(abs(_signed(v, n)) > 1 << 1000 for v in values)


def _keys(result):
    """(guest secret key, key host secret key), told apart by the hello each party sent."""
    received = result["channels"]["g"].received_by("h1")
    guest_public = next(m["key"] for s, t, m in received if t.startswith("hlr-hello/"))
    keys = result["keys"]
    host_public = next(k for k in keys if k != guest_public)
    return keys[guest_public], keys[host_public]


@pytest.mark.parametrize("run", ["one_host", "two_hosts"])
def test_hosts_receive_only_ciphertexts_and_masked_values(run, request):
    result = request.getfixturevalue(run)
    guest_key, host_key = _keys(result)
    guest_public, host_public = guest_key.encryption_key, host_key.encryption_key
    n_guest = int.from_bytes(guest_public.n_bytes(), "big")
    n_host = int.from_bytes(host_public.n_bytes(), "big")
    channel = result["channels"]["g"]
    y = result["y"]
    label_patterns = [y.astype(dt).tobytes()[:64] for dt in (np.float64, np.float32, np.int64, np.uint8, np.int32)]
    hosts = sorted(p for p in result["models"] if p != "g")
    kinds_seen = set()
    for host in hosts:
        for sender, tag, message in channel.received_by(host):
            kind = tag.split("/")[0]
            kinds_seen.add(kind)
            for name, value in fields(message):
                assert not isinstance(value, np.ndarray), f"{tag}: array field {name} sent to {host}"
                if isinstance(value, bytes):
                    assert not any(p in value for p in label_patterns), f"{tag}.{name} carries the labels"
            if kind == "hlr-d":  # [[d_G]] under the guest's key: the host cannot decrypt it
                vector = _native.CiphertextVector.from_bytes(message["d"], guest_public)
                assert vector.key_id == guest_public.key_id != host_public.key_id
            elif kind == "hlr-uh":  # another host's [[u_k]] under the guest's key, never seen by the guest
                assert sender in hosts
                _native.CiphertextVector.from_bytes(message["u"], guest_public)
            elif kind == "hlr-lh":  # loss shares for the key host, under the guest's key
                assert host == hosts[0]
                _native.CiphertextVector.from_bytes(message["loss"], guest_public)
            elif kind == "hlr-gg":  # the guest's gradient for the key host: masked before encryption
                vector = _native.CiphertextVector.from_bytes(message["grad"], host_public)
                clear = [int.from_bytes(b, "big") for b in host_key.decrypt_raw(vector, 0)]
                assert _huge(clear, n_host)
            elif kind == "hlr-hgr":  # the host's own gradient as decrypted by the guest: still masked
                width = (guest_public.bits + 7) // 8
                count = result["models"][host].n_features
                values = cv.unpack_fixed(message["masked"], width, count, tag)
                assert _huge(values, n_guest)
            elif kind in ("hlr-hello", "hlr-start", "hlr-ctl", "hlr-p0"):
                # metadata only: counts, flags, the shared integer parameters, error text, public key
                assert not any(isinstance(v, float) for _, v in fields(message)), tag
                if kind == "hlr-hello" and sender == "g":
                    assert message["key"] == guest_public.to_bytes()
            else:
                pytest.fail(f"unexpected message {tag} to {host}")
    assert {"hlr-d", "hlr-gg", "hlr-hgr"} <= kinds_seen
    if len(hosts) > 1:
        assert {"hlr-uh", "hlr-lh"} <= kinds_seen


@pytest.mark.parametrize("run", ["one_host", "two_hosts"])
def test_guest_never_sees_host_features_or_gradients(run, request):
    result = request.getfixturevalue(run)
    guest_key, host_key = _keys(result)
    guest_public, host_public = guest_key.encryption_key, host_key.encryption_key
    n_guest = int.from_bytes(guest_public.n_bytes(), "big")
    n_host = int.from_bytes(host_public.n_bytes(), "big")
    channel = result["channels"]["g"]
    host_parts = result["parts"][1:]
    feature_patterns = []
    for X in host_parts:
        standard = (X - X.mean(axis=0)) / X.std(axis=0)
        feature_patterns += [X[:4].tobytes(), X.T[:, :4].copy().tobytes(), standard[:4].tobytes()]
    for _sender, tag, message in channel.received_by("g"):
        kind = tag.split("/")[0]
        for name, value in fields(message):
            if isinstance(value, bytes):
                assert not any(p in value for p in feature_patterns), f"{tag}.{name} carries host features"
            if isinstance(value, np.ndarray):  # only the partial scores at inference (documented)
                assert kind == "hlr-p1" and name == "z" and value.ndim == 1
        assert kind not in ("hlr-uh", "hlr-lh"), f"{tag}: the guest got a ciphertext under its own key"
        if kind == "hlr-u":  # [[u_k]] under the key host's key: the guest cannot decrypt it
            vector = _native.CiphertextVector.from_bytes(message["u"], host_public)
            assert vector.key_id == host_public.key_id != guest_public.key_id
        elif kind == "hlr-hg":  # a host's gradient: the guest decrypts only gradient + mask
            vector = _native.CiphertextVector.from_bytes(message["grad"], guest_public)
            assert _huge([int.from_bytes(b, "big") for b in guest_key.decrypt_raw(vector, 0)], n_guest)
        elif kind == "hlr-ggr":  # the guest's own gradient, still masked; the loss total is masked too
            width = (host_public.bits + 7) // 8
            values = cv.unpack_fixed(message["masked"], width, result["models"]["g"].n_features + 1, tag)
            assert _huge(values, n_host)
            loss = _native.CiphertextVector.from_bytes(message["loss"], guest_public)
            assert _huge([int.from_bytes(b, "big") for b in guest_key.decrypt_raw(loss, 0)], n_guest)
        else:
            assert kind in ("hlr-hello", "hlr-p1"), tag


def test_masks_are_fresh_wide_and_positive():
    masks = cv.positive_masks(200, 2046)
    assert len(set(masks)) == 200
    assert all(1 << 2045 <= m < 1 << 2046 for m in masks)


# ------------------------------------------------------------------------------ bad input


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, 5))
    y = (X[:, 0] + X[:, 3] > 0).astype(float)
    return X, y


FAST = hlr.HeteroLRParams(epochs=1, batch_size=40, tol=0.0)


def test_small_run_works(small):
    X, y = small
    models, errors, _ = secure_fit(X[:, :2], [X[:, 2:]], y, FAST)
    assert not errors, errors
    assert models["h1"].n_features == 3


def test_host_without_columns_is_refused_on_both_sides(small):
    X, y = small
    _, errors, _ = secure_fit(X[:, :2], [X[:, :0]], y, FAST)
    assert isinstance(errors["h1"], InvalidParameterError)
    assert "host 'h1'" in str(errors["h1"]) and "at least 1 feature column" in str(errors["h1"])
    assert isinstance(errors["g"], ProtocolError) and "h1 cannot train" in str(errors["g"])


def test_second_host_without_columns_stops_everyone(small):
    X, y = small
    _, errors, _ = secure_fit(X[:, :2], [X[:, 2:], X[:, :0]], y, FAST)
    assert isinstance(errors["h2"], InvalidParameterError)
    assert isinstance(errors["g"], ProtocolError)
    assert isinstance(errors["h1"], ProtocolError) and "stopped the training" in str(errors["h1"])


@pytest.mark.parametrize("party", ["guest", "host"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_features_name_party_and_column(small, party, bad):
    X, y = small
    X = X.copy()
    X[7, 1 if party == "guest" else 3] = bad
    _, errors, _ = secure_fit(X[:, :2], [X[:, 2:]], y, FAST)
    me, other = ("g", "h1") if party == "guest" else ("h1", "g")
    assert isinstance(errors[me], InvalidParameterError)
    assert f"{party} '{me}'" in str(errors[me]) and "column 1" in str(errors[me]) and "row 7" in str(errors[me])
    assert isinstance(errors[other], ProtocolError)


@pytest.mark.parametrize(("labels", "message"), [((2.0, 5), "labels must be 0 or 1"), ((np.nan, 3), "non-finite")])
def test_bad_labels(small, labels, message):
    X, y = small
    y = y.copy()
    y[labels[1]] = labels[0]
    _, errors, _ = secure_fit(X[:, :2], [X[:, 2:]], y, FAST)
    assert isinstance(errors["g"], InvalidParameterError) and message in str(errors["g"])
    assert isinstance(errors["h1"], ProtocolError)


def test_row_counts_that_differ_fail_on_both_sides(small):
    X, y = small
    _, errors, _ = secure_fit(X[:, :2], [X[:39, 2:]], y, FAST)
    for party in ("g", "h1"):
        assert isinstance(errors[party], InvalidParameterError)
        assert "row counts differ" in str(errors[party]) and "40" in str(errors[party]) and "39" in str(errors[party])


def test_shared_parameters_must_agree(small):
    X, y = small
    hosts = ["h1"]
    channels = LocalChannel.group(["g", "h1"], timeout_s=30.0)
    other = hlr.HeteroLRParams(epochs=2, batch_size=40, tol=0.0)
    _, errors = run_parties(
        {
            "g": lambda: hlr.train_guest(channels["g"], hosts, X[:, :2], y, FAST, "s"),
            "h1": lambda: hlr.train_host(channels["h1"], "g", hosts, X[:, 2:], other, "s"),
        }
    )
    for party in ("g", "h1"):
        assert isinstance(errors[party], InvalidParameterError) and "shared parameters differ" in str(errors[party])


def test_batches_smaller_than_the_columns_are_refused(small):
    X, y = small
    params = hlr.HeteroLRParams(epochs=1, batch_size=3, tol=0.0)
    _, errors, _ = secure_fit(X[:, :1], [X[:, 1:]], y, params)
    assert isinstance(errors["h1"], InvalidParameterError) and "batch_size" in str(errors["h1"])
    assert isinstance(errors["g"], ProtocolError) and "batch_size" in str(errors["g"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("key_bits", 1024),
        ("learning_rate", 0.0),
        ("epochs", 0),
        ("batch_size", 0),
        ("l2", -1.0),
        ("optimizer", "rmsprop"),
        ("decay", float("nan")),
        ("fixed_point_bits", 4),
        ("feature_bits", 30),
        ("tol", -0.1),
        ("seed", -1),
        ("threads", True),
    ],
)
def test_params_are_validated(field, value):
    with pytest.raises(InvalidParameterError, match=field):
        hlr.HeteroLRParams(**{field: value})


def test_party_lists_are_validated(small):
    X, y = small
    channel = LocalChannel.group(["g", "h1"])["g"]
    with pytest.raises(InvalidParameterError, match="hosts"):
        hlr.train_guest(channel, [], X, y, FAST, "s")
    with pytest.raises(InvalidParameterError, match="guest 'g' cannot also be a host"):
        hlr.train_guest(channel, ["g"], X, y, FAST, "s")
    with pytest.raises(InvalidParameterError, match="session"):
        hlr.train_guest(channel, ["h1"], X, y, FAST, "")


def _toy_models(columns_guest=2, columns_host=3):
    def scaling(columns):
        return hlr_model._Scaling(np.zeros(columns), np.ones(columns), np.zeros(columns), np.ones(columns), 16)

    guest = hlr.HeteroLRGuestModel(np.ones(columns_guest), 0.5, scaling(columns_guest), ["h1"])
    host = hlr.HeteroLRHostModel(np.full(columns_host, -1.0), scaling(columns_host), "g", ["h1"])
    return guest, host


def test_prediction_adds_the_partial_scores():
    guest, host = _toy_models()
    channels = LocalChannel.group(["g", "h1"], timeout_s=30.0)
    X_guest, X_host = np.array([[1.0, 2.0], [0.0, 0.0]]), np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    probabilities = secure_predict(channels, {"g": guest, "h1": host}, X_guest, [X_host])
    np.testing.assert_allclose(probabilities, 1.0 / (1.0 + np.exp(-np.array([3.5 - 2.0, 0.5]))))


def test_prediction_row_mismatch_fails_on_both_sides():
    guest, host = _toy_models()
    channels = LocalChannel.group(["g", "h1"], timeout_s=30.0)
    _, errors = run_parties(
        {
            "g": lambda: hlr.predict_guest(channels["g"], ["h1"], np.zeros((4, 2)), guest, "p"),
            "h1": lambda: hlr.predict_host(channels["h1"], "g", np.zeros((3, 3)), host, "p"),
        }
    )
    for party in ("g", "h1"):
        assert isinstance(errors[party], InvalidParameterError) and "row counts differ" in str(errors[party])
    # no partial score travels when the rows do not match
    assert all("z" not in m for _, _, m in channels["g"].received_by("g"))
