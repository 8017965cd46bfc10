"""A vertical job as a controller session, with real processes: grants, checkpoints, kill, verified resume.

The two sites of ``examples/vertical_csv`` (each its own CSV export, catalog and agent) train the
example's Hetero NN (and SecureBoost, Hetero LR) through the controller: refused without grants;
then an uninterrupted run; then the same job slowed down, every process killed mid-way, a
tampered checkpoint refused by its Merkle root, and the resumed run ending with the
uninterrupted run's model.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from confide.local import LocalDeployment
from confide.vertical import wire
from tests.fixtures.cli import confide_cli as cli
from tests.fixtures.cli import interrupted_session
from tests.integration.test_vertical import CSV_EXAMPLE

SITES = {"hospital": "records", "lab": "panel"}


#: Checkpoints at 2, 4 and 6; the interrupted run is killed after the one at 4 and resumes for 5 and 6
#: (its rounds take 2 s more each until the kill: 4 s from the checkpoint at 4 to the last round).
ROUNDS = 6
SECUREBOOST = {"algorithm": "secureboost", "max_depth": 3, "learning_rate": 0.3}
HETERO_LR = {"algorithm": "hetero_lr", "learning_rate": 0.05, "batch_size": 64}


def job(job_id: str, model: dict | None = None) -> dict:
    spec = yaml.safe_load((CSV_EXAMPLE / "job.yaml").read_text())
    return {**spec, "job_id": job_id, "rounds": ROUNDS, "checkpoint_interval": 2, **({"model": model} if model else {})}


@pytest.fixture
def deployment(tmp_path):
    catalogs = {}
    for site in SITES:
        shutil.copytree(CSV_EXAMPLE / site, tmp_path / site)
        catalog = yaml.safe_load((tmp_path / site / "catalog.yaml").read_text())
        for entry in catalog["datasets"].values():
            entry["path"] = str(tmp_path / site / entry["path"])
        catalogs[site] = catalog
    d = LocalDeployment(tmp_path / "deploy", parties=list(SITES), developers=["alice"], catalogs=catalogs)
    d.start()
    try:
        yield d
    finally:
        d.stop()


def parts(deployment: LocalDeployment, token: str, run: int) -> dict[str, dict]:
    out = {}
    for site in SITES:
        folder = deployment.workdir / "parties" / site / "sessions" / token / f"run-{run}"
        report = json.loads((folder / f"{site}.report.json").read_text())
        assert report["status"] == "completed", report.get("error")
        out[site] = wire.decode((folder / f"{site}.model.cvw").read_bytes())["model"]
    return out


def assert_same_model(got: dict, expected: dict) -> None:
    """Same trees; or same networks and interactive weights W = W' + E (each share alone is random)."""
    if "intercept" in got["hospital"]:
        # Hetero LR: fresh keys and masks every run, the same fixed-point values: the same weights.
        for site in SITES:
            np.testing.assert_allclose(got[site]["weights"], expected[site]["weights"], atol=1e-9)
        assert got["hospital"]["intercept"] == pytest.approx(expected["hospital"]["intercept"], abs=1e-9)
        return
    if "trees" in got["hospital"]:
        # exact integer histograms: split for split, leaf for leaf (record ids are the lab's own draws)
        for a, b in zip(got["hospital"]["trees"], expected["hospital"]["trees"], strict=True):
            assert [(n["owner"], n["feature"], n["bin"], n["weight"]) for n in a] == [
                (n["owner"], n["feature"], n["bin"], n["weight"]) for n in b
            ]
        assert len(got["lab"]["records"]) == len(expected["lab"]["records"])
        return
    for key in ("w", "b"):
        np.testing.assert_allclose(got["hospital"]["net"][key], expected["hospital"]["net"][key], atol=1e-6)
    for a, b in zip(got["lab"]["bottom"]["weights"], expected["lab"]["bottom"]["weights"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    joint = {
        name: (p["hospital"]["shares"]["lab"] + p["lab"]["share"]).view(np.int64) / 2.0**32
        for name, p in (("got", got), ("expected", expected))
    }
    # Masks differ between runs: a share update may round differently by 2^-32, never more.
    np.testing.assert_allclose(joint["got"], joint["expected"], atol=1e-6)


@pytest.mark.parametrize("model", [None, SECUREBOOST, HETERO_LR], ids=["hetero_nn", "secureboost", "hetero_lr"])
def test_vertical_session_refused_without_grants_then_killed_and_resumed_to_the_same_model(deployment, tmp_path, model):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job("vertical-nogrant", model)))
    refused = cli(deployment, "alice", "job", "submit", str(path))
    assert refused.returncode != 0
    assert "has no grant for dataset" in refused.stderr and "confide grant add" in refused.stderr
    for site, dataset in SITES.items():
        assert cli(deployment, site, "grant", "add", "--dataset", dataset, "--developer", "alice").returncode == 0

    with deployment.client("alice") as alice:
        reference = alice.submit(job("vertical-reference", model))["session"]
        status = deployment.wait_session(reference, "alice")
        assert status["state"] == "completed", status
        recorded = [e for e in alice.log(reference) if e["kind"] == "checkpoint"]
        # checkpoints every 2 epochs, each the Merkle root over both sites' state files only
        assert [e["checkpoint"]["round"] for e in recorded] == list(range(2, ROUNDS + 1, 2))
        assert all(e["note"].endswith(": 2 files") for e in recorded), recorded  # one state file per site
        # The session's FL_Data records the PSI join as its last step, in its lineage.
        stored = alice.entry(reference, 1)["spec"]["fl_data"]
        assert stored["state"]["pipeline"][-1] == {
            "name": "psi-join",
            "op": "join",
            "params": {"by": "patient_id", "protocol": "ecdh-psi-ristretto255"},
        }
        assert "pipeline_shaping" in [e["operation"] for e in stored["lineage"]]
    expected = parts(deployment, reference, 1)

    token = interrupted_session(deployment, "alice", job("vertical-interrupted", model), after_round=4, delay_s=2.0)
    with deployment.client("alice") as alice:
        recorded = alice.status(token)["checkpoint"]
        state = (
            deployment.workdir / "parties" / "lab" / "sessions" / token / "checkpoints"
            / f"round-{recorded['round']:06d}" / "state.cvw"
        )  # fmt: skip
        original = state.read_bytes()
        state.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        alice.resume(token)
        refused = deployment.wait_session(token, "alice", states=("refused", "running", "completed"), timeout_s=60)
        assert refused["state"] == "refused", refused
        assert f"lab/round-{recorded['round']:06d}/state.cvw: changed" in refused["message"]

        state.write_bytes(original)
        resumed = cli(deployment, "alice", "job", "resume", token, "--wait")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        status = alice.status(token)
        assert status["state"] == "completed", status
        run = status["run"]
    for site in SITES:
        report = json.loads(
            (
                deployment.workdir / "parties" / site / "sessions" / token / f"run-{run}" / f"{site}.report.json"
            ).read_text()
        )
        assert report["resumed_after_round"] == recorded["round"]
        # every site, a SecureBoost host too, reports the rounds it took part in
        assert [r["round"] for r in report["rounds"]] == list(range(recorded["round"] + 1, ROUNDS + 1))
    assert_same_model(parts(deployment, token, run), expected)


def test_a_secureboost_session_that_stops_early_completes_with_its_last_rounds_checkpoint(deployment):
    for site, dataset in SITES.items():
        assert cli(deployment, site, "grant", "add", "--dataset", dataset, "--developer", "alice").returncode == 0
    # A learning rate this large overfits within a few rounds: the validation loss turns up.
    model = {**SECUREBOOST, "learning_rate": 1.5, "validation_fraction": 0.3, "early_stopping_rounds": 1}
    with deployment.client("alice") as alice:
        token = alice.submit({**job("vertical-early", model), "rounds": 12, "checkpoint_interval": 5})["session"]
        status = deployment.wait_session(token, "alice")
        assert status["state"] == "completed", status
        recorded = [e["checkpoint"]["round"] for e in alice.log(token) if e["kind"] == "checkpoint"]
        # The aggregator only relayed: its row shows the settled session, not a run still going.
        rows = {p["role"]: p["status"] for p in status["participants"]}
        assert rows == {"party": "completed", "aggregator": "completed"}, status["participants"]
    report = json.loads(
        (
            deployment.workdir / "parties" / "hospital" / "sessions" / token / "run-1" / "hospital.report.json"
        ).read_text()
    )
    stopped = len(report["validation_loss"])
    assert stopped < 12 and report["best_round"] == stopped - 2 and report["trees_kept"] == stopped - 1
    # Checkpoints every 5 rounds and after the round training stopped at, recorded by both sites.
    assert recorded == [r for r in (5, 10) if r < stopped] + [stopped]
    assert status["message"].endswith(f"checkpoint of round {stopped} recorded"), status["message"]
