"""Hetero NN with framework sub-networks: a party's own PyTorch modules and Keras 3 on torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import roc_auc_score

from confide.errors import InvalidParameterError, ProtocolError
from confide.vertical import hetero_nn as hn
from confide.vertical import wire
from confide.vertical.channel import LocalChannel, run_parties

torch = pytest.importorskip("torch", reason="PyTorch is an extra (confide[torch]); make test installs it")

pytestmark = pytest.mark.timeout(600)

NETS = """
import torch

def host_bottom(input_dim, width=6):
    # The host's own code: a residual block the numpy Dense layers cannot express.
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(input_dim, width)
            self.skip = torch.nn.Linear(input_dim, width, bias=False)
        def forward(self, x):
            return torch.tanh(self.inner(x)) + 0.1 * self.skip(x)
    return Block()

def top(input_dim, outputs):
    return torch.nn.Sequential(torch.nn.Linear(input_dim, 8), torch.nn.ReLU(), torch.nn.Linear(8, outputs))

def wrong_top(input_dim, outputs):
    return torch.nn.Linear(input_dim, outputs + 1)

def not_a_module(input_dim):
    return "nope"
"""


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    path = tmp_path_factory.mktemp("nets") / "my_nets.py"
    path.write_text(NETS)
    return str(path)


@pytest.fixture(scope="module")
def breast():
    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    X, y = X[order], y[order].astype(float)
    train, test = slice(0, 455), slice(455, None)
    return {"g": X[train, :10], "h": X[train, 10:]}, y[train], {"g": X[test, :10], "h": X[test, 10:]}, y[test]


def _init_args(params):
    from dataclasses import fields

    return {f.name: getattr(params, f.name) for f in fields(params) if f.init}


def run(parts, y, params, tests=None, resume=None, on_epoch=None, session="t"):
    channels = LocalChannel.group(["g", "h"])
    hooks = on_epoch or {}
    models = run_parties(
        {
            "g": lambda: hn.train_guest(
                channels["g"], ["h"], parts["g"], y, params, session,
                on_epoch=hooks.get("g"), resume=resume and resume["g"],
            ),
            "h": lambda: hn.train_host(
                channels["h"], "g", parts["h"], params, session, on_epoch=hooks.get("h"), resume=resume and resume["h"]
            ),
        }
    )  # fmt: skip
    scores = None
    if tests is not None:
        scores = run_parties(
            {
                "g": lambda: hn.predict_guest(channels["g"], ["h"], tests["g"], models["g"], "p"),
                "h": lambda: hn.predict_host(channels["h"], "g", tests["h"], models["h"], "p"),
            }
        )["g"]
    return models, scores


@pytest.mark.slow
def test_own_pytorch_modules_train_like_the_same_network_centrally(breast, nets):
    parts, y, tests, y_test = breast
    params = hn.HeteroNNParams(
        epochs=6,
        batch_size=64,
        host_bottom={"torch": f"{nets}:host_bottom", "options": {"width": 6}},
        top={"torch": f"{nets}:top"},
    )
    models, scores = run(parts, y, params, tests)
    assert type(models["h"].bottom).__name__ == "TorchNetwork" and models["h"].bottom.output_dim == 6
    assert models["g"].shares["h"].shape == (6, params.interactive_units)
    reference = hn.train_reference(parts, y, params, "g")
    central = hn.predict_reference(reference, tests)
    # Same modules, same initial weights, same batches: only fixed-point rounding differs.
    assert np.max(np.abs(scores - central)) < 2e-3
    assert abs(roc_auc_score(y_test, scores) - roc_auc_score(y_test, central)) <= 0.01
    assert roc_auc_score(y_test, scores) > 0.95
    losses = [e["loss"] for e in models["g"].history]
    assert losses[-1] < losses[0]
    # The host's module was trained by the protocol's optimizer, in place.
    fresh = hn.train_reference(parts, y, hn.HeteroNNParams(**{**_init_args(params), "epochs": 1}), "g")
    trained = models["h"].bottom.params()
    assert not all(np.array_equal(a, b) for a, b in zip(trained, fresh.bottoms["h"].params(), strict=True))
    # A saved part loads again (the party's code imported anew) and scores the same.
    guest = hn.HeteroNNGuestModel.from_dict(wire.decode(wire.encode(models["g"].to_dict())))
    host = hn.HeteroNNHostModel.from_dict(wire.decode(wire.encode(models["h"].to_dict())))
    channels = LocalChannel.group(["g", "h"])
    reloaded = run_parties(
        {
            "g": lambda: hn.predict_guest(channels["g"], ["h"], tests["g"], guest, "q"),
            "h": lambda: hn.predict_host(channels["h"], "g", tests["h"], host, "q"),
        }
    )["g"]
    assert np.allclose(reloaded, scores, atol=1e-6)


@pytest.mark.slow
def test_training_resumes_to_the_uninterrupted_model(breast, nets):
    parts, y, tests, _ = breast
    params = hn.HeteroNNParams(
        epochs=3, batch_size=128, host_bottom={"torch": f"{nets}:host_bottom"}, top={"torch": f"{nets}:top"}
    )
    straight = run(parts, y, params, tests, session="a")[1]
    saved = {}

    def keep(party):
        def hook(entry, snapshot):
            if entry["epoch"] == 2:
                saved[party] = wire.decode(wire.encode(snapshot()))

        return hook

    run(parts, y, params, session="b", on_epoch={"g": keep("g"), "h": keep("h")})
    resumed = run(parts, y, params, tests, resume=saved, session="c")[1]
    assert np.allclose(resumed, straight, atol=1e-6)


def test_framework_errors_name_the_field_and_stop_every_party(breast, nets):
    parts, y, _, _ = breast
    bad_top = hn.HeteroNNParams(epochs=1, top={"torch": f"{nets}:wrong_top"})
    # Every party stops: the guest with the error, the host told why the guest could not start.
    with pytest.raises((InvalidParameterError, ProtocolError), match="top: the top network ends with 2 units; this"):
        run(parts, y, bad_top)
    not_module = hn.HeteroNNParams(epochs=1, host_bottom={"torch": f"{nets}:not_a_module"})
    with pytest.raises((InvalidParameterError, ProtocolError), match="not a torch.nn.Module"):
        run(parts, y, not_module)
    missing = hn.HeteroNNParams(epochs=1, host_bottom={"torch": "/nowhere/nets.py:f"})
    with pytest.raises((InvalidParameterError, ProtocolError), match="does not exist"):
        run(parts, y, missing)
    with pytest.raises(InvalidParameterError, match="host_bottom.backend 'jax'"):
        hn.HeteroNNParams(host_bottom={"backend": "jax", "layers": [{"class_name": "Dense", "config": {"units": 4}}]})
    with pytest.raises(InvalidParameterError, match="host_bottom.torch must name a factory"):
        hn.HeteroNNParams(host_bottom={"torch": "no-colon"})
    with pytest.raises(InvalidParameterError, match="unknown keys"):
        hn.HeteroNNParams(top={"torch": f"{nets}:top", "lr": 1})
    with pytest.raises(InvalidParameterError, match="is not a Keras layer this platform builds"):
        hn.HeteroNNParams(top={"backend": "torch", "layers": [{"class_name": "Dense2"}]})


KERAS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from sklearn.datasets import load_breast_cancer
    from sklearn.metrics import roc_auc_score
    from confide.vertical import hetero_nn as hn
    from confide.vertical.channel import LocalChannel, run_parties

    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    X, y = X[order], y[order].astype(float)
    parts = {"g": X[:455, :10], "h": X[:455, 10:]}
    tests = {"g": X[455:, :10], "h": X[455:, 10:]}
    bottom = {"backend": "torch", "layers": [
        {"class_name": "Dense", "config": {"units": 8}},
        {"class_name": "BatchNormalization"},
        {"class_name": "Activation", "config": {"activation": "tanh"}},
        {"class_name": "Dropout", "config": {"rate": 0.1}},
    ]}
    params = hn.HeteroNNParams(epochs=6, batch_size=64, guest_bottom=bottom, host_bottom=bottom)
    channels = LocalChannel.group(["g", "h"])
    models = run_parties({
        "g": lambda: hn.train_guest(channels["g"], ["h"], parts["g"], y[:455], params, "t"),
        "h": lambda: hn.train_host(channels["h"], "g", parts["h"], params, "t"),
    })
    scores = run_parties({
        "g": lambda: hn.predict_guest(channels["g"], ["h"], tests["g"], models["g"], "p"),
        "h": lambda: hn.predict_host(channels["h"], "g", tests["h"], models["h"], "p"),
    })["g"]
    reference = hn.train_reference(parts, y[:455], params, "g")
    central = hn.predict_reference(reference, tests)
    import keras
    print(json.dumps({
        "backend": keras.backend.backend(),
        "kind": type(models["h"].bottom).__name__,
        "auc": roc_auc_score(y[455:], scores),
        "auc_central": roc_auc_score(y[455:], central),
        "max_diff": float(np.max(np.abs(scores - central))),
        "jax_loaded": "jax" in sys.modules,
    }))
    """
)


@pytest.mark.slow
def test_keras_networks_on_the_torch_backend_match_the_central_network():
    # Its own process: Keras picks its backend once per process.
    done = subprocess.run([sys.executable, "-c", KERAS_SCRIPT], capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["backend"] == "torch" and result["kind"] == "KerasNetwork"
    # Dropout draws differ between the two runs' torch RNG streams; BatchNormalization and the
    # fixed point too: the scores agree closely, the AUCs within 0.01.
    assert abs(result["auc"] - result["auc_central"]) <= 0.01, result
    assert result["auc"] > 0.95, result
