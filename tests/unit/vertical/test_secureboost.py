"""SecureBoost: the secure protocol equals the plaintext reference split for split; privacy; bad input."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import roc_auc_score

from confide import _native
from confide.errors import InvalidParameterError
from confide.vertical import secureboost as sb
from confide.vertical.binning import Binner
from confide.vertical.channel import LocalChannel, run_parties
from tests.fixtures.keys import fixed_native_key

KEY = fixed_native_key()


@pytest.fixture(scope="module")
def breast():
    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return X[order], y[order].astype(float)


def secure_fit(X_guest, X_hosts, y, params, *, channels=None):
    names = ["guest"] + [f"host{k}" for k in range(len(X_hosts))]
    channels = channels or LocalChannel.group(names)
    jobs = {"guest": lambda: sb.train_guest(channels["guest"], names[1:], X_guest, y, params, "t", key=KEY)}
    for k, X in enumerate(X_hosts):
        jobs[names[k + 1]] = lambda c=channels[names[k + 1]], X=X: sb.serve_host(c, "guest", X, "t")
    return run_parties(jobs), channels


def reference_fit(X_guest, X_hosts, y, params):
    guest_bins = Binner.fit(X_guest, params.n_bins).transform(X_guest)
    host_bins = [Binner.fit(X, params.n_bins).transform(X) for X in X_hosts]
    return sb.fit_reference(guest_bins, host_bins, y, params)


def same_bins(X, train, guest_columns: int, n_bins: int = 32):
    """Guest and host bins fitted on the training rows, and the pooled bins XGBoost trains on."""
    parts = (X[:, :guest_columns], X[:, guest_columns:])
    bins = [Binner.fit(part[train], n_bins).transform(part) for part in parts]
    return bins, np.vstack(bins).T.astype(np.float32)


def walk(bins, tree, column):
    """The leaf weight of record ``column`` in ``tree``, read from the parties' bins in one place."""
    node = tree[0]
    while node.owner is not None:
        b = bins[0 if node.owner < 0 else 1][node.feature, column]
        node = tree[node.left] if b <= node.bin else tree[node.right]
    return node.weight


def leaves(model):
    return [[round(n.weight, 12) for n in tree if n.owner is None] for tree in model.trees]


@pytest.mark.parametrize("hosts", [1, 2])
def test_secure_splits_equal_the_plaintext_reference(breast, hosts):
    X, y = breast
    params = sb.SecureBoostParams(n_trees=3, max_depth=3)
    X_hosts = [X[:, 10:]] if hosts == 1 else [X[:, 10:20], X[:, 20:]]
    results, _ = secure_fit(X[:, :10], X_hosts, y, params)
    reference = reference_fit(X[:, :10], X_hosts, y, params)
    secure = results["guest"]
    assert secure.splits() == reference.splits()
    assert leaves(secure) == leaves(reference)
    assert any(owner >= 0 for tree in secure.splits() for _, owner, _, _ in tree), "no host split was exercised"
    assert sum(len(r.lookup) for name, r in results.items() if name != "guest") == sum(
        1 for tree in secure.splits() for _, owner, _, _ in tree if owner >= 0
    )


def test_regression_and_missing_values_are_lossless(breast):
    X, _ = breast
    X = X.copy()
    rng = np.random.default_rng(1)
    X[rng.random(X.shape) < 0.05] = np.nan  # missing values: their own bin, always right
    y = X[:, 0] * 0.1 + np.nan_to_num(X[:, 12]) * 0.5 + rng.normal(size=len(X))
    y[np.isnan(y)] = 0.0
    params = sb.SecureBoostParams(objective="reg:squarederror", n_trees=2, max_depth=3)
    results, _ = secure_fit(X[:, :5], [X[:, 5:]], y, params)
    reference = reference_fit(X[:, :5], [X[:, 5:]], y, params)
    assert results["guest"].splits() == reference.splits()
    assert leaves(results["guest"]) == leaves(reference)


def test_prediction_protocol_matches_the_trees(breast):
    X, y = breast
    params = sb.SecureBoostParams(n_trees=3, max_depth=3)
    train, test = slice(0, 450), slice(450, None)
    results, channels = secure_fit(X[train, :10], [X[train, 10:]], y[train], params)
    model, lookup = results["guest"], results["host0"]
    out = run_parties(
        {
            "guest": lambda: sb.predict_guest(channels["guest"], model, X[test, :10], "p"),
            "host0": lambda: sb.serve_host(channels["host0"], "guest", X[test, 10:], "p", model=lookup),
        }
    )
    # The same trees walked in one place with the host's thresholds: the protocol changes nothing.
    margin = np.full(len(y[test]), model.base_margin)
    for tree in model.trees:
        for i, (xg, xh) in enumerate(zip(X[test, :10], X[test, 10:], strict=True)):
            node = tree[0]
            while node.owner is not None:
                if node.owner < 0:
                    left = xg[node.feature] < node.threshold
                else:
                    feature, threshold = lookup.lookup[node.record]
                    left = xh[feature] < threshold
                node = tree[node.left] if left else tree[node.right]
            margin[i] += node.weight
    np.testing.assert_allclose(out["guest"], 1 / (1 + np.exp(-margin)), rtol=0, atol=1e-12)
    assert roc_auc_score(y[test], out["guest"]) > 0.95


def test_auc_within_0002_of_xgboost_on_the_same_bins(breast):
    xgb = pytest.importorskip("xgboost")
    X, y = breast
    train, test = slice(0, 455), slice(455, None)
    params = sb.SecureBoostParams(n_trees=10, max_depth=3, learning_rate=0.3)
    bins, pooled = same_bins(X, train, 10)
    model = sb.fit_reference(bins[0][:, train], [bins[1][:, train]], y[train], params)
    columns = np.arange(len(y))[test]
    margin = np.array([model.base_margin + sum(walk(bins, t, c) for t in model.trees) for c in columns])
    booster = xgb.train(
        {
            "max_depth": 3,
            "eta": 0.3,
            "reg_lambda": 1.0,
            "min_child_weight": 1.0,
            "tree_method": "hist",
            "max_bin": 64,
            "objective": "binary:logistic",
            "base_score": float(y[train].mean()),
            "nthread": 1,
        },
        xgb.DMatrix(pooled[train], label=y[train]),
        10,
    )
    ours = roc_auc_score(y[test], margin)
    theirs = roc_auc_score(y[test], booster.predict(xgb.DMatrix(pooled[test])))
    assert abs(ours - theirs) <= 0.002, (ours, theirs)


def test_privacy_of_what_each_side_receives(breast):
    X, y = breast
    params = sb.SecureBoostParams(n_trees=2, max_depth=3)
    results, channels = secure_fit(X[:, :10], [X[:, 10:]], y, params)
    lookup = results["host0"].lookup
    received_by_host = channels["guest"].received_by("host0")
    allowed_host = {"op", "rows", "params", "tree", "gh", "key", "node_of_row", "plan", "decisions", "last", "fields"}
    for _, tag, message in received_by_host:
        assert set(message) <= allowed_host, (tag, set(message) - allowed_host)
        for field in ("node_of_row", "plan", "decisions"):
            if field in message:
                assert message[field].dtype.kind in "iu"  # row and node numbers only, no float values
    # The gradients reach the host only as Paillier ciphertexts under the guest's key.
    gh = [m for _, _, m in received_by_host if "gh" in m]
    assert gh and all(len(m["gh"]) > 128 * len(y) for m in gh)
    label_bytes = y.astype(np.float64).tobytes()
    assert all(label_bytes not in payload for _, to, _, payload in channels["guest"].transcript if "host0" in to)
    # The guest gets encrypted sums, bin counts, record ids and partitions: never a threshold.
    allowed_guest = {"rows", "error", "hist", "counts", "records", "left", "hist_s", "fold_s"}
    thresholds = {np.float64(t).tobytes() for _, t in lookup.values() if np.isfinite(t)}
    public = KEY.encryption_key
    # One folded histogram per directly built node: the larger child of every split is derived
    # by the guest (parent - sibling, in plaintext), so the host never builds or sends it.
    plans = [m["plan"] for _, _, m in received_by_host if "plan" in m]
    replies = [m for _, _, m in channels["guest"].received_by("guest") if "hist" in m]
    assert len(plans) == len(replies) and any((p[:, 1] == 1).any() for p in plans)
    for plan, reply in zip(plans, replies, strict=True):
        assert len(reply["hist"]) == len(reply["counts"]) == int((plan[:, 1] == 0).sum())
    for _, tag, message in channels["guest"].received_by("guest"):
        assert set(message) <= allowed_guest, (tag, set(message) - allowed_guest)
        for data in message.get("hist", []):
            # Fresh randomness on every sum: the guest cannot match them to its own ciphertexts.
            assert _native.CiphertextVector.from_bytes(data, public).rerandomized
    for sender, _, _, payload in channels["guest"].transcript:
        if sender == "host0":
            assert not any(t in payload for t in thresholds)
            assert X[:, 10:].tobytes()[:64] not in payload


def test_bad_input_is_named(breast):
    X, y = breast
    params = sb.SecureBoostParams(n_trees=1, max_depth=2)
    bad = y.copy()
    bad[3] = np.nan
    with pytest.raises(InvalidParameterError, match="labels: row 3"):
        secure_fit(X[:, :5], [X[:, 5:]], bad, params)
    with pytest.raises(InvalidParameterError, match="labels 0 or 1"):
        secure_fit(X[:, :5], [X[:, 5:]], y * 2, params)
    with pytest.raises(InvalidParameterError, match="no feature columns"):
        secure_fit(X[:, :5], [X[:, :0]], y, params)
    with pytest.raises(InvalidParameterError, match="aligned rows"):
        secure_fit(X[:, :5], [X[:100, 5:]], y, params)
    with pytest.raises(InvalidParameterError, match="max_depth"):
        sb.SecureBoostParams(max_depth=0)
    inf = X[:, 5:].copy()
    inf[7, 2] = np.inf
    with pytest.raises(InvalidParameterError, match="column 2 holds an infinite value"):
        secure_fit(X[:, :5], [inf], y, params)


def test_packing_is_exact_and_bounded():
    g = np.array([-1.0, 0.25, 1.0, -0.5])
    h = np.array([0.25, 0.1, 0.0, 0.2])
    packing = sb.GHPacking.choose(g, h)
    G, H = packing.encode(g, h)
    assert (G >= 0).all() and (H >= 0).all()
    assert int(G.sum()) < 1 << sb.FIELD_BITS
    gs, hs = packing.to_float(np.int64(G.sum()), np.int64(H.sum()), np.int64(4))
    assert gs == pytest.approx(g.sum(), abs=2**-packing.precision * 4)
    assert hs == pytest.approx(h.sum(), abs=2**-packing.precision * 4)
    plain = packing.plaintexts(G, H)
    assert [int.from_bytes(p, "big") for p in plain] == [
        (int(a) << sb.FIELD_BITS) | int(b) for a, b in zip(G, H, strict=True)
    ]
    with pytest.raises(InvalidParameterError, match="too wide"):
        sb.GHPacking.choose(np.array([-1e18, 1e18]), np.ones(2))


@pytest.mark.parametrize("objective", ["binary:logistic", "multi:softprob"])
@pytest.mark.slow
def test_training_resumes_after_a_boosting_round_to_the_same_trees(objective):
    from sklearn.datasets import load_digits

    from confide.vertical import wire

    if objective == "multi:softprob":
        X, y = load_digits(return_X_y=True)
        X, y = X[:400], (y[:400] % 3).astype(float)
        params = sb.SecureBoostParams(objective=objective, num_class=3, n_trees=3, max_depth=2)
    else:
        X, y = load_breast_cancer(return_X_y=True)
        X, y = X[:300], y[:300].astype(float)
        params = sb.SecureBoostParams(n_trees=3, max_depth=2)
    half = X.shape[1] // 2

    def train(session, resume=None, guest_hook=None, host_hook=None):
        channels = LocalChannel.group(["g", "h"])
        start = sb.SecureBoostHostModel.from_dict(resume["h"]) if resume else None
        return run_parties(
            {
                "g": lambda: sb.train_guest(channels["g"], ["h"], X[:, :half], y, params, session,
                                            on_tree=guest_hook, resume=resume and resume["g"]),
                "h": lambda: sb.serve_host(channels["h"], "g", X[:, half:], session, model=start, on_tree=host_hook),
            }
        )  # fmt: skip

    straight = train("a")
    saved: dict = {}

    def guest_hook(entry, snapshot):
        if snapshot is not None and entry["tree"] == params.classes * 2 - 1:  # after boosting round 2
            saved["g"] = wire.decode(wire.encode(snapshot()))

    def host_hook(tree, snapshot, last):
        if tree == params.classes * 2 - 1:
            saved["h"] = wire.decode(wire.encode(snapshot()))

    train("b", guest_hook=guest_hook, host_hook=host_hook)
    resumed = train("c", resume=saved)
    assert len(resumed["g"].trees) == len(straight["g"].trees) == 3 * params.classes
    # Exact integer histograms: the resumed trees are the uninterrupted ones, split for split.
    assert resumed["g"].splits() == straight["g"].splits()
    for a, b in zip(resumed["g"].trees, straight["g"].trees, strict=True):
        assert [n.weight for n in a] == [n.weight for n in b]
    assert [h["tree"] for h in resumed["g"].history] == list(range(2 * params.classes, 3 * params.classes))


def test_the_selected_paillier_engine_encrypts_the_guests_gradients(breast, monkeypatch):
    """With a GPU engine selected (its kernels' CPU build stands in), the trees are the same."""
    from confide.crypto import gpu

    gpu.reset_engine()
    monkeypatch.setitem(gpu._STATE, "choice", gpu.EngineChoice("gpu:cpu-reference", gpu.CpuBackend, "test"))
    X, y = breast
    params = sb.SecureBoostParams(n_trees=1, max_depth=2)
    try:
        results, _ = secure_fit(X[:, :10], [X[:, 10:]], y, params)
        report = gpu.engine_report()
    finally:
        gpu.reset_engine()
    assert report["crypto_engine"] == "gpu:cpu-reference" and report["gpu_batches"] >= 1
    reference = reference_fit(X[:, :10], [X[:, 10:]], y, params)
    assert results["guest"].splits() == reference.splits()
    assert leaves(results["guest"]) == leaves(reference)
