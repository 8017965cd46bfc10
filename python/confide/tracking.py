"""A finished job recorded in MLflow, and its model registered with its lineage (docs/tracking.md).

What is recorded: the job's specification, per-round metrics, the protection that ran, the model.

The developer's side calls :func:`track` once a job has its report (``confide run`` does, for a
job whose spec has a ``tracking`` section). What is sent is first gathered into a *record*
(:func:`record_of`: plain JSON, no MLflow types), so that a server that cannot be reached costs
nothing but a warning: the record is written next to the report (``mlflow-pending.json``) and
``confide tracking replay`` sends it later, or it is dropped, as the job says. A tracking server
never fails a job.

One MLflow run per job, in the experiment ``tracking.experiment`` (default the job id):

- **params**: the job specification flattened to dotted keys (``model.learning_rate``); the whole
  specification is also the artifact ``job.json``;
- **metrics**, with the round as the step: the federated figures of every round
  (``federated/loss``, ``federated/auc``, bytes, seconds), the final evaluation (``final/auc``),
  the DP budget spent (``dp/epsilon_spent``); a party's own per-round figures
  (``party/<name>/loss``) only for the parties in ``tracking.party_metrics``: a party's metrics
  describe its data, and go only where it allows;
- **tags**: the protection that ran and what the aggregator saw;
- **artifacts**: ``report.json``, ``job.json``, and under ``model/`` the registered party's model
  file and, where the model exports, its ONNX graph (pipeline in front);
- **registry** (``tracking.register_model``): a model version whose source is the run's
  ``model/`` folder, tagged with its lineage: job, session, parties and their datasets, the
  FL_Data version and fingerprint, grants used, protection, DP epsilon, and the Merkle root of
  the parties' final checkpoint files.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from confide.errors import InvalidParameterError

__all__ = [
    "PENDING",
    "deliver",
    "record_of",
    "replay",
    "send",
    "session_record",
    "tensorboard_files",
    "track",
    "write_tensorboard",
]

#: The record of a job that could not be sent, next to its report.
PENDING = "mlflow-pending.json"
FORMAT = "confide.tracking"
#: MLflow's limits: a param value's characters, and items per log_batch call.
MAX_PARAM_CHARS = 6000
BATCH = {"metrics": 1000, "params": 100, "tags": 100}
#: Per-round figures of the job report logged as federated metrics.
ROUND_KEYS = ("loss", "auc", "accuracy", "bytes_sent", "bytes_received", "seconds", "crypto_s", "train_s")


def _flatten(value: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if len(text) > MAX_PARAM_CHARS:
        text = text[: MAX_PARAM_CHARS - 40] + " ... (whole value in job.json)"
    return {prefix: text}


def _checkpoint_root(spec, workdir: Path) -> str | None:
    """Merkle root of the parties' final-round checkpoint files (what a session log records), or None."""
    from confide import checkpoints

    if not spec.checkpoint_interval:
        return None
    name = checkpoints.round_name(spec.rounds)
    manifests = {}
    for party in spec.parties:
        directory = workdir / "parties" / f"{party}.checkpoints" / name
        if not directory.is_dir():
            return None
        manifests[party] = checkpoints.manifest(directory, prefix=f"{name}/")
    return checkpoints.root_of(manifests)


def record_of(spec, report: dict, workdir: str | os.PathLike) -> dict:
    """Everything :func:`send` records for a finished job, as plain JSON (files by path)."""
    tracking = spec.tracking
    if tracking is None:
        raise InvalidParameterError("the job has no tracking section")
    workdir = Path(workdir)
    step_time = int(time.time() * 1000)
    metrics: list[list] = []
    for item in report.get("rounds") or []:
        for key in ROUND_KEYS:
            if isinstance(item.get(key), (int, float)) and not isinstance(item.get(key), bool):
                metrics.append([f"federated/{key}", float(item[key]), step_time, int(item["round"])])
    final_step = int(report["rounds"][-1]["round"]) if report.get("rounds") else 0
    for key in ("final_auc", "final_accuracy"):
        if isinstance(report.get(key), (int, float)):
            metrics.append([f"final/{key.removeprefix('final_')}", float(report[key]), step_time, final_step])
    for key, value in (report.get("metrics") or {}).items():  # a vertical job's guest evaluation
        if isinstance(value, (int, float)):
            metrics.append([f"final/{key}", float(value), step_time, final_step])
    privacy = (report.get("protection") or {}).get("privacy") or {}
    if isinstance(privacy.get("epsilon_spent"), (int, float)):
        metrics.append(["dp/epsilon_spent", float(privacy["epsilon_spent"]), step_time, final_step])
    from confide.reports import round_metrics

    for party in tracking.party_metrics:
        path = workdir / "parties" / f"{party}.report.json"
        own = json.loads(path.read_text()) if path.exists() else {}
        for row in round_metrics(own):
            for key, value in row.items():
                if key != "round":
                    metrics.append([f"party/{party}/{key}", float(value), step_time, int(row["round"])])
    fl_data = spec.fl_data_object() if spec.fl_data is not None else None
    source = tracking.register_from or spec.parties[0]
    artifact = workdir / "parties" / f"{source}.model.zip"
    root = _checkpoint_root(spec, workdir)
    lineage = {
        "confide.job_id": spec.job_id,
        "confide.session": str(report.get("session") or "none (confide run: no controller session)"),
        "confide.parties": ",".join(spec.parties),
        "confide.datasets": json.dumps(spec.datasets() or {}, sort_keys=True),
        "confide.fl_data.version": str(fl_data.version) if fl_data is not None else "none (embedded data)",
        "confide.fl_data.fingerprint": fl_data.fingerprint if fl_data is not None else "none (embedded data)",
        "confide.grants": str(report.get("grants") or "none (confide run: no controller grants)"),
        "confide.protection": str(report.get("mode")),
        "confide.dp.epsilon": str(privacy.get("epsilon_spent", "none (no differential privacy)")),
        "confide.checkpoint.root": root or "none (the job did not checkpoint its last round)",
        "confide.model_from": source,
    }
    return {
        "format": FORMAT,
        "experiment": tracking.experiment or spec.job_id,
        "run_name": spec.job_id,
        "params": _flatten(spec.model_dump(mode="json", exclude={"tracking"})),
        "metrics": metrics,
        "tags": {
            "confide.protection.ran": str(report.get("mode")),
            "confide.protection.requested": str(report.get("mode_requested")),
            "confide.aggregator_saw": str(report.get("aggregator_saw")),
            **lineage,
        },
        "files": {
            "report.json": str(workdir / "report.json"),
            "job.json": json.dumps(spec.model_dump(mode="json"), indent=1, sort_keys=True),
        },
        "model": {"artifact": str(artifact) if artifact.exists() else None, "name": tracking.register_model},
        "lineage": lineage,
    }


#: Per-round figures of a session's parties: averaged over the parties (weighted by their held-out
#: rows where known), summed (bytes), or the slowest party's (seconds).
MEAN_KEYS = ("loss", "test_loss", "auc", "accuracy")
SUM_KEYS = ("bytes_sent", "bytes_received")


def session_record(
    spec,
    *,
    session: str,
    run: int,
    participants: list[dict],
    grants: list[str],
    checkpoint_root: str | None,
    evaluation: dict | None,
) -> dict:
    """What :func:`send` records for a completed controller session, as plain JSON.

    ``participants``: per party ``{"name", "metrics" (its per-round rows), "result", "protection"}``
    as the controller stored them. A party's own rows are logged (``party/<name>/...``) only where
    the job names it in ``tracking.party_metrics`` *and* its agent consents
    (``confide agent --share-metrics-with-tracking``, which the party's final result carries).
    The model file stays at the party: the registered version's ``model/`` folder holds where it
    is (``model-location.json``: party, session, run, file), with the lineage in its tags.
    """
    tracking = spec.tracking
    step_time = int(time.time() * 1000)
    weights = {p["name"]: float((p.get("result") or {}).get("test_samples") or 1) for p in participants}
    by_round: dict[int, list[tuple[str, dict]]] = {}
    for party in participants:
        for row in party.get("metrics") or []:
            if isinstance(row, dict) and isinstance(row.get("round"), int):
                by_round.setdefault(row["round"], []).append((party["name"], row))
    metrics: list[list] = []
    for number, rows in sorted(by_round.items()):
        for key in (*MEAN_KEYS, *SUM_KEYS, "seconds"):
            having = [(name, float(row[key])) for name, row in rows if isinstance(row.get(key), (int, float))]
            if not having:
                continue
            if key in SUM_KEYS:
                value = sum(v for _, v in having)
            elif key == "seconds":
                value = max(v for _, v in having)
            else:
                total = sum(weights[name] for name, _ in having)
                value = sum(weights[name] * v for name, v in having) / total
            metrics.append([f"federated/{key}", value, step_time, number])
    final_step = max(by_round) if by_round else 0
    for key, value in ((evaluation or {}).get("aggregate") or {}).items():
        if key.startswith("test_") and isinstance(value, (int, float)):
            metrics.append([f"final/{key.removeprefix('test_')}", float(value), step_time, final_step])
    consenting = {p["name"] for p in participants if (p.get("result") or {}).get("metrics_to_tracking")}
    shared = [name for name in tracking.party_metrics if name in consenting]
    withheld = sorted(set(tracking.party_metrics) - consenting)
    for party in participants:
        if party["name"] not in shared:
            continue
        for row in party.get("metrics") or []:
            for key, value in row.items():
                if key != "round" and isinstance(value, (int, float)):
                    metrics.append([f"party/{party['name']}/{key}", float(value), step_time, int(row["round"])])
    # what ran, as each party's own report states it (a vertical party's "ran", else its "mode")
    ran = sorted(
        {str(p["protection"].get("ran") or p["protection"].get("mode")) for p in participants if p.get("protection")}
    )
    epsilons = [
        float(((p.get("protection") or {}).get("privacy") or {}).get("epsilon_spent"))
        for p in participants
        if isinstance(((p.get("protection") or {}).get("privacy") or {}).get("epsilon_spent"), (int, float))
    ]
    if epsilons:
        metrics.append(["dp/epsilon_spent", max(epsilons), step_time, final_step])
    fl_data = spec.fl_data_object()
    source = tracking.register_from or spec.parties[0]
    lineage = {
        "confide.job_id": spec.job_id,
        "confide.session": session,
        "confide.run": str(run),
        "confide.parties": ",".join(spec.parties),
        "confide.datasets": json.dumps(spec.datasets() or {}, sort_keys=True),
        "confide.fl_data.version": str(fl_data.version) if fl_data is not None else "none (embedded data)",
        "confide.fl_data.fingerprint": fl_data.fingerprint if fl_data is not None else "none (embedded data)",
        "confide.grants": "; ".join(grants) or "none",
        "confide.protection": ",".join(ran) or str(spec.protection.mode),
        "confide.dp.epsilon": str(max(epsilons)) if epsilons else "none (no differential privacy)",
        "confide.checkpoint.root": checkpoint_root or "none (no checkpoint of the last round recorded)",
        "confide.model_from": source,
    }
    location = {
        "party": source,
        "session": session,
        "run": run,
        "file": f"sessions/{session}/run-{run}/{source}.model.zip",
        "note": "the model file stays at its party (in its agent's work folder); it leaves only by the party's choice",
    }
    summary = {
        "session": session,
        "run": run,
        "evaluation": evaluation,
        "protection": {p["name"]: p.get("protection") for p in participants},
    }
    return {
        "format": FORMAT,
        "experiment": tracking.experiment or spec.job_id,
        "run_name": f"{spec.job_id} ({session[:8]})",
        "params": _flatten(spec.model_dump(mode="json", exclude={"tracking"})),
        "metrics": metrics,
        "tags": {
            "confide.protection.ran": ",".join(ran) or "unknown",
            "confide.protection.requested": str(spec.protection.mode),
            "confide.party_metrics.withheld": ",".join(withheld) or "none",
            **lineage,
        },
        "files": {
            "session.json": json.dumps(summary, indent=1, sort_keys=True, default=str),
            "job.json": json.dumps(spec.model_dump(mode="json"), indent=1, sort_keys=True),
        },
        "model": {"artifact": None, "location": location, "name": tracking.register_model},
        "lineage": lineage,
    }


def _reachable(uri: str, timeout_s: float) -> str | None:
    """None if the MLflow server answers its health check, else why not (no value of the job in it)."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as answer:
            return None if answer.status == 200 else f"health check answered HTTP {answer.status}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        return f"{type(error).__name__}: {getattr(error, 'reason', error)}"


def send(record: dict, uri: str, timeout_s: float = 10.0) -> dict:
    """Record one job in the MLflow server at ``uri``: ``{"run_id", "experiment_id", "model_version"}``."""
    import tempfile

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(max(1, timeout_s))))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    try:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise InvalidParameterError("tracking needs the 'mlflow' extra: pip install 'confide[mlflow]'") from None
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.get_experiment_by_name(record["experiment"])
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(record["experiment"])
    run = client.create_run(experiment_id, run_name=record["run_name"], tags=record["tags"])
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in record["params"].items()]
    metrics = [Metric(k, v, ts, step) for k, v, ts, step in record["metrics"]]
    for start in range(0, len(params), BATCH["params"]):
        client.log_batch(run_id, params=params[start : start + BATCH["params"]])
    for start in range(0, len(metrics), BATCH["metrics"]):
        client.log_batch(run_id, metrics=metrics[start : start + BATCH["metrics"]])
    version = None
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        for name, content in record["files"].items():
            path = Path(content) if name == "report.json" else folder / name
            if name != "report.json":
                path.write_text(content)
            if path.exists():
                client.log_artifact(run_id, str(path))
        model = record["model"]
        if model.get("location") is not None:  # a controller session: the model file stays at its party
            where = folder / "model" / "model-location.json"
            where.parent.mkdir()
            where.write_text(json.dumps(model["location"], indent=1, sort_keys=True))
            client.log_artifact(run_id, str(where), "model")
        if model["artifact"] is not None:
            client.log_artifact(run_id, model["artifact"], "model")
            onnx_note = _onnx_of(model["artifact"], folder / "model.onnx")
            if onnx_note is None:
                client.log_artifact(run_id, str(folder / "model.onnx"), "model")
            else:
                client.set_tag(run_id, "confide.onnx", onnx_note)
        if model["name"] is not None and (model["artifact"] is not None or model.get("location") is not None):
            try:
                client.create_registered_model(model["name"])
            except MlflowException as error:
                if error.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            created = client.create_model_version(
                model["name"],
                f"{run.info.artifact_uri}/model",
                run_id=run_id,
                tags=record["lineage"],
                description=f"Confide job {record['run_name']}: federated model, lineage in the tags",
            )
            version = created.version
    client.set_terminated(run_id, "FINISHED")
    return {"run_id": run_id, "experiment_id": experiment_id, "model_version": version}


def _onnx_of(artifact_path: str, target: Path) -> str | None:
    """Export the model file to ``target``; None on success, else why it has no ONNX graph."""
    from confide.artifact import ModelArtifact, export_onnx

    try:
        export_onnx(ModelArtifact.load(artifact_path), target)
    except InvalidParameterError as error:
        return f"no ONNX export: {error}"[:5000]
    return None


def track(spec, report: dict, workdir: str | os.PathLike, echo=print) -> dict | None:
    """Record a finished job where its ``tracking`` section says; never raises for an unreachable server.

    Returns what :func:`send` returned, ``{"pending": path}`` when the record waits to be sent
    again, ``{"dropped": reason}`` (and ``{"tensorboard": folder}`` with ``tracking.tensorboard``),
    or None for a job without tracking.
    """
    if spec.tracking is None:
        return None
    ran = Path(workdir) / "job.json"
    if ran.exists():  # the specification as it ran (encode categories agreed from the catalogs)
        from confide.spec import load_job

        spec = load_job(ran)
    record = record_of(spec, report, workdir)
    outcome: dict = {}
    if spec.tracking.tensorboard:
        outcome.update(tensorboard_files(record, Path(workdir) / "tensorboard", echo))
    if spec.tracking.mlflow_uri is not None:
        outcome.update(deliver(record, spec.tracking, Path(workdir) / PENDING, echo))
    return outcome


def write_tensorboard(record: dict, root: str | os.PathLike, echo=print) -> Path:
    """The record's metrics as TensorBoard event files: ``<root>/<experiment>/<run name>`` (no server).

    Every metric is a scalar under its MLflow name (``federated/auc``, ``party/<name>/loss``) at
    its step (the round); the lineage tags go in as one text summary, ``confide/lineage``. Needs
    the ``tensorboard`` extra (TensorBoard's own event writer); ``tensorboard --logdir ROOT``
    shows the curves.
    """
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.util.tensor_util import make_tensor_proto
    except ImportError:
        raise InvalidParameterError(
            "tracking.tensorboard needs the 'tensorboard' extra: pip install 'confide[tensorboard]'"
        ) from None
    folder = Path(root) / _safe_name(record["experiment"]) / _safe_name(record["run_name"])
    folder.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(folder))
    try:
        for name, value, stamp, step in record["metrics"]:
            summary = Summary(value=[Summary.Value(tag=name, simple_value=float(value))])
            writer.add_event(Event(wall_time=stamp / 1000.0, step=int(step), summary=summary))
        lineage = "\n".join(f"{key}: {value}" for key, value in sorted(record["lineage"].items()))
        text = Summary.Value(tag="confide/lineage", tensor=make_tensor_proto([lineage]))
        text.metadata.plugin_data.plugin_name = "text"
        writer.add_event(Event(wall_time=time.time(), step=0, summary=Summary(value=[text])))
    finally:
        writer.close()
    echo(f"tracking: TensorBoard event files in {folder} (tensorboard --logdir {Path(root)})")
    return folder


def tensorboard_files(record: dict, root: str | os.PathLike, echo=print) -> dict:
    """:func:`write_tensorboard`, a failure of which warns and never fails the job: ``{"tensorboard": ...}``."""
    try:
        return {"tensorboard": str(write_tensorboard(record, root, echo))}
    except (InvalidParameterError, OSError) as error:
        echo(f"warning: no TensorBoard event files: {error}")
        return {"tensorboard": None}


def _safe_name(name: str) -> str:
    """A folder name from an experiment or run name (letters, digits, ``._-``, spaces as ``_``)."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).strip("._") or "run"
    return cleaned[:128]


def deliver(record: dict, tracking, pending: str | os.PathLike, echo=print) -> dict:
    """Send ``record`` to ``tracking.mlflow_uri``; where the server fails, keep it at ``pending`` or drop it.

    Returns what :func:`send` returned, ``{"pending": path}`` or ``{"dropped": reason}``; a
    warning (through ``echo``) names the server and why it was not reached. Never raises for it.
    """
    problem = _reachable(tracking.mlflow_uri, tracking.timeout_s)
    if problem is None:
        try:
            sent = send(record, tracking.mlflow_uri, tracking.timeout_s)
        except Exception as error:  # noqa: BLE001 - the server failed mid-way; the job stands
            problem = f"{type(error).__name__}: {str(error)[:300]}"
        else:
            echo(
                f"tracking: MLflow run {sent['run_id']} in experiment {record['experiment']!r} at {tracking.mlflow_uri}"
                + (
                    f"; model {record['model']['name']!r} version {sent['model_version']}"
                    if sent["model_version"]
                    else ""
                )
            )
            return sent
    if tracking.when_unreachable == "drop":
        echo(f"warning: tracking server {tracking.mlflow_uri} not reached ({problem}); the record is dropped")
        return {"dropped": problem}
    path = Path(pending)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**record, "uri": tracking.mlflow_uri}, indent=1))
    echo(
        f"warning: tracking server {tracking.mlflow_uri} not reached ({problem}); the record waits in {path}: "
        f"send it with 'confide tracking replay {path}'"
    )
    return {"pending": str(path)}


def replay(path: str | os.PathLike, uri: str | None = None, timeout_s: float = 10.0) -> dict:
    """Send a record :func:`track` kept (``mlflow-pending.json``); the file is removed once sent."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InvalidParameterError(f"{path}: not a pending tracking record ({type(error).__name__})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise InvalidParameterError(f"{path}: not a pending tracking record (format {FORMAT!r} expected)")
    target = uri or record.get("uri")
    problem = _reachable(target, timeout_s)
    if problem is not None:
        raise InvalidParameterError(f"tracking server {target} not reached ({problem}); the record stays in {path}")
    sent = send(record, target, timeout_s)
    path.unlink()
    return sent
