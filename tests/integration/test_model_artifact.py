"""Models a hospital can use: the artifact of a real run scores new records as the party's evaluation
did, and its ONNX export, fed the raw columns of the CSV, gives the same probabilities in onnxruntime."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from confide.artifact import ModelArtifact, predict
from confide.data.catalog import Catalog
from confide.data.onnx_graph import feeds

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hospital_csv"
PARTIES = ("hospital-a", "hospital-b", "hospital-c")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The example job, run with `confide run` over copies of the three hospitals' folders."""
    root = tmp_path_factory.mktemp("flc")
    _run_example(root, (EXAMPLE / "job.yaml").read_text().replace("rounds: 30", "rounds: 12"))
    return root


def _run_example(root, job_text: str) -> None:
    """Copy the three hospitals' folders under ``root`` and run ``job_text`` over them with `confide run`."""
    for party in PARTIES:
        shutil.copytree(EXAMPLE / party, root / party)
    job = root / "job.yaml"
    job.write_text(job_text)
    catalogs = [arg for p in PARTIES for arg in ("--catalog", f"{p}={root / p / 'catalog.yaml'}")]
    done = subprocess.run(
        [sys.executable, "-m", "confide", "run", str(job), *catalogs, "--workdir", str(root / "run")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "confide", *args], capture_output=True, text=True, timeout=300)


def test_predict_gives_the_probabilities_of_the_partys_own_evaluation(trained):
    from sklearn.metrics import roc_auc_score

    artifact_path = trained / "run" / "parties" / "hospital-b.model.zip"
    artifact = ModelArtifact.load(artifact_path)
    manifest = artifact.manifest
    assert manifest["features"][:3] == ["age", "sex=F", "sex=M"] and manifest["label"] == "death"
    assert manifest["fitted"][2]["columns"]["creatinine"]["fill"] > 0  # the party's median, kept for new records
    assert manifest["checkpoint"]["name"] == "round-000012/weights.npz"
    report = json.loads((trained / "run" / "parties" / "hospital-b.report.json").read_text())
    reported_auc = report["rounds"][-1]["test_auc"]

    # The party's held-out rows, scored through the CLI from the raw CSV (NA markers, text column).
    records = trained / "hospital-b" / "patients.csv"
    scored = _cli("model", "predict", str(artifact_path), str(records), "--out", str(trained / "scores.csv"))
    assert scored.returncode == 0, scored.stderr
    with (trained / "scores.csv").open() as f:
        rows = list(csv.DictReader(f))
    scores = {int(r["row"]): float(r["p_death"]) for r in rows}
    table = Catalog.load(trained / "hospital-b" / "catalog.yaml").table("patients")
    assert len(scores) == table.rows  # no filter in the pipeline: every record is scored
    from confide.spec import parse_job

    spec = parse_job(json.loads((trained / "run" / "job.json").read_text()))  # with the agreed categories
    held_out = spec.fl_data_object().provision("hospital-b", table)
    y_test = held_out.y_test
    ours = np.array([scores[int(r)] for r in held_out.test_rows])
    assert roc_auc_score(y_test, ours) == pytest.approx(reported_auc, abs=1e-12)
    # Exactly what the model gives for the party's own prepared test rows.
    np.testing.assert_allclose(ours, artifact.model().predict(held_out.X_test), rtol=0, atol=1e-12)
    rows_again, again = predict(artifact, records)
    np.testing.assert_array_equal(again[held_out.test_rows], ours)


def test_one_new_patient_is_prepared_with_the_training_statistics(trained, tmp_path):
    artifact_path = trained / "run" / "parties" / "hospital-a.model.zip"
    new = tmp_path / "new.csv"
    new.write_text("age;sex;kappa;lambda;flc_grp;creatinine;mgus\n71;M;1.4;1.9;6;NULL;0\n")
    scored = _cli("model", "predict", str(artifact_path), str(new))
    assert scored.returncode == 0, scored.stderr
    [line] = scored.stdout.strip().splitlines()[1:]
    probability = float(line.split(",")[1])
    assert 0.0 < probability < 1.0
    # Scores joined back by an id column; what the model never saw is counted on stderr, never shown.
    ids = tmp_path / "ids.csv"
    ids.write_text(
        "patient;age;sex;kappa;lambda;flc_grp;creatinine;mgus\n"
        "P-001;71;M;1.4;1.9;6;NULL;0\nP-002;150;X;1.1;1.2;3;1.0;0\nP-003;64;U;0.9;1.0;2;0.9;0\n"
    )
    joined = _cli("model", "predict", str(artifact_path), str(ids), "--id-column", "patient")
    assert joined.returncode == 0, joined.stderr
    lines = joined.stdout.strip().splitlines()
    assert lines[0] == "patient,p_death" and [line.split(",")[0] for line in lines[1:]] == ["P-001", "P-002", "P-003"]
    assert "column 'sex': 2 record(s) hold a category the model never saw" in joined.stderr
    assert "column 'age': 1 record(s) outside the training range (0 below, 1 above)" in joined.stderr
    assert "150" not in joined.stderr and "'X'" not in joined.stderr
    unknown = _cli("model", "predict", str(artifact_path), str(ids), "--id-column", "mrn")
    assert unknown.returncode == 2 and "--id-column 'mrn' is not a column of the records" in unknown.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("age,sex\n71,M\n")
    refused = _cli("model", "predict", str(artifact_path), str(bad))
    assert refused.returncode == 2 and "kappa" in refused.stderr and "Traceback" not in refused.stderr


def test_a_file_scored_block_by_block_gets_the_scores_of_the_whole_file(trained, tmp_path):
    from confide.artifact import predict_stream

    artifact_path = trained / "run" / "parties" / "hospital-b.model.zip"
    artifact = ModelArtifact.load(artifact_path)
    records = trained / "hospital-b" / "patients.csv"
    rows, scores = predict(artifact, records)
    blocks = list(predict_stream(artifact, records, block_bytes=4096))
    checks = blocks.pop()
    assert len(blocks) > 10  # the file was read in many blocks
    np.testing.assert_array_equal(np.concatenate([b[0] for b in blocks]), rows)
    # the same up to float64 rounding (a block's matrix product may sum in another order)
    np.testing.assert_allclose(np.concatenate([b[1] for b in blocks]), scores, rtol=1e-12, atol=1e-15)
    assert checks.warnings() == []  # the site's own records hold nothing the model never saw
    # The CLI: --stream writes the same CSV as without it.
    whole = _cli("model", "predict", str(artifact_path), str(records))
    streamed = _cli("model", "predict", str(artifact_path), str(records), "--stream")
    assert whole.returncode == streamed.returncode == 0, streamed.stderr
    table = [line.split(",") for line in whole.stdout.strip().splitlines()]
    again = [line.split(",") for line in streamed.stdout.strip().splitlines()]
    assert again[0] == table[0] == ["row", "p_death"] and len(again) == len(table) == len(rows) + 1
    assert [r[0] for r in again] == [r[0] for r in table]
    np.testing.assert_allclose([float(r[1]) for r in again[1:]], [float(r[1]) for r in table[1:]], rtol=1e-12)
    # A cell that is not a number in a column the model reads as one: the column is named, not the cell.
    bad = tmp_path / "bad.csv"
    bad.write_text(records.read_text().replace("\n54,", "\nfifty-four,", 1))
    refused = _cli("model", "predict", str(artifact_path), str(bad), "--stream")
    assert refused.returncode == 2 and "a cell of column 'age' is not a number" in refused.stderr
    assert "fifty" not in refused.stderr


def test_onnx_export_scores_the_raw_records_as_predict_does(trained, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime", reason="the 'export' extra is not installed")
    artifact_path = trained / "run" / "parties" / "hospital-c.model.zip"
    exported = _cli("model", "export", str(artifact_path), "--out", str(tmp_path / "model.onnx"))
    assert exported.returncode == 0, exported.stderr
    assert (
        "raw columns in: " in exported.stdout
        and "sex (text)" in exported.stdout
        and "creatinine (number)" in exported.stdout
    )
    artifact = ModelArtifact.load(artifact_path)
    table = Catalog.load(trained / "hospital-c" / "catalog.yaml").table("patients")
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    # The raw CSV's columns (text, NA markers as NaN), not features prepared in Python.
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds(session, table)), strict=True))
    assert outputs["kept"].all() and outputs["kept"].shape == (table.rows,)  # no filter in the pipeline
    rows, ours = predict(artifact, trained / "hospital-c" / "patients.csv")
    assert np.isnan(table.columns["creatinine"]).any()  # missing values the graph imputes
    np.testing.assert_allclose(outputs["probabilities"][rows, 1], ours, atol=2e-6)  # the model runs in float32
    # --prepared: the model alone, taking the prepared features.
    from confide.data.fldata import Step, transform

    m = artifact.manifest
    X, _ = transform([Step.from_value(s) for s in m["pipeline"]], m["label"], m["fitted"], table, m["features"])
    prepared = _cli("model", "export", str(artifact_path), "--out", str(tmp_path / "bare.onnx"), "--prepared")
    assert prepared.returncode == 0, prepared.stderr
    bare = onnxruntime.InferenceSession(str(tmp_path / "bare.onnx"), providers=["CPUExecutionProvider"])
    probabilities = np.asarray(bare.run(None, {bare.get_inputs()[0].name: X.astype(np.float32)})[1])[:, 1]
    np.testing.assert_allclose(probabilities, ours, atol=2e-6)
    shown = _cli("model", "show", str(artifact_path))
    assert "trained by hospital-c" in shown.stdout and "sex=F" in shown.stdout


def _predict_and_export(root, party: str):
    """The party's records scored by `confide model predict` and by its ONNX export in onnxruntime (raw columns)."""
    import onnxruntime

    artifact = root / "run" / "parties" / f"{party}.model.zip"
    scored = _cli("model", "predict", str(artifact), str(root / party / "patients.csv"), "--out", str(root / "s.csv"))
    assert scored.returncode == 0, scored.stderr
    with (root / "s.csv").open() as f:
        ours = np.array([float(r["p_death"]) for r in csv.DictReader(f)])
    exported = _cli("model", "export", str(artifact), "--out", str(root / "net.onnx"))
    assert exported.returncode == 0, exported.stderr
    table = Catalog.load(root / party / "catalog.yaml").table("patients")
    session = onnxruntime.InferenceSession(str(root / "net.onnx"), providers=["CPUExecutionProvider"])
    onnx_scores = session.run(None, feeds(session, table))[0][:, 0]  # from the raw columns, NA markers and text
    assert ours.shape == onnx_scores.shape == (table.rows,)
    return ours, onnx_scores, session


KERAS_MODEL = """model:
  algorithm: keras
  learning_rate: 0.01
  local_epochs: 1
  batch_size: 64
  backend: jax
  backends: {hospital-b: torch}
  network:
    layers:
      - {class_name: Dense, config: {units: 8, activation: relu}}
      - {class_name: Dense, config: {units: 1, activation: sigmoid}}
    optimizer: {class_name: Adam}
    loss: binary_crossentropy
"""


def test_a_keras_network_is_scored_and_exported_like_a_linear_model(tmp_path):
    pytest.importorskip("onnxruntime", reason="the 'export' extra is not installed")
    import importlib.util

    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("Keras 3 and PyTorch are not installed (make test installs them)")

    text = (
        (EXAMPLE / "job.yaml")
        .read_text()
        .replace("rounds: 30", "rounds: 3")
        .replace("job_id: flc-mortality", "job_id: flc-net")
    )
    _run_example(tmp_path, text.split("model:")[0] + KERAS_MODEL + "protection: {mode: secagg}\n")
    artifact = tmp_path / "run" / "parties" / "hospital-a.model.zip"  # trained on JAX
    ours, onnx_scores, session = _predict_and_export(tmp_path, "hospital-a")
    m = ModelArtifact.load(artifact).manifest
    assert session.get_outputs()[-1].name == "kept"
    np.testing.assert_allclose(onnx_scores, ours, atol=1e-5)  # JAX's scores, ONNX from the torch backend
    report = json.loads((tmp_path / "run" / "parties" / "hospital-a.report.json").read_text())
    assert m["metrics"]["test_auc"] == report["rounds"][-1]["test_auc"]


TORCH_CODE = """
import torch
import torch.nn.functional as F

from confide.ml.torch_adapter import TorchModel


def train(net, loader, epochs):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    for _ in range(epochs):
        for features, labels in loader:
            optimizer.zero_grad()
            loss = F.binary_cross_entropy_with_logits(net(features).reshape(-1), labels.float())
            loss.backward()
            optimizer.step()
    return {"loss": float(loss)}


def federated_model():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return TorchModel(net, train, batch_size=64)


def with_transform():
    model = federated_model()
    model.input_transform = lambda X: torch.from_numpy(X)
    return model
"""


def test_own_pytorch_code_is_exported_with_the_pipeline_and_scores_raw_records_as_predict(tmp_path):
    pytest.importorskip("onnxruntime", reason="the 'export' extra is not installed")
    pytest.importorskip("torch", reason="PyTorch is not installed (make test installs it)")

    (tmp_path / "tabular_net.py").write_text(TORCH_CODE)
    text = (
        (EXAMPLE / "job.yaml")
        .read_text()
        .replace("rounds: 30", "rounds: 3")
        .replace("job_id: flc-mortality", "job_id: flc-torch")
    )
    model = "model: {algorithm: custom, entry: tabular_net.py:federated_model, local_epochs: 1}\n"
    _run_example(tmp_path, text.split("model:")[0] + model + "protection: {mode: secagg}\n")
    artifact = tmp_path / "run" / "parties" / "hospital-b.model.zip"
    ours, onnx_scores, session = _predict_and_export(tmp_path, "hospital-b")
    assert [o.name for o in session.get_outputs()] == ["probabilities", "kept"]
    assert 0.05 < ours.std()
    np.testing.assert_allclose(onnx_scores, ours, atol=1e-5)
    # A module fed through an input_transform (Python on numpy) cannot go into a graph: refused, saying why.
    job = json.loads(json.dumps(ModelArtifact.load(artifact).manifest))
    assert job["model"]["spec"]["entry"].endswith("tabular_net.py:federated_model")
    from confide.artifact import export_onnx
    from confide.errors import InvalidParameterError

    loaded = ModelArtifact.load(artifact)
    loaded.manifest["model"]["spec"]["entry"] = loaded.manifest["model"]["spec"]["entry"].replace(
        "federated_model", "with_transform"
    )
    with pytest.raises(InvalidParameterError, match="input_transform, Python on numpy arrays"):
        export_onnx(loaded, tmp_path / "refused.onnx")
