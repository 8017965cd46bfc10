"""SecureBoost with a validation set: losses per round, early stopping, the same as the reference."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits

from confide.errors import InvalidParameterError
from confide.spec import JobSpec
from confide.vertical import secureboost as sb
from confide.vertical import wire
from confide.vertical.binning import Binner
from confide.vertical.channel import LocalChannel, run_parties
from tests.fixtures.keys import fixed_native_key

KEY = fixed_native_key()


@pytest.fixture(scope="module")
def breast():
    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(3).permutation(len(y))
    return X[order][:400], y[order][:400].astype(float)


def secure_fit(X_guest, X_host, y, params, *, resume=None, guest_hook=None, host_hook=None, session="t"):
    channels = LocalChannel.group(["guest", "host"])
    start = sb.SecureBoostHostModel.from_dict(resume["host"]) if resume else None
    out = run_parties(
        {
            "guest": lambda: sb.train_guest(
                channels["guest"], ["host"], X_guest, y, params, session, key=KEY,
                on_tree=guest_hook, resume=resume and resume["guest"],
            ),
            "host": lambda: sb.serve_host(channels["host"], "guest", X_host, session, model=start, on_tree=host_hook),
        }
    )  # fmt: skip
    return out, channels


def reference_fit(X_guest, X_host, y, params):
    guest_bins = Binner.fit(X_guest, params.n_bins).transform(X_guest)
    host_bins = Binner.fit(X_host, params.n_bins).transform(X_host)
    return sb.fit_reference(guest_bins, [host_bins], y, params)


def margins_on(model, X_guest, X_host, rows):
    """The model's margins on ``rows`` of the training data, through the prediction protocol."""
    channels = LocalChannel.group(["guest", "host"])
    host_model = sb.SecureBoostHostModel(dict(model[1].lookup))
    return run_parties(
        {
            "guest": lambda: sb.predict_margin(channels["guest"], model[0], X_guest[rows], "p"),
            "host": lambda: sb.serve_host(channels["host"], "guest", X_host[rows], "p", model=host_model),
        }
    )["guest"]


@pytest.mark.slow
def test_early_stopping_keeps_the_best_round_and_equals_the_reference(breast):
    X, y = breast
    # A large learning rate overfits within a few rounds, so the validation loss turns up.
    params = sb.SecureBoostParams(
        n_trees=30, max_depth=4, learning_rate=1.5, validation_fraction=0.3, early_stopping_rounds=3, seed=5
    )
    out, channels = secure_fit(X[:, :10], X[:, 10:], y, params)
    model = out["guest"]
    losses = model.validation_loss
    assert model.best_round == int(np.argmin(losses))
    assert len(losses) == model.best_round + 1 + 3 < 30, "training should have stopped early"
    assert len(model.trees) == model.best_round + 1
    assert [h["validation_loss"] for h in model.history] == losses
    # The secure protocol and the plaintext reference agree tree for tree, loss for loss.
    reference = reference_fit(X[:, :10], X[:, 10:], y, params)
    assert reference.splits() == model.splits()
    assert reference.validation_loss == pytest.approx(losses, abs=1e-12)
    assert reference.best_round == model.best_round
    # The validation rows followed the hosts' splits correctly: the kept model's loss on them,
    # predicted afresh through the prediction protocol, is the recorded best loss.
    _, val_rows = sb.validation_split(len(y), params)
    margin = margins_on((model, out["host"]), X[:, :10], X[:, 10:], val_rows)
    margin = np.asarray(margin).reshape(len(val_rows), -1)
    assert sb.validation_loss(params.objective, y[val_rows], margin) == pytest.approx(losses[model.best_round])
    # The host learns which rows are held out and their side of its own splits, nothing else.
    sent = [m for _, _, m in channels["guest"].received_by("host") if "val_node_of_row" in m]
    assert sent and all(set(m) == {"op", "decisions", "val_node_of_row"} for m in sent)
    assert all(m["val_node_of_row"].dtype.kind == "i" for m in sent)


def test_validation_without_early_stopping_keeps_every_round(breast):
    X, y = breast
    params = sb.SecureBoostParams(n_trees=4, max_depth=2, validation_fraction=0.2)
    model = secure_fit(X[:, :10], X[:, 10:], y, params)[0]["guest"]
    assert len(model.trees) == 4 and len(model.validation_loss) == 4 and model.best_round is None
    # A sensible learning rate on this easy task: the validation loss falls.
    assert model.validation_loss[-1] < model.validation_loss[0]


@pytest.mark.slow
def test_multiclass_losses_are_per_round():
    X, y = load_digits(return_X_y=True)
    X, y = X[:300], (y[:300] % 3).astype(float)
    params = sb.SecureBoostParams(
        objective="multi:softprob", num_class=3, n_trees=3, max_depth=2, validation_fraction=0.25
    )
    model = secure_fit(X[:, :32], X[:, 32:], y, params)[0]["guest"]
    assert len(model.validation_loss) == 3 and len(model.trees) == 9
    assert [h["tree"] for h in model.history if "validation_loss" in h] == [2, 5, 8]
    assert model.validation_loss[-1] < np.log(3)  # better than the uniform guess


@pytest.mark.slow
def test_resume_carries_the_validation_history(breast):
    X, y = breast
    params = sb.SecureBoostParams(
        n_trees=12, max_depth=3, learning_rate=1.5, validation_fraction=0.3, early_stopping_rounds=2, seed=5
    )
    straight = secure_fit(X[:, :10], X[:, 10:], y, params, session="a")[0]["guest"]
    saved: dict = {}

    def guest_hook(entry, snapshot):
        if snapshot is not None and entry["tree"] == 1:
            saved["guest"] = wire.decode(wire.encode(snapshot()))

    def host_hook(tree, snapshot, last):
        if tree == 1:
            saved["host"] = wire.decode(wire.encode(snapshot()))

    secure_fit(X[:, :10], X[:, 10:], y, params, guest_hook=guest_hook, host_hook=host_hook, session="b")
    resumed = secure_fit(X[:, :10], X[:, 10:], y, params, resume=saved, session="c")[0]["guest"]
    assert resumed.validation_loss == straight.validation_loss
    assert resumed.best_round == straight.best_round and resumed.splits() == straight.splits()


def test_bad_validation_settings_are_named():
    with pytest.raises(InvalidParameterError, match="early_stopping_rounds=3 needs a validation set"):
        sb.SecureBoostParams(early_stopping_rounds=3)
    with pytest.raises(InvalidParameterError, match=r"validation_fraction must be a number in \[0, 0.5\]"):
        sb.SecureBoostParams(validation_fraction=0.7)
    with pytest.raises(InvalidParameterError, match="early_stopping_rounds must be None or an int"):
        sb.SecureBoostParams(validation_fraction=0.1, early_stopping_rounds=0)
    with pytest.raises(InvalidParameterError, match="leaves 0 for validation"):
        sb.validation_split(4, sb.SecureBoostParams(validation_fraction=0.1))
    base = {"job_id": "j", "parties": ["a", "b"], "rounds": 3, "data": {"guest": "a"}}
    with pytest.raises(ValueError, match="are for model.algorithm secureboost, not hetero_lr"):
        JobSpec.model_validate({**base, "model": {"algorithm": "hetero_lr", "validation_fraction": 0.2}})
    with pytest.raises(ValueError, match="early_stopping_rounds=2 needs a validation set"):
        JobSpec.model_validate({**base, "model": {"algorithm": "secureboost", "early_stopping_rounds": 2}})
    spec = JobSpec.model_validate(
        {**base, "model": {"algorithm": "secureboost", "validation_fraction": 0.2, "early_stopping_rounds": 2}}
    )
    from confide.vertical.params import secureboost_params

    params = secureboost_params(spec)
    assert (params.validation_fraction, params.early_stopping_rounds, params.seed) == (0.2, 2, spec.seed)
