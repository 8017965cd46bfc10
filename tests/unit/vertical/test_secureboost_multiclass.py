"""Multi-class SecureBoost (multi:softprob): lossless against the plaintext reference, prediction
protocol, accuracy next to XGBoost on the same bins, bad input named."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from confide.errors import InvalidParameterError
from confide.vertical import secureboost as sb
from confide.vertical.channel import run_parties

from .test_secureboost import leaves, reference_fit, same_bins, secure_fit, walk


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return X[order].astype(np.float64), y[order].astype(np.float64)


@pytest.mark.slow
def test_secure_multiclass_trees_equal_the_plaintext_reference(digits):
    X, y = digits
    X, y = X[:500], y[:500]
    params = sb.SecureBoostParams(objective="multi:softprob", num_class=10, n_trees=2, max_depth=2)
    results, channels = secure_fit(X[:, :32], [X[:, 32:]], y, params)
    reference = reference_fit(X[:, :32], [X[:, 32:]], y, params)
    secure = results["guest"]
    assert len(secure.trees) == 2 * 10  # one tree per class per round
    assert secure.splits() == reference.splits()
    assert leaves(secure) == leaves(reference)
    assert [e["class"] for e in secure.history] == list(range(10)) * 2
    assert any(owner >= 0 for tree in secure.splits() for _, owner, _, _ in tree), "no host split was exercised"

    # Prediction through the protocol = the same trees walked with the host's thresholds.
    lookup = results["host0"]
    out = run_parties(
        {
            "guest": lambda: sb.predict_guest(channels["guest"], secure, X[:50, :32], "p"),
            "host0": lambda: sb.serve_host(channels["host0"], "guest", X[:50, 32:], "p", model=lookup),
        }
    )
    margin = np.zeros((50, 10))
    for j, tree in enumerate(secure.trees):
        for i in range(50):
            node = tree[0]
            while node.owner is not None:
                if node.owner < 0:
                    left = X[i, node.feature] < node.threshold
                else:
                    feature, threshold = lookup.lookup[node.record]
                    left = X[i, 32 + feature] < threshold
                node = tree[node.left] if left else tree[node.right]
            margin[i, j % 10] += node.weight
    probabilities = out["guest"]
    assert probabilities.shape == (50, 10)
    np.testing.assert_allclose(probabilities, sb.softmax(margin), rtol=0, atol=1e-12)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-12)


def test_multiclass_accuracy_within_001_of_xgboost_on_the_same_bins(digits):
    xgb = pytest.importorskip("xgboost")
    X, y = digits
    train, test = slice(0, 1400), slice(1400, None)
    params = sb.SecureBoostParams(objective="multi:softprob", num_class=10, n_trees=10, max_depth=3)
    bins, pooled = same_bins(X, train, 32)
    model = sb.fit_reference(bins[0][:, train], [bins[1][:, train]], y[train], params)
    columns = np.arange(len(y))[test]
    margin = np.zeros((len(columns), 10))
    for j, tree in enumerate(model.trees):
        margin[:, j % 10] += [walk(bins, tree, c) for c in columns]
    booster = xgb.train(
        {
            "max_depth": 3,
            "eta": 0.3,
            "reg_lambda": 1.0,
            "min_child_weight": 1.0,
            "tree_method": "hist",
            "max_bin": 64,
            "objective": "multi:softprob",
            "num_class": 10,
            "nthread": 1,
        },
        xgb.DMatrix(pooled[train], label=y[train]),
        10,
    )
    ours = float(np.mean(margin.argmax(axis=1) == y[test]))
    theirs = float(np.mean(booster.predict(xgb.DMatrix(pooled[test])).argmax(axis=1) == y[test]))
    assert ours > 0.85 and abs(ours - theirs) <= 0.01, (ours, theirs)


def test_multiclass_bad_input_is_named(digits):
    X, y = digits
    with pytest.raises(InvalidParameterError, match="num_class must be an int in 3..1000"):
        sb.SecureBoostParams(objective="multi:softprob")
    with pytest.raises(InvalidParameterError, match="num_class must be unset for binary:logistic"):
        sb.SecureBoostParams(num_class=3)
    with pytest.raises(InvalidParameterError, match="base_score must be unset for multi:softprob"):
        sb.SecureBoostParams(objective="multi:softprob", num_class=3, base_score=0.5)
    params = sb.SecureBoostParams(objective="multi:softprob", num_class=5, n_trees=1, max_depth=2)
    with pytest.raises(InvalidParameterError, match=r"num_class 5 needs labels 0..4, found [5-9]\b"):
        secure_fit(X[:200, :32], [X[:200, 32:]], y[:200], params)


@pytest.mark.parametrize("classes", [3, 10])
@pytest.mark.slow
def test_packed_classes_give_the_reference_trees_with_one_gradient_vector_per_round(digits, classes):
    X, y = digits
    X, y = X[:400], (y[:400] % classes)
    params = sb.SecureBoostParams(
        objective="multi:softprob", num_class=classes, n_trees=2, max_depth=2, pack_classes="always"
    )
    # Eight host columns: the guest decrypts one sum per node, host column and bin for every class's
    # tree, and packing is what is under test here, not the width of the host.
    results, channels = secure_fit(X[:, :32], [X[:, 32:40]], y, params)
    secure = results["guest"]
    reference = reference_fit(X[:, :32], [X[:, 32:40]], y, params)
    # The same exact integer sums, read from a wider slot: the reference's trees.
    assert secure.splits() == reference.splits() and leaves(secure) == leaves(reference)
    assert all(e.get("packed_classes") == classes for e in secure.history)
    # The host gets one encrypted gradient vector per round, each row's classes in one ciphertext.
    trees = [m for _, _, m in channels["guest"].received_by("host0") if m.get("op") == "tree"]
    assert [("gh" in m) for m in trees] == ([True] + [False] * (classes - 1)) * 2
    assert all(m["fields"] == classes for m in trees)
    # A cell of 10 classes fills a 2048-bit plaintext on its own: nothing to fold, still exact.
    assert params.cells_per_ciphertext(classes) == (5 if classes == 3 else 1)


def test_auto_packing_follows_the_measured_costs():
    params = sb.SecureBoostParams(objective="multi:softprob", num_class=3, pack_classes="auto")

    def round_of(encrypt_s, decrypt_s, decrypted, cells):
        return [{"encrypt_s": encrypt_s, "host0_decrypt_s": decrypt_s, "host0_decrypted": decrypted,
                 "host0_cells": cells}] * 3  # fmt: skip

    assert not sb.pack_this_round(params, [], 100_000)  # round 0: nothing measured yet
    # 100,000 rows at 30 us an encryption against 0.25 ms per decryption of 1,600-cell nodes: pack.
    big = round_of(3.0, 0.1, 400, 6400)
    assert sb.pack_this_round(params, big, 100_000)
    # 1,000 rows: the saved encryptions cost less than the extra decryptions: do not.
    assert not sb.pack_this_round(params, round_of(0.03, 0.1, 400, 6400), 1_000)
    assert not sb.pack_this_round(sb.SecureBoostParams(objective="multi:softprob", num_class=3,
                                                        pack_classes="never"), big, 100_000)  # fmt: skip
    # 17 classes do not fit one 2048-bit plaintext: never packed.
    many = sb.SecureBoostParams(objective="multi:softprob", num_class=17, pack_classes="always")
    assert many.cells_per_ciphertext(17) == 0 and not sb.pack_this_round(many, [], 100_000)
    with pytest.raises(InvalidParameterError, match="pack_classes must be auto, always or never"):
        sb.SecureBoostParams(objective="multi:softprob", num_class=3, pack_classes="yes")
