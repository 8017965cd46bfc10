"""Scoring new records with a vertical model through the controller, with real processes.

The two sites of ``examples/vertical_csv`` train SecureBoost (and Hetero LR) as a session; each
then publishes a file of new records (the hospital's without the diagnosis, with a value outside
the training range; the two files share only some patients). A scoring job naming the session is
refused and audited without grants on the new files, then runs: PSI aligns the new ids, the
model's prediction protocol scores them, and only the guest (the hospital) holds the scores,
which equal the model's central scores of the joined rows.
"""

from __future__ import annotations

import csv
import json
import shutil
import zipfile

import numpy as np
import pytest
import yaml

from confide.artifact import ModelArtifact
from confide.data.catalog import Catalog
from confide.data.flsteps import Step, record_ids, transform
from confide.errors import ConfideError
from confide.local import LocalDeployment
from confide.vertical import wire
from confide.vertical.estimators import SecureBoostClassifier
from tests.fixtures.cli import confide_cli as cli
from tests.integration.test_vertical import CSV_EXAMPLE
from tests.integration.test_vertical_sessions import HETERO_LR, SECUREBOOST, SITES

NEW = {"hospital": "records_new", "lab": "panel_new"}
#: The lab's new records without one of its measurements.
SHORT = "panel_short"


def _subset(source, target, delimiter: str, keep, drop=(), change=None) -> list[str]:
    with open(source, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter=delimiter))
    names = [c for c in rows[0] if c not in drop]
    chosen = [r for i, r in enumerate(rows) if keep(i)]
    if change is not None:
        change(chosen)
    with open(target, "w", newline="") as handle:
        writer = csv.DictWriter(handle, names, delimiter=delimiter, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(chosen)
    return [r["patient_id"] for r in chosen]


@pytest.fixture
def deployment(tmp_path):
    catalogs = {}
    for site in SITES:
        shutil.copytree(CSV_EXAMPLE / site, tmp_path / site)
    # New records: the hospital's rows 0-149 without the diagnosis, the lab's rows 0-199 of its own
    # (differently ordered) file: only the patients both hold are scored.

    def outside(rows) -> None:
        rows[0]["radius"] = "99.5"  # outside the training range: counted in a warning

    hospital, lab = tmp_path / "hospital", tmp_path / "lab"
    _subset(hospital / "records.csv", hospital / "new.csv", ",", lambda i: i < 150, ["diagnosis"], outside)
    _subset(lab / "panel.csv", lab / "new.csv", ";", lambda i: i < 200)
    _subset(lab / "panel.csv", lab / "short.csv", ";", lambda i: i < 200, ["worst_area"])
    for site in SITES:
        catalog = yaml.safe_load((tmp_path / site / "catalog.yaml").read_text())
        entry = next(iter(catalog["datasets"].values()))
        catalog["datasets"][NEW[site]] = {**entry, "path": "new.csv", "description": "new patients to score"}
        if site == "lab":
            catalog["datasets"][SHORT] = {**entry, "path": "short.csv", "description": "without worst_area"}
        for entry in catalog["datasets"].values():
            entry["path"] = str(tmp_path / site / entry["path"])
        (tmp_path / site / "catalog.yaml").write_text(yaml.safe_dump(catalog))
        catalogs[site] = catalog
    d = LocalDeployment(tmp_path / "deploy", parties=list(SITES), developers=["alice"], catalogs=catalogs)
    d.start()
    try:
        d.catalog_files = {site: tmp_path / site / "catalog.yaml" for site in SITES}
        yield d
    finally:
        d.stop()


def _training_job(model: dict) -> dict:
    spec = yaml.safe_load((CSV_EXAMPLE / "job.yaml").read_text())
    return {**spec, "job_id": f"train-{model['algorithm']}", "rounds": 3, "checkpoint_interval": 0, "model": model}


def _scoring_job(session: str) -> dict:
    participants = {site: {"dataset": dataset} for site, dataset in NEW.items()}
    return {"job_id": "score-new", "score": {"session": session}, "fl_data": {"participants": participants}}


def _central(deployment, model_dirs: dict, algorithm: str) -> dict:
    """The trained model's scores of the joined new rows, in one place: ``{id: score}``."""
    prepared = {}
    for site in SITES:
        artifact = ModelArtifact.load(model_dirs[site] / f"{site}.model.zip")
        m = artifact.manifest
        table = Catalog.load(deployment.catalog_files[site]).table(NEW[site])
        columns = dict(table.columns)
        ids = record_ids(site, "patient_id", columns.pop("patient_id"))
        steps = [Step.from_value(s) for s in m["pipeline"]]
        X, kept = transform(steps, "diagnosis", m["fitted"], type(table)(columns), m["features"])
        prepared[site] = dict(zip(ids[kept].tolist(), X, strict=True))
    common = sorted(set(prepared["hospital"]) & set(prepared["lab"]))
    X = {site: np.array([prepared[site][i] for i in common]) for site in SITES}
    parts = {site: wire.decode((model_dirs[site] / f"{site}.model.cvw").read_bytes())["model"] for site in SITES}
    if algorithm == "secureboost":
        paths = {site: model_dirs[site] / f"{site}.model.cvw" for site in SITES}
        scores = SecureBoostClassifier.from_parts(paths).predict_proba(X)[:, 1]
    else:
        from confide.vertical import hetero_lr as lr

        guest = lr.HeteroLRGuestModel.from_dict(parts["hospital"])
        host = lr.HeteroLRHostModel.from_dict(parts["lab"])
        z = guest.scaling.standardize(X["hospital"]) @ guest.weights + guest.intercept
        z = z + host.scaling.standardize(X["lab"]) @ host.weights
        scores = 1.0 / (1.0 + np.exp(-z))
    return dict(zip(common, scores.tolist(), strict=True))


@pytest.mark.parametrize("model", [SECUREBOOST, HETERO_LR], ids=["secureboost", "hetero_lr"])
def test_a_vertical_model_scores_new_records_through_the_controller_and_only_the_guest_learns_them(deployment, model):
    for site, dataset in SITES.items():
        assert cli(deployment, site, "grant", "add", "--dataset", dataset, "--developer", "alice").returncode == 0
    with deployment.client("alice") as alice:
        trained = alice.submit(_training_job(model))["session"]
        status = deployment.wait_session(trained, "alice")
        assert status["state"] == "completed", status

        # No grant on the new records: refused, and each owner's audit holds the deny.
        with pytest.raises(ConfideError, match="has no grant for dataset hospital/records_new"):
            alice.submit(_scoring_job(trained))
        with deployment.client("hospital") as hospital:
            audit = hospital.audit()
        denies = [e for e in audit if e["action"] == "use:submit" and e["target"] == "hospital/records_new"]
        assert denies and denies[-1]["decision"] == "deny", audit[-5:]

        # What the session fixes cannot be restated, and only a completed vertical session scores.
        with pytest.raises(ConfideError, match="model come from the training session"):
            alice.submit({**_scoring_job(trained), "model": model})

        for site, dataset in NEW.items():
            assert cli(deployment, site, "grant", "add", "--dataset", dataset, "--developer", "alice").returncode == 0
        scoring = alice.submit(_scoring_job(trained))["session"]
        status = deployment.wait_session(scoring, "alice")
        assert status["state"] == "completed", (status["message"], status["participants"])
        spec = alice.entry(scoring, 1)["spec"]
        assert spec["model"]["algorithm"] == model["algorithm"] and spec["score"]["session"] == trained

    sessions = {site: deployment.workdir / "parties" / site / "sessions" for site in SITES}
    model_dirs = {site: sessions[site] / trained / "run-1" for site in SITES}
    runs = {site: sessions[site] / scoring / "run-1" for site in SITES}
    reports = {site: json.loads((runs[site] / f"{site}.report.json").read_text()) for site in SITES}
    expected = _central(deployment, model_dirs, model["algorithm"])

    with open(runs["hospital"] / "hospital.scores.csv", newline="") as handle:
        got = {row["patient_id"]: float(row["score"]) for row in csv.DictReader(handle)}
    assert sorted(got) == sorted(expected) and 30 <= len(got) < 150  # the patients both files hold
    np.testing.assert_allclose([got[i] for i in sorted(got)], [expected[i] for i in sorted(got)], rtol=0, atol=1e-9)
    guest, host = reports["hospital"], reports["lab"]
    assert guest["task"] == "score" and guest["scored"] == len(got) and guest["scores"] == "hospital.scores.csv"
    assert guest["model_from"]["session"] == trained
    assert any("radius" in w and "outside" in w for w in guest["warnings"]), guest["warnings"]
    assert "99.5" not in json.dumps(guest)  # counted, never shown
    # The host served the protocol and learned how many records were scored, no score.
    assert host["scored"] == len(got) and "scores" not in host and "metrics" not in host
    assert not list(runs["lab"].glob("*.scores.csv"))
    host_files = b"".join(p.read_bytes() for p in runs["lab"].iterdir() if p.is_file())
    assert all(repr(v).encode() not in host_files for v in list(got.values())[:20])
    # The parts the scoring used are the model files the training left, which `model show` reads.
    with zipfile.ZipFile(model_dirs["lab"] / "lab.model.zip") as archive:
        manifest = json.loads(archive.read("manifest.json"))
    assert manifest["vertical"]["role"] == "host" and manifest["pipeline"] and manifest["fitted"]
    if model["algorithm"] != "secureboost":
        return
    with deployment.client("alice") as alice:
        # A scoring session is no trained model.
        with pytest.raises(ConfideError, match="the session scores records; a scoring job names a session that trai"):
            alice.submit({**_scoring_job(scoring), "job_id": "score-again"})
        # New records without a column the model was trained on: the job fails, naming it.
        assert cli(deployment, "lab", "grant", "add", "--dataset", SHORT, "--developer", "alice").returncode == 0
        short = _scoring_job(trained)
        short["fl_data"]["participants"]["lab"] = {"dataset": SHORT}
        token = alice.submit({**short, "job_id": "score-short"})["session"]
        status = deployment.wait_session(token, "alice")
    assert status["state"] == "failed", status
    # the session names the first failure its agents report (the lab's, or the guest's PSI abort that
    # points to it); the lab's report names the column
    lab = json.loads((sessions["lab"] / token / "run-1" / "lab.report.json").read_text())
    assert lab["status"] == "failed" and "worst_area" in lab["error"], lab["error"]
