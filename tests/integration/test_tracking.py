"""A job recorded in a real MLflow server (SQLite backend, started here): run, metrics, model registry, lineage.

The server is full MLflow from its own venv (scripts/ensure-mlflow-server.sh, which `make test`
runs); Confide talks to it with the client (mlflow-skinny). Three hospitals train on their CSV
exports with `confide run`; then the run, its per-round metrics (a party's own only where the
job lets it), its artifacts and the registered model version with its lineage tags are read back.
A server that is down: the job completes, the record waits, and `confide tracking replay` sends it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.fixtures.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = ROOT / "build" / "mlflow-venv" / "bin" / "mlflow"
EXAMPLE = ROOT / "examples" / "hospital_csv"
PARTIES = ("hospital-a", "hospital-b", "hospital-c")

pytest.importorskip("mlflow", reason="the 'mlflow' extra (mlflow-skinny) is not installed (make test installs it)")
pytestmark = pytest.mark.skipif(
    not MLFLOW.exists(), reason="no MLflow server venv (scripts/ensure-mlflow-server.sh, run by make test)"
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"http://127.0.0.1:{_port()}"
    log = (root / "server.log").open("w")
    process = subprocess.Popen(
        [
            str(MLFLOW),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            uri.rsplit(":", 1)[1],
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: _healthy(uri), 180, "the MLflow server to answer", alive=lambda: process.poll() is None)
        yield uri
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _run(root: Path, tracking: dict, job_id: str) -> subprocess.CompletedProcess:
    for party in PARTIES:
        if not (root / party).exists():
            shutil.copytree(EXAMPLE / party, root / party)
    spec = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    spec.update(job_id=job_id, rounds=4, checkpoint_interval=2, tracking=tracking)
    job = root / f"{job_id}.yaml"
    job.write_text(yaml.safe_dump(spec))
    catalogs = [arg for p in PARTIES for arg in ("--catalog", f"{p}={root / p / 'catalog.yaml'}")]
    return subprocess.run(
        [sys.executable, "-m", "confide", "run", str(job), *catalogs, "--workdir", str(root / job_id), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_job_is_a_run_with_its_metrics_and_a_registered_model_with_its_lineage(server, tmp_path):
    from mlflow.tracking import MlflowClient

    from confide import checkpoints
    from confide.spec import load_job

    tracking = {"mlflow_uri": server, "register_model": "flc-mortality", "party_metrics": ["hospital-a"]}
    done = _run(tmp_path, tracking, "flc-tracked")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tracking: MLflow run " in done.stdout and "model 'flc-mortality' version 1" in done.stdout
    report = json.loads((tmp_path / "flc-tracked" / "report.json").read_text())

    client = MlflowClient(tracking_uri=server, registry_uri=server)
    experiment = client.get_experiment_by_name("flc-tracked")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.data.params["model.learning_rate"] == "0.2" and run.data.params["protection.mode"] == "secagg"
    assert run.data.tags["confide.protection.ran"] == "secagg"
    # The federated figures of every round, with the round as the step.
    auc = client.get_metric_history(run.info.run_id, "federated/auc")
    assert [m.step for m in auc] == [1, 2, 3, 4]
    assert [m.value for m in auc] == pytest.approx([r["auc"] for r in report["rounds"]])
    assert run.data.metrics["final/auc"] == pytest.approx(report["final_auc"])
    # A party's own figures only where the job lets it: hospital-a's, no one else's.
    own = {key.split("/")[1] for key in run.data.metrics if key.startswith("party/")}
    assert own == {"hospital-a"}
    assert len(client.get_metric_history(run.info.run_id, "party/hospital-a/auc")) == 4
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.json", "job.json", "model"} <= artifacts
    model_files = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert model_files == {"model/hospital-a.model.zip", "model/model.onnx"}

    # The registered version: the run's model folder, its lineage in the tags.
    [version] = client.search_model_versions("name='flc-mortality'")
    assert version.run_id == run.info.run_id and version.source.endswith("/model")
    tags = version.tags
    spec = load_job(tmp_path / "flc-tracked" / "job.json")
    fl_data = spec.fl_data_object()
    assert tags["confide.fl_data.fingerprint"] == fl_data.fingerprint
    assert tags["confide.fl_data.version"] == str(fl_data.version)
    assert tags["confide.parties"] == ",".join(PARTIES) and tags["confide.protection"] == "secagg"
    assert json.loads(tags["confide.datasets"]) == {p: "patients" for p in PARTIES}
    final = checkpoints.round_name(4)
    leaves = {
        p: checkpoints.manifest(tmp_path / "flc-tracked" / "parties" / f"{p}.checkpoints" / final, prefix=f"{final}/")
        for p in PARTIES
    }
    assert tags["confide.checkpoint.root"] == checkpoints.root_of(leaves)
    # The registered file is the party's model file, byte for byte.
    local = Path(client.download_artifacts(run.info.run_id, "model/hospital-a.model.zip", str(tmp_path / "down")))
    assert local.read_bytes() == (tmp_path / "flc-tracked" / "parties" / "hospital-a.model.zip").read_bytes()


def test_a_server_that_is_down_never_fails_the_job_and_the_record_is_sent_later(server, tmp_path):
    from mlflow.tracking import MlflowClient

    down = f"http://127.0.0.1:{_port()}"
    done = _run(tmp_path, {"mlflow_uri": down, "timeout_s": 2, "register_model": "flc-later"}, "flc-offline")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    pending = tmp_path / "flc-offline" / "mlflow-pending.json"
    assert f"warning: tracking server {down} not reached" in done.stdout and pending.exists()
    assert "final test AUC" in done.stdout  # the job's own summary, as without tracking
    # Sent later, to the server that is up now.
    replayed = subprocess.run(
        [sys.executable, "-m", "confide", "tracking", "replay", str(pending), "--uri", server],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert "sent: MLflow run " in replayed.stdout and "model version 1" in replayed.stdout and not pending.exists()
    client = MlflowClient(tracking_uri=server, registry_uri=server)
    [run] = client.search_runs([client.get_experiment_by_name("flc-offline").experiment_id])
    assert len(client.get_metric_history(run.info.run_id, "federated/loss")) == 4
    # Dropped, as a job may ask instead.
    dropped = _run(tmp_path, {"mlflow_uri": down, "timeout_s": 2, "when_unreachable": "drop"}, "flc-dropped")
    assert dropped.returncode == 0 and "the record is dropped" in dropped.stdout
    assert not (tmp_path / "flc-dropped" / "mlflow-pending.json").exists()


def test_a_controller_session_is_recorded_with_its_lineage_and_only_consenting_parties_metrics(server, tmp_path):
    """The controller records a completed session; hospital-b is named but its agent does not consent."""
    from mlflow.tracking import MlflowClient

    from confide.local import LocalDeployment

    deployment = LocalDeployment(tmp_path / "deploy", share_metrics_with_tracking=["hospital-a"])
    deployment.start()
    try:
        deployment.grant_all("alice")
        spec = yaml.safe_load((EXAMPLE.parent / "breast_cancer_controller.yaml").read_text())
        tracking = {"mlflow_uri": server, "register_model": "bc-session", "party_metrics": ["hospital-a", "hospital-b"]}
        down = f"http://127.0.0.1:{_port()}"
        with deployment.client("alice") as alice:
            token = alice.submit({**spec, "job_id": "bc-tracked", "rounds": 3, "tracking": tracking})["session"]
            offline = alice.submit(
                {
                    **spec,
                    "job_id": "bc-offline",
                    "rounds": 3,
                    # this session also runs the lattice mode through the controller (agents, checkpoints)
                    "protection": {"mode": "lattice"},
                    "tracking": {"mlflow_uri": down, "timeout_s": 2, "tensorboard": True},
                }
            )["session"]
            status = deployment.wait_session(token, "alice")
            assert status["state"] == "completed", status
            lattice = deployment.wait_session(offline, "alice")
            assert lattice["state"] == "completed" and lattice["evaluation"]["aggregate"]["test_auc"] > 0.95, lattice

            def entry(session: str):
                return next((e for e in alice.log(session) if e["kind"] == "tracking"), None)

            wait_for(lambda: entry(token) and entry(offline), 120, "both sessions' tracking entries")
            log = alice.log(token)
            stored = alice.entry(token, 1)["spec"]
            noted, missed = entry(token)["note"], entry(offline)["note"]
    finally:
        deployment.stop()
    assert "tracking: MLflow run " in noted and "model 'bc-session' version 1" in noted
    # A server that is down: the session completed all the same, the record waits beside the store.
    pending = tmp_path / "deploy" / "tracking-pending" / f"{offline}.mlflow-pending.json"
    assert f"warning: tracking server {down} not reached" in missed and pending.exists()
    # ... and its metrics are in TensorBoard event files beside the store all the same.
    [board] = (tmp_path / "deploy" / "tensorboard" / "bc-offline").iterdir()
    assert f"TensorBoard event files in {board}" in missed
    assert [step for step, _ in _scalars(board, "federated/auc")] == [1, 2, 3]

    client = MlflowClient(tracking_uri=server, registry_uri=server)
    [run] = client.search_runs([client.get_experiment_by_name("bc-tracked").experiment_id])
    assert run.data.params["protection.mode"] == "secagg" and run.data.tags["confide.protection.ran"] == "secagg"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "federated/auc")] == [1, 2, 3]
    assert run.data.metrics["final/auc"] == pytest.approx(status["evaluation"]["aggregate"]["test_auc"])
    # hospital-a consents and is named; hospital-b is named but did not consent; hospital-c is not named.
    own = {key.split("/")[1] for key in run.data.metrics if key.startswith("party/")}
    assert own == {"hospital-a"} and run.data.tags["confide.party_metrics.withheld"] == "hospital-b"
    # The registered version's lineage matches the session log.
    [version] = client.search_model_versions("name='bc-session'")
    tags = version.tags
    checkpoint = [e for e in log if e["kind"] == "checkpoint"][-1]["checkpoint"]
    assert tags["confide.session"] == token and tags["confide.checkpoint.root"] == checkpoint["root"]
    from confide.spec import parse_job

    assert tags["confide.fl_data.fingerprint"] == parse_job(stored).fl_data_object().fingerprint
    assert "hospital-a/breast-cancer to alice" in tags["confide.grants"]
    location = json.loads(
        Path(client.download_artifacts(run.info.run_id, "model/model-location.json", str(tmp_path / "d"))).read_text()
    )
    assert location["party"] == "hospital-a" and location["file"] == f"sessions/{token}/run-1/hospital-a.model.zip"
    assert (tmp_path / "deploy" / "parties" / "hospital-a" / location["file"]).exists()


def _scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a scalar in the TensorBoard event files of ``folder``, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_event_files_are_the_no_server_option(tmp_path):
    pytest.importorskip("tensorboard", reason="the 'tensorboard' extra is not installed (make test installs it)")
    done = _run(tmp_path, {"tensorboard": True, "party_metrics": ["hospital-b"]}, "flc-board")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "flc-board" / "report.json").read_text())
    board = tmp_path / "flc-board" / "tensorboard" / "flc-board" / "flc-board"
    assert f"tracking: TensorBoard event files in {board}" in done.stdout
    auc = _scalars(board, "federated/auc")
    assert [s for s, _ in auc] == [1, 2, 3, 4]
    assert [v for _, v in auc] == pytest.approx([r["auc"] for r in report["rounds"]], rel=1e-6)  # float32
    assert len(_scalars(board, "party/hospital-b/loss")) == 4
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(board))
    events.Reload()
    assert not [t for t in events.Tags()["scalars"] if t.startswith("party/hospital-a")]
    # A tracking section must say where: a registry needs MLflow.
    from confide.errors import InvalidParameterError
    from confide.spec import parse_job

    base = {"job_id": "x", "parties": ["a", "b"]}
    with pytest.raises(InvalidParameterError, match="name an MLflow server"):
        parse_job({**base, "tracking": {}})
    with pytest.raises(InvalidParameterError, match="register_model registers in MLflow's model registry"):
        parse_job({**base, "tracking": {"tensorboard": True, "register_model": "m"}})
