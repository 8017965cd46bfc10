"""A Keras job through a controller session (grants, FL_Data, tuning, resume) and through
``confide run`` over each party's catalog (real processes, mTLS)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.keras_jobs import NETWORK, ROOT, skip_without_frameworks

skip_without_frameworks()


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
