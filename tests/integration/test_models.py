"""Neural networks through the model seam: Keras specs on mixed backends, own PyTorch code,
strategies, resume, and bad input (real processes, mTLS). Every mode on digits:
test_models_modes.py; through a controller session and the CLI: test_models_sessions.py."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from confide.errors import JobFailedError
from confide.spec import load_job, parse_job
from tests.fixtures.keras_jobs import FIXTURES, NETWORK, ROOT, keras_job, party_report, run, skip_without_frameworks

skip_without_frameworks()


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
        keras_job(
            job_id=f"s-{strategy['name']}",
            rounds=8,
            parties=["hospital-a", "hospital-b"],  # the strategy runs at the aggregate, whoever sends it
            strategy=strategy,
            protection={"mode": "groupmask"},
        ),
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
