"""The model seam: layouts, strategies, the HomoLR adapter, Keras specs, own code and adapters."""

import numpy as np
import pytest

from confide.data import breast_cancer_federation
from confide.errors import InvalidParameterError
from confide.ml import MODELS, STRATEGIES, FitConfig, HomoLR, WeightLayout, build_model, make_strategy
from confide.ml.base import FederatedModel
from confide.ml.keras_spec import validate_network
from confide.spec import parse_job

FIXTURES = __file__.rsplit("/tests/", 1)[0] + "/tests/fixtures/models.py"


def test_layout_round_trips_named_tensors_of_any_dtype_and_groups_layers():
    weights = {
        "dense_0/kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
        "dense_0/bias": np.array([1.5, -2.0, 0.25], dtype=np.float16),
        "fc.weight": np.ones((2, 2), dtype=np.float64),
    }
    layout = WeightLayout.of(weights)
    vector = layout.flatten(weights)
    assert vector.dtype == np.float64 and vector.shape == (13,)
    back = layout.unflatten(vector)
    for name, value in weights.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)
    assert layout.layers() == [(0, 9), (9, 13)]
    assert WeightLayout.from_dict(layout.to_dict()).digest() == layout.digest()


def test_layout_errors_name_the_tensor():
    layout = WeightLayout.of({"a/w": np.zeros((2, 3)), "a/b": np.zeros(3)})
    with pytest.raises(InvalidParameterError, match=r"weight 'a/w' has shape \(3, 2\), expected \(2, 3\)"):
        layout.flatten({"a/w": np.zeros((3, 2)), "a/b": np.zeros(3)})
    with pytest.raises(InvalidParameterError, match=r"missing \['a/b'\]"):
        layout.flatten({"a/w": np.zeros((2, 3))})
    other = WeightLayout.of({"a/w": np.zeros((2, 4)), "a/b": np.zeros(3)})
    assert layout.difference(other) == "weight 'a/w' has shape (2, 4), ours (2, 3)"
    with pytest.raises(InvalidParameterError, match="dtype int64"):
        WeightLayout.of({"steps": np.zeros(2, dtype=np.int64)})


def test_fedavg_and_fedprox_sum_weighted_changes():
    for name in ("fedavg", "fedprox"):
        strategy = make_strategy(name)
        delta = np.array([1.0, -2.0])
        assert np.allclose(strategy.contribution(delta, 0.25), [0.25, -0.5])
        assert np.allclose(strategy.apply(np.array([1.0, 1.0]), np.array([0.5, 0.5])), [1.5, 1.5])
    assert make_strategy("fedprox", mu=0.5).proximal_mu == 0.5
    with pytest.raises(InvalidParameterError, match="strategy.mu"):
        make_strategy("fedprox", mu=0)
    with pytest.raises(InvalidParameterError, match="strategy.name must be one of fedavg, fedprox, fedadam"):
        make_strategy("fedsgd")


def test_fedadam_follows_reddi_et_al_and_its_state_resumes_exactly():
    strategy = make_strategy("fedadam", server_learning_rate=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    w = np.array([0.0, 1.0])
    steps = [np.array([0.2, -0.1]), np.array([0.1, 0.3]), np.array([-0.05, 0.0])]
    m = v = np.zeros(2)
    expected = w.copy()
    for step in steps:
        m = 0.9 * m + 0.1 * step
        v = 0.99 * v + 0.01 * step**2
        expected = expected + 0.1 * m / (np.sqrt(v) + 1e-3)
    out = w
    for i, step in enumerate(steps):
        out = strategy.apply(out, step)
        if i == 0:
            resumed = make_strategy("fedadam", server_learning_rate=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
            resumed.load_state(strategy.state())
            resumed_out = out.copy()  # apply works in place on the global weights
    for step in steps[1:]:
        resumed_out = resumed.apply(resumed_out, step)
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    np.testing.assert_array_equal(resumed_out, out)
    with pytest.raises(InvalidParameterError, match="strategy.beta2 must be in"):
        make_strategy("fedadam", beta2=1.0)


def test_registries_hold_every_documented_plug_in():
    assert set(MODELS) == {"homo_lr", "keras", "custom", "hf"}
    assert set(STRATEGIES) == {
        "fedavg",
        "fedprox",
        "fedadam",
        "median",
        "trimmed_mean",
        "krum",
        "multi_krum",
        "norm_clip",
    }


def test_homo_lr_on_the_seam_trains_exactly_as_homo_lr():
    spec = parse_job({"job_id": "j", "parties": ["a", "b"], "model": {"learning_rate": 0.5, "local_epochs": 2}})
    X, y = breast_cancer_federation(2).parts[0]
    model = build_model(spec.model, seed=0, party_id="a")
    assert isinstance(model, FederatedModel)
    model.build(X.shape[1:], 2)
    layout = WeightLayout.of(model.get_weights())
    assert [t.name for t in layout.tensors] == ["lr/coef", "lr/intercept"] and layout.layers() == [(0, 31)]
    reference = HomoLR(learning_rate=0.5, local_epochs=2, batch_size=64)
    reference.initialize(X.shape[1])
    for round_number in (1, 2):
        result = model.fit(X, y, FitConfig(round=round_number, seed=(0, 0, round_number)))
        reference.reseed([0, 0, round_number])
        reference.local_train(X, y)
        np.testing.assert_array_equal(layout.flatten(model.get_weights()), reference.get_weights())
        assert result.num_examples == len(y)
    metrics = model.evaluate(X, y, ["auc", "accuracy"])
    assert metrics["auc"] > 0.95 and 0.8 < metrics["accuracy"] <= 1.0


def test_fedprox_pull_keeps_homo_lr_closer_to_the_global_model():
    X, y = breast_cancer_federation(2).parts[0]
    spec = parse_job({"job_id": "j", "parties": ["a", "b"], "model": {"learning_rate": 0.5, "local_epochs": 3}})
    distances = []
    for mu in (0.0, 1.0):
        model = build_model(spec.model, seed=0, party_id="a")
        model.build(X.shape[1:], 2)
        anchor = model.get_weights()
        model.fit(X, y, FitConfig(round=1, seed=(0, 0, 1), proximal_mu=mu, global_weights=anchor))
        distances.append(np.linalg.norm(model.get_weights()["lr/coef"] - anchor["lr/coef"]))
    assert distances[1] < 0.8 * distances[0]


@pytest.mark.parametrize(
    "network, message",
    [
        (
            {"layers": [{"class_name": "Dense"}, {"class_name": "Conv2d"}]},
            r"model.network.layers\[1\].class_name: 'Conv2d' is not a Keras layer .* did you mean 'Conv2D'",
        ),
        ({"layers": []}, r"model.network.layers must be a list of 1 to"),
        ({"layers": [{"class_name": "Dense"}], "optimizer": "Adamm"}, r"model.network.optimizer: 'Adamm'"),
        ({"layers": [{"class_name": "Dense"}], "loss": "hinge2"}, r"model.network.loss: 'hinge2'"),
        ({"layers": [{"class_name": "Dense", "config": 3}]}, r"layers\[0\].config must be a mapping"),
        ({"layers": [{"class_name": "Dense"}], "input_shape": [0]}, r"input_shape must be a list of positive"),
        ({"layers": [{"class_name": "Dense"}], "optimiser": "Adam"}, r"unknown fields \['optimiser'\]"),
    ],
)
def test_network_specs_are_validated_at_submit_naming_the_field(network, message):
    with pytest.raises(InvalidParameterError, match=message):
        validate_network(network)
    with pytest.raises(InvalidParameterError, match=message):
        parse_job(
            {
                "job_id": "j",
                "parties": ["a", "b"],
                "model": {"algorithm": "keras", "network": network},
                "data": {"dataset": "digits"},
            }
        )


def test_job_spec_checks_model_fields_belong_to_the_algorithm(tmp_path):
    base = {"job_id": "j", "parties": ["a", "b"]}
    with pytest.raises(InvalidParameterError, match="model.network is for model.algorithm keras"):
        parse_job({**base, "model": {"network": {"layers": [{"class_name": "Dense"}]}}})
    with pytest.raises(InvalidParameterError, match="model.algorithm custom needs model.entry"):
        parse_job({**base, "model": {"algorithm": "custom"}})
    with pytest.raises(InvalidParameterError, match=r"model.backends names \['c'\]"):
        parse_job(
            {
                **base,
                "model": {
                    "algorithm": "keras",
                    "network": {"layers": [{"class_name": "Dense"}]},
                    "backends": {"c": "jax"},
                },
            }
        )
    with pytest.raises(InvalidParameterError, match="homo_lr is binary on rows"):
        parse_job({**base, "data": {"dataset": "digits"}})
    job = tmp_path / "job.yaml"
    (tmp_path / "net.yaml").write_text("layers: [{class_name: Dense, config: {units: 10}}]\n")
    job.write_text(
        "job_id: j\nparties: [a, b]\nmodel: {algorithm: keras, network_file: net.yaml}\ndata: {dataset: digits}\n"
    )
    from confide.spec import load_job

    spec = load_job(job)
    assert spec.network()["layers"][0]["config"]["units"] == 10
    assert spec.model.network_file == str(tmp_path / "net.yaml")


def test_custom_entry_loads_a_file_or_module_and_errors_name_the_party(tmp_path):
    spec = parse_job(
        {
            "job_id": "j",
            "parties": ["a", "b"],
            "model": {"algorithm": "custom", "entry": f"{FIXTURES}:federated_model", "options": {"width": 3}},
        }
    )
    model = build_model(spec.model, seed=0, party_id="a")
    model.build((4,), 3)
    assert model.get_weights()["lin/w"].shape == (4, 3)
    for entry, message in (
        (f"{tmp_path}/nothing.py:f", "party 'b': model.entry file .* does not exist"),
        (f"{FIXTURES}:no_such_thing", "has no attribute 'no_such_thing'"),
        ("confide_no_such_module:f", "cannot be imported: ModuleNotFoundError"),
    ):
        bad = parse_job({"job_id": "j", "parties": ["a", "b"], "model": {"algorithm": "custom", "entry": entry}})
        with pytest.raises(InvalidParameterError, match=message):
            build_model(bad.model, seed=0, party_id="b")
    wrong = parse_job(
        {
            "job_id": "j",
            "parties": ["a", "b"],
            "model": {"algorithm": "custom", "entry": f"{FIXTURES}:federated_model", "options": {"depth": 3}},
        }
    )
    with pytest.raises(InvalidParameterError, match="refused model.options"):
        build_model(wrong.model, seed=0, party_id="a")


def test_sklearn_adapter_trains_an_sgd_classifier_from_global_weights():
    from sklearn.linear_model import SGDClassifier

    from confide.ml.sklearn_adapter import SklearnModel

    federation = breast_cancer_federation(2)
    X, y = federation.parts[0]
    model = SklearnModel(SGDClassifier(loss="log_loss", alpha=1e-4, random_state=0))
    model.build(X.shape[1:], 2)
    layout = WeightLayout.of(model.get_weights())
    assert layout.to_dict() == [
        {"name": "sgd/coef", "shape": [1, 30], "dtype": "float64"},
        {"name": "sgd/intercept", "shape": [1], "dtype": "float64"},
    ]
    for r in range(1, 4):
        model.fit(X, y, FitConfig(round=r, seed=(0, 0, r)))
    assert model.evaluate(*federation.test, ["auc", "accuracy"])["auc"] > 0.95
    zero = layout.unflatten(np.zeros(layout.size))
    model.set_weights(zero)
    assert not model.estimator.coef_.any()


torch = pytest.importorskip("torch", reason="PyTorch is an extra (confide[torch]); make test installs it")


def _torch_model():
    from confide.ml.torch_adapter import TorchModel

    def train(net, loader, epochs):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(epochs):
            for features, labels in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(net(features), labels).backward()
                optimizer.step()
        return 0.0

    net = torch.nn.Sequential(torch.nn.Linear(30, 8), torch.nn.ReLU(), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    return TorchModel(net, train, batch_size=16)


def test_torch_adapter_moves_float_state_and_trains_deterministically():
    federation = breast_cancer_federation(2)
    X, y = federation.parts[0]
    first, second = _torch_model(), _torch_model()
    first.build(X.shape[1:], 2)
    weights = first.get_weights()
    assert "2.num_batches_tracked" not in weights and "2.running_mean" in weights
    second.set_weights(weights)
    for model in (first, second):
        model.fit(X, y, FitConfig(round=1, seed=(0, 1, 1)))
    for name, value in first.get_weights().items():
        np.testing.assert_array_equal(value, second.get_weights()[name])
    assert first.evaluate(*federation.test, ["auc", "accuracy"])["auc"] > 0.9


def test_torch_adapter_fedprox_hooks_pull_towards_the_global_model():
    X, y = breast_cancer_federation(2).parts[0]
    distances = []
    for mu in (0.0, 5.0):
        torch.manual_seed(0)
        model = _torch_model()
        model.build(X.shape[1:], 2)
        anchor = model.get_weights()
        model.fit(X, y, FitConfig(round=1, seed=(0, 0, 1), epochs=2, proximal_mu=mu, global_weights=anchor))
        after = model.get_weights()
        distances.append(sum(np.linalg.norm(after[k] - anchor[k]) for k in ("0.weight", "3.weight")))
    assert distances[1] < 0.8 * distances[0]
    assert not model.module._parameters and all(not p._backward_hooks for p in model.module.parameters())
