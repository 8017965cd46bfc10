"""Vertical jobs (PSI, then SecureBoost or Hetero LR) as separate processes over gRPC + mTLS."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from confide.artifact import ModelArtifact
from confide.data.vertical import vertical_party_data
from confide.errors import InvalidParameterError, JobFailedError
from confide.spec import load_job, parse_job
from confide.vertical.estimators import HeteroNNClassifier, SecureBoostClassifier
from tests.fixtures.faults import with_faults
from tests.fixtures.federation import run_local


def vertical_spec(algorithm: str, **overrides) -> object:
    spec = {
        "job_id": f"vertical-{algorithm}",
        "rounds": 3,
        "parties": ["hospital", "lab"],
        "model": {"algorithm": algorithm, "max_depth": 3, "learning_rate": 0.3, "batch_size": 64},
        "data": {"dataset": "breast_cancer", "guest": "hospital", "overlap": 0.95, "seed": 3},
        "protection": {"mode": "paillier"},
    }
    for key, value in overrides.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_job(spec)


def quiet(*_):
    pass


def test_secureboost_job_aligns_trains_and_writes_each_party_its_own_part(tmp_path):
    report = run_local(vertical_spec("secureboost"), tmp_path, progress=False, echo=quiet)
    assert report["mode"] == "paillier" and report["algorithm"] == "secureboost"
    # 95 % of 569 records at each party, drawn independently: PSI finds the common ones.
    assert 480 < report["psi"]["intersection"] < 541
    assert report["metrics"]["auc"] > 0.97
    assert len(report["rounds"]) == 3 and all(r["splits"] > 0 for r in report["rounds"])
    for party in report["parties"].values():  # each party names the engine that ran its Paillier work
        assert party["paillier_engine"]["crypto_engine"].startswith(("cpu:", "gpu:"))
    guest = json.loads((tmp_path / "parties" / "hospital.report.json").read_text())
    host = json.loads((tmp_path / "parties" / "lab.report.json").read_text())
    assert guest["role"] == "guest" and host["role"] == "host" and host["splits_owned"] > 0
    # Both sites report each boosting round with the bytes their channel carried (the console's curves).
    assert [r["round"] for r in host["rounds"]] == [r["round"] for r in guest["rounds"]] == [1, 2, 3]
    assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in host["rounds"] + guest["rounds"])
    assert sum(r["bytes_sent"] for r in host["rounds"]) <= host["bytes"]["sent"]
    # Each site's model file is one `confide model show` reads; scoring alone is refused, saying why.
    shown = {
        p: subprocess.run(
            [sys.executable, "-m", "confide", "model", "show", str(tmp_path / "parties" / f"{p}.model.zip")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        for p in ("hospital", "lab")
    }
    assert shown["hospital"].returncode == 0, shown["hospital"].stderr
    assert "model secureboost (vertical) of job" in shown["hospital"].stdout
    assert "hospital's part, the guest, with lab (3 rounds, protection paillier)" in shown["hospital"].stdout
    assert "held-out metrics (at the guest): " in shown["hospital"].stdout
    assert "lab's part, the host, with hospital" in shown["lab"].stdout and "no labels here" in shown["lab"].stdout
    assert f"{report['psi']['intersection']} in common" in shown["lab"].stdout
    artifact = ModelArtifact.load(tmp_path / "parties" / "lab.model.zip")
    assert artifact.vertical["role"] == "host" and artifact.manifest["metrics"] == {}
    with pytest.raises(InvalidParameterError, match="scores only together with its partners' parts"):
        artifact.model()
    parts = {p: tmp_path / "parties" / f"{p}.model.cvw" for p in ("hospital", "lab")}
    with zipfile.ZipFile(tmp_path / "parties" / "lab.model.zip") as archive:
        assert archive.read("part.cvw") == parts["lab"].read_bytes()
    estimator = SecureBoostClassifier.from_parts(parts)
    # The loaded parts predict through the protocol, on rows aligned by id.
    pooled = {p: vertical_party_data(p, ["hospital", "lab"], "hospital", overlap=1.0) for p in parts}
    order = {p: np.argsort(d.ids) for p, d in pooled.items()}
    X = {p: pooled[p].X[order[p]] for p in parts}
    y = pooled["hospital"].y[order["hospital"]]
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(y, estimator.predict_proba(X)[:, 1]) > 0.97
    # XGBoost's format holds a guest's trees only where every split is the guest's: here the lab's are too.
    exported = {
        p: subprocess.run(
            [
                sys.executable,
                "-m",
                "confide",
                "model",
                "export",
                str(tmp_path / "parties" / f"{p}.model.zip"),
                "--format",
                "xgboost",
                "--out",
                str(tmp_path / f"{p}.json"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        for p in ("hospital", "lab")
    }
    assert exported["hospital"].returncode != 0 and "split(s) of the model are on hosts' features (lab)" in (
        exported["hospital"].stderr
    )
    assert exported["lab"].returncode != 0 and "the host's part of a secureboost model" in exported["lab"].stderr
    assert not (tmp_path / "hospital.json").exists()


def test_multiclass_secureboost_job_on_digits_split_by_columns(tmp_path):
    spec = vertical_spec(
        "secureboost",
        job_id="vertical-digits",
        rounds=3,
        # 16 bins: the lab's 32 columns give 512 histogram cells a node instead of 1,024, and folding
        # and decrypting them is most of the job's time (109 s at 4 rounds of 32 bins, 50 s so).
        model={"objective": "multi:softprob", "num_class": 10, "n_bins": 16},
        data={"dataset": "digits"},
    )
    report = run_local(spec, tmp_path, progress=False, echo=quiet)
    # 3 rounds x 10 classes: one tree per class per round, each its own encrypted GH pass.
    assert len(report["rounds"]) == 30 and {r["class"] for r in report["rounds"]} == set(range(10))
    assert report["metrics"]["accuracy"] > 0.8 and report["metrics"]["log_loss"] < 1.5
    host = json.loads((tmp_path / "parties" / "lab.report.json").read_text())
    assert host["splits_owned"] > 0  # the lab's pixel columns were used
    guest = json.loads((tmp_path / "parties" / "hospital.report.json").read_text())
    importance = guest["feature_importance"]
    assert "lab" in {r["party"] for r in importance} <= {"guest", "lab"}
    assert sum(r["splits"] for r in importance if r["party"] == "lab") == host["splits_owned"]


def test_hetero_lr_job_reaches_the_centralized_auc(tmp_path):
    report = run_local(
        vertical_spec("hetero_lr", rounds=5, model={"learning_rate": 0.15}), tmp_path, progress=False, echo=quiet
    )
    assert report["algorithm"] == "hetero_lr"
    assert report["metrics"]["auc"] > 0.98
    assert len(report["rounds"]) == 5
    assert report["rounds"][-1]["loss"] < report["rounds"][0]["loss"]


def test_hetero_nn_job_trains_in_separate_processes_and_its_parts_predict(tmp_path):
    spec = vertical_spec(
        "hetero_nn", rounds=6, model={"learning_rate": 0.01, "top": [{"units": 4, "activation": "relu"}]}
    )
    report = run_local(spec, tmp_path, progress=False, echo=quiet)
    assert report["mode"] == "paillier" and report["algorithm"] == "hetero_nn"
    assert report["metrics"]["auc"] > 0.97
    assert len(report["rounds"]) == 6 and report["rounds"][-1]["loss"] < report["rounds"][0]["loss"]
    guest = json.loads((tmp_path / "parties" / "hospital.report.json").read_text())
    host = json.loads((tmp_path / "parties" / "lab.report.json").read_text())
    assert guest["role"] == "guest" and "metrics" in guest
    assert host["role"] == "host" and "metrics" not in host  # the lab never sees scores or labels
    assert all(r["crypto_seconds"] > 0 for r in host["rounds"])
    estimator = HeteroNNClassifier.from_parts({p: tmp_path / "parties" / f"{p}.model.cvw" for p in ("hospital", "lab")})
    pooled = {p: vertical_party_data(p, ["hospital", "lab"], "hospital", overlap=1.0) for p in ("hospital", "lab")}
    order = {p: np.argsort(d.ids) for p, d in pooled.items()}
    X = {p: pooled[p].X[order[p]] for p in pooled}
    y = pooled["hospital"].y[order["hospital"]]
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(y, estimator.predict_proba(X)[:, 1]) > 0.97


CSV_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vertical_csv"
CSV_CATALOGS = {p: str(CSV_EXAMPLE / p / "catalog.yaml") for p in ("hospital", "lab")}


@pytest.mark.parametrize(
    "model",
    [None, {"algorithm": "secureboost", "max_depth": 3, "learning_rate": 0.3}],
    ids=["hetero_nn", "secureboost"],
)
def test_vertical_job_on_the_sites_own_csv_exports(tmp_path, model):
    spec = load_job(CSV_EXAMPLE / "job.yaml")
    if model is not None:
        spec = parse_job({**spec.model_dump(mode="json", exclude={"model"}), "model": model, "rounds": 4})
    report = run_local(spec, tmp_path, progress=False, echo=quiet, catalogs=CSV_CATALOGS)
    # 92 % of 569 patients at each site, chosen independently: PSI finds the common ones.
    assert 440 < report["psi"]["intersection"] < 520
    assert report["metrics"]["auc"] > 0.97
    hospital = json.loads((tmp_path / "parties" / "hospital.report.json").read_text())
    lab = json.loads((tmp_path / "parties" / "lab.report.json").read_text())
    # each site ran the pipeline on its own columns: the site encoding only at the hospital
    assert hospital["columns"][:3] == ["site=east", "site=north", "site=south"]
    assert "patient_id" not in hospital["columns"] and "diagnosis" not in hospital["columns"]
    assert lab["features"] == 20 and not any(c.startswith("site") for c in lab["columns"])
    for site in (hospital, lab):
        assert site["data"]["id_column"] == "patient_id"
        assert site["data"]["join"]["common"] == report["psi"]["intersection"]
    assert hospital["data"]["fl_data_fingerprint"] == lab["data"]["fl_data_fingerprint"]

    # Without a controller, a scoring job names the folder of the sites' model files: here it scores the
    # same records (the guest's labelled, so its report has metrics on every joined record).
    scoring = parse_job(
        {**spec.model_dump(mode="json"), "job_id": "scoring", "score": {"model_dir": str(tmp_path / "parties")}}
    )
    scored = run_local(scoring, tmp_path / "scoring", progress=False, echo=quiet, catalogs=CSV_CATALOGS)
    guest = json.loads((tmp_path / "scoring" / "parties" / "hospital.report.json").read_text())
    host = json.loads((tmp_path / "scoring" / "parties" / "lab.report.json").read_text())
    assert (
        guest["task"] == host["task"] == "score" and guest["scored"] == host["scored"] == report["psi"]["intersection"]
    )
    assert guest["metrics"]["auc"] > 0.97 and "metrics" not in host and guest["warnings"] == []
    lines = (tmp_path / "scoring" / "parties" / "hospital.scores.csv").read_text().splitlines()
    assert lines[0] == "patient_id,score" and len(lines) == guest["scored"] + 1
    assert scored["task"] == "score" and scored["scores"].endswith("hospital.scores.csv"), scored


def test_a_vertical_pipeline_naming_a_column_no_site_holds_is_refused_before_any_process(tmp_path):
    spec = yaml.safe_load((CSV_EXAMPLE / "job.yaml").read_text())  # as written (parsing adds the join)
    spec["fl_data"]["pipeline"] = [
        {"name": "fill", "op": "impute", "params": {"strategy": "median", "columns": ["textur"]}}
    ]
    with pytest.raises(JobFailedError, match="'textur' is held by no party"):
        run_local(parse_job(spec), tmp_path, progress=False, echo=quiet, catalogs=CSV_CATALOGS)
    assert not (tmp_path / "parties").exists()


def test_a_host_that_crashes_mid_training_fails_the_job_with_a_clear_error(tmp_path):
    spec = vertical_spec("secureboost", transport={"message_timeout_s": 8.0})
    with pytest.raises(JobFailedError) as failure:
        run_local(spec, tmp_path, progress=False, echo=quiet, party_env={"lab": with_faults(exit_round=2)})
    text = str(failure.value)
    assert "hospital" in text and "lab" in text
    guest = json.loads((tmp_path / "parties" / "hospital.report.json").read_text())
    assert guest["status"] == "failed" and "MessageTimeoutError" in guest["error"]
    assert len(guest["rounds"]) == 1  # the first tree completed before the host died


def test_vertical_jobs_refuse_other_protection_modes():
    with pytest.raises(ValueError, match="paillier only"):
        vertical_spec("secureboost", protection={"mode": "secagg"})
    with pytest.raises(ValueError, match="data.guest"):
        vertical_spec("hetero_lr", data={"guest": "nobody"})
