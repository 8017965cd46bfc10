"""Neural networks through the model seam: Keras specs on mixed backends, own PyTorch code,
every protection mode on digits, strategies, resume, and bad input (real processes, mTLS)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from confide.errors import JobFailedError
from confide.spec import load_job, parse_job
from tests.fixtures.federation import run_local

# Found, not imported: the frameworks run in the party processes. JAX in the test process would
# make every later fork (multiprocessing tests) warn, since JAX is multithreaded.
for _framework in ("keras", "jax"):
    if importlib.util.find_spec(_framework) is None:
        pytest.skip(f"{_framework} is an extra (confide[{_framework}]); make test installs it", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "models.py"
MODES = ["plain", "secagg", "paillier", "groupmask", "tee"]
NETWORK = {
    "layers": [
        {"class_name": "Conv2D", "config": {"filters": 8, "kernel_size": 3, "activation": "relu", "padding": "same"}},
        {"class_name": "MaxPooling2D", "config": {"pool_size": 2}},
        {"class_name": "Flatten"},
        {"class_name": "Dense", "config": {"units": 10, "activation": "softmax"}},
    ],
    "optimizer": {"class_name": "Adam"},
    "loss": "sparse_categorical_crossentropy",
}


def keras_job(**overrides) -> dict:
    job = {
        "job_id": "nn",
        "rounds": 12,
        "parties": ["hospital-a", "hospital-b", "hospital-c"],
        "model": {"algorithm": "keras", "learning_rate": 0.01, "batch_size": 32, "network": NETWORK},
        "data": {"dataset": "digits", "split": "iid", "seed": 3},
        "protection": {"mode": "plain", "share_timeout_s": 5.0},
        "transport": {"round_timeout_s": 60.0, "dropout_grace_s": 1.0},
        "metrics": ["loss", "accuracy"],
        "seed": 3,
    }
    for key, value in overrides.items():
        job[key] = {**job[key], **value} if isinstance(value, dict) and key in job else value
    return job


def run(job: dict, workdir, **kwargs) -> dict:
    return run_local(parse_job(job), workdir, progress=False, echo=lambda *_: None, **kwargs)


def party_report(workdir, party: str) -> dict:
    return json.loads((Path(workdir) / "parties" / f"{party}.report.json").read_text())


@pytest.fixture(scope="module")
def digits_reports(tmp_path_factory):
    return {
        mode: run(keras_job(job_id=f"nn-{mode}", protection={"mode": mode}), tmp_path_factory.mktemp(mode))
        for mode in MODES
    }


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_trains_the_cnn_to_the_plain_accuracy_within_one_point(digits_reports, mode):
    report = digits_reports[mode]
    assert report["mode"] == mode
    assert report["model"]["algorithm"] == "keras" and report["model"]["layers"] == 2
    assert report["final_accuracy"] > 0.9
    assert abs(report["final_accuracy"] - digits_reports["plain"]["final_accuracy"]) <= 0.01
    assert report["rounds"][-1]["loss"] < report["rounds"][0]["loss"]


def test_paillier_clips_each_layer_with_its_own_threshold(digits_reports, tmp_path):
    entry = party_report(Path(digits_reports["paillier"]["files"]["json"]).parent, "hospital-a")["rounds"][-1]
    alphas = entry["stats"]["layer_alphas"]
    assert len(alphas) == 2 and alphas[0] != alphas[1]
    assert entry["stats"]["alpha"] == max(alphas)


def test_a_jax_party_and_a_pytorch_party_hold_the_same_global_weights_after_every_round(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is an extra (confide[torch]); make test installs it")
    job = keras_job(
        job_id="mixed",
        rounds=4,
        parties=["hospital-a", "hospital-b"],
        model={"backends": {"hospital-a": "jax", "hospital-b": "torch"}},
    )
    run(job, tmp_path)
    jax_party, torch_party = party_report(tmp_path, "hospital-a"), party_report(tmp_path, "hospital-b")
    assert jax_party["model"]["backend"] == "jax" and torch_party["model"]["backend"] == "torch"
    assert len(jax_party["rounds"]) == len(torch_party["rounds"]) == 4
    for a, b in zip(jax_party["rounds"], torch_party["rounds"], strict=True):
        # Both set global + the same aggregate in float64, then store float32: identical (tolerance 0).
        np.testing.assert_array_equal(np.array(a["weights"]), np.array(b["weights"]))
        assert a["test_accuracy"] == b["test_accuracy"]
    assert jax_party["rounds"][-1]["test_accuracy"] > 0.8


def test_a_plain_pytorch_model_trains_through_the_own_code_api(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is an extra (confide[torch]); make test installs it")
    spec = load_job(ROOT / "examples" / "pytorch_digits" / "job.yaml").model_dump(mode="json")
    spec.update(job_id="own-torch", rounds=5, parties=["hospital-a", "hospital-b"])
    report = run(spec, tmp_path)
    assert report["mode"] == "paillier" and report["model"]["algorithm"] == "custom"
    assert report["final_accuracy"] > 0.85
    saved = np.load(tmp_path / "parties" / "hospital-a.model.npz", allow_pickle=False)
    assert {"conv1.weight", "conv2.bias", "fc.weight"} <= set(saved.files)
    assert json.loads(str(saved["__confide__"]))["format"] == "confide.model/1"


@pytest.mark.parametrize(
    "strategy", [{"name": "fedprox", "mu": 0.1}, {"name": "fedadam", "server_learning_rate": 0.05}]
)
def test_strategies_run_over_a_protected_mode(tmp_path, strategy):
    report = run(
        keras_job(job_id=f"s-{strategy['name']}", rounds=8, strategy=strategy, protection={"mode": "groupmask"}),
        tmp_path,
    )
    assert report["strategy"]["name"] == strategy["name"]
    assert report["final_accuracy"] > 0.8
    assert report["rounds"][-1]["loss"] < 0.5 * report["rounds"][0]["loss"]


def test_resume_from_a_checkpoint_continues_with_optimizer_and_strategy_state(tmp_path):
    # Runs 4 rounds with FedAdam, then 2 + resume-from-2; the resumed run ends with the same weights.
    from confide.local import LocalFederation

    job = keras_job(
        job_id="resume",
        rounds=4,
        parties=["hospital-a", "hospital-b"],
        strategy={"name": "fedadam", "server_learning_rate": 0.01},
        checkpoint_interval=2,
        model={"network": {**NETWORK, "layers": NETWORK["layers"]}},
    )
    run(job, tmp_path / "whole")
    whole = party_report(tmp_path / "whole", "hospital-a")["rounds"]
    spec = parse_job(job)
    federation = LocalFederation(spec, tmp_path / "split")
    federation.prepare()
    try:
        federation.start_aggregator()
        half = parse_job({**job, "rounds": 2})
        (federation.workdir / "job.json").write_text(half.model_dump_json())
        for party in spec.parties:
            federation.start_party(party)
        assert all(p.wait(timeout=240) == 0 for p in federation.parties.values())
        (federation.workdir / "job.json").write_text(spec.model_dump_json())
        import subprocess
        import sys

        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "confide",
                    "party",
                    "--job",
                    str(federation.workdir / "job.json"),
                    "--party",
                    party,
                    "--aggregator",
                    federation.target,
                    "--certs",
                    str(federation.certs),
                    "--workdir",
                    str(federation.workdir / "parties"),
                    "--resume-round",
                    "2",
                    "--runtime-job-id",
                    "resume-2",
                ]
            )
            for party in spec.parties
        ]
        assert all(p.wait(timeout=240) == 0 for p in processes)
    finally:
        federation.stop()
    resumed = party_report(tmp_path / "split", "hospital-a")
    assert resumed["resumed_after_round"] == 2
    # Aggregation sums in arrival order (float32): equal to summation rounding, not bit for bit.
    np.testing.assert_allclose(resumed["rounds"][-1]["weights"], whole[-1]["weights"], atol=2e-5)


def test_parties_with_different_weight_shapes_fail_before_round_one_naming_party_and_tensor(tmp_path):
    job = keras_job(
        job_id="shapes",
        rounds=2,
        parties=["hospital-a", "hospital-b"],
        model={"algorithm": "custom", "entry": f"{FIXTURES}:federated_model", "network": None, "learning_rate": 0.1},
    )
    job["model"].pop("network")
    # Whichever party compares first reports it: hospital-a sees (64, 3) against its (64, 10), or
    # hospital-b the reverse; either way the message names the other party and both shapes.
    shapes = r"has another model than 'hospital-[ab]': weight 'lin/w' has shape \(64, (3|10)\), ours \(64, (10|3)\)"
    with pytest.raises(JobFailedError, match=shapes):
        run(
            job,
            tmp_path,
            party_env={"hospital-a": {"CONFIDE_TEST_WIDTH": "10"}, "hospital-b": {"CONFIDE_TEST_WIDTH": "3"}},
        )
    assert not any((tmp_path / "parties").glob("*.checkpoints/round-*"))


def test_a_non_finite_update_fails_the_job_naming_party_round_and_tensor_and_keeps_checkpoints(tmp_path):
    job = keras_job(
        job_id="nan",
        rounds=4,
        parties=["hospital-a", "hospital-b"],
        checkpoint_interval=1,
        model={"algorithm": "custom", "entry": f"{FIXTURES}:federated_model", "options": {"width": 10}},
    )
    job["model"].pop("network")
    with pytest.raises(JobFailedError, match=r"party 'hospital-b', round 3: .* non-finite update in weight 'lin/b'"):
        run(job, tmp_path, party_env={"hospital-b": {"CONFIDE_TEST_NAN_ROUND": "3"}})
    kept = sorted(p.name for p in (tmp_path / "parties" / "hospital-b.checkpoints").glob("round-*"))
    assert kept == ["round-000001", "round-000002"]


def test_a_party_without_the_chosen_framework_fails_naming_party_and_backend(tmp_path):
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tensorflow is installed here: the missing-framework path cannot be shown with it")
    job = keras_job(
        job_id="nofw", rounds=2, parties=["hospital-a", "hospital-b"], model={"backends": {"hospital-b": "tensorflow"}}
    )
    with pytest.raises(JobFailedError, match=r"party 'hospital-b': model backend 'tensorflow' is not installed"):
        run(job, tmp_path)


def test_a_keras_job_through_a_controller_session_is_tuned_and_resumed(tmp_path):
    """Submit (grants, FL_Data over each hospital's catalog), tune, resume: the Keras model continues."""
    from confide.local import LocalDeployment

    parties = ["hospital-a", "hospital-b"]
    catalogs = {
        party: {"datasets": {"digits": {"source": "digits", "shard": i, "of": 2, "description": "8x8 digits"}}}
        for i, party in enumerate(parties)
    }
    spec = {
        "job_id": "keras-session",
        "rounds": 4,
        "checkpoint_interval": 2,
        "model": {
            "algorithm": "keras",
            "learning_rate": 0.01,
            "batch_size": 32,
            "network": {
                **NETWORK,
                "input_shape": [64],
                "layers": [{"class_name": "Reshape", "config": {"target_shape": [8, 8, 1]}}, *NETWORK["layers"]],
            },
        },
        "fl_data": {
            "label": "digit",
            "participants": {p: {"dataset": "digits", "test_fraction": 0.2} for p in parties},
        },
        "protection": {"mode": "paillier", "share_timeout_s": 10.0},
        "metrics": ["loss", "accuracy"],
    }
    deployment = LocalDeployment(tmp_path / "deploy", parties=parties, catalogs=catalogs)
    deployment.start()
    try:
        deployment.grant_all("alice", dataset="digits")
        with deployment.client("alice") as alice:
            bad = {**spec, "model": {**spec["model"], "network": {"layers": [{"class_name": "Dense2"}]}}}
            from confide.errors import InvalidParameterError

            with pytest.raises(InvalidParameterError, match=r"model.network.layers\[0\].class_name: 'Dense2'"):
                alice.submit(bad)
            token = alice.submit(spec)["session"]
            status = deployment.wait_session(token, "alice", timeout_s=240)
            assert status["state"] == "completed", status
            results = {p["name"]: p["result"] for p in status["participants"] if p["name"] in parties}
            assert all(r["model"] == "keras" and r["rounds"] == 4 for r in results.values())
            alice.tune(token, settings={"model.learning_rate": 0.005, "rounds": 6})
            assert alice.resume(token)["resume_round"] == 4
            status = deployment.wait_session(token, "alice", timeout_s=240)
            assert status["state"] == "completed", status
        for party in parties:
            run = deployment.workdir / "parties" / party / "sessions" / token / f"run-{status['run']}"
            report = json.loads((run / f"{party}.report.json").read_text())
            assert report["resumed_after_round"] == 4 and [r["round"] for r in report["rounds"]] == [5, 6]
            assert report["model"]["algorithm"] == "keras" and report["rounds"][-1]["test_accuracy"] > 0.8
    finally:
        deployment.stop()


def test_confide_run_trains_on_each_partys_catalog_dataset(tmp_path):
    """The CLI as a new user runs it: the example job over three hospitals' own catalogs."""
    import subprocess
    import sys

    example = ROOT / "examples" / "digits_catalog"
    command = [
        sys.executable,
        "-m",
        "confide",
        "run",
        str(example / "job.yaml"),
        "--rounds",
        "3",
        "--no-progress",
        "--workdir",
        str(tmp_path),
    ]
    for party in ("hospital-a", "hospital-b", "hospital-c"):
        command += ["--catalog", f"{party}={example / f'{party}.yaml'}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "data FL_Data over the parties catalogs" in done.stdout
    assert "protection that ran: paillier" in done.stdout and "final test accuracy" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "confide", "run", str(example / "job.yaml"), "--workdir", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "give each party its catalog (--catalog PARTY=PATH)" in missing.stderr
