"""A trained model a hospital can use: one self-describing file, scored and exported by the CLI.

Every party writes ``<party>.model.zip`` at the end of a job, next to its report (under an
agent: ``<workdir>/sessions/<session>/run-<N>/``). The archive holds:

``manifest.json``
    format and version; the job, its session and run (when a controller ran it) and the party;
    the label and the feature names in the model's input order; the FL_Data pipeline with the
    statistics this party fitted on its own rows (imputation values, scaling parameters,
    encoding categories) and the lowest and highest value of each raw numeric column; the model
    specification and its weight layout; the rounds trained,
    the protection that ran, the party's final held-out metrics; the SHA-256 of the final
    checkpoint's ``weights.npz`` (a leaf of the Merkle root the controller recorded for that
    round, which ``confide session log`` prints) when the job checkpoints its last round.
``weights.npz``
    the global model's tensors by name.

``confide model show|predict|export`` read it. :func:`predict` prepares new records with the
fitted statistics, never statistics of the new records, so a party's own held-out rows get the
probabilities its evaluation saw. :func:`export_onnx` converts linear models (``homo_lr``)
through skl2onnx's maintained converter and Keras networks through Keras's own ONNX exporter,
and puts the fitted pipeline in front (:mod:`confide.data.onnx_graph`): the graph takes the raw
columns and runs in onnxruntime.

The fitted statistics describe this party's rows (a median, a mean and standard deviation per
column): the artifact stays at the party like the data, and is shared only by its owner's choice.
"""

from __future__ import annotations

import io
import json
import os
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from confide.checkpoints import UNREADABLE_FILE_ERRORS
from confide.errors import InvalidParameterError

__all__ = [
    "ModelArtifact",
    "check_records",
    "export_onnx",
    "export_xgboost",
    "load_vertical_part",
    "predict",
    "predict_stream",
    "read_records",
    "vertical_part_path",
    "write_artifact",
    "write_vertical_artifact",
]

FORMAT = "confide.model"
VERSION = 1
#: Export formats by model algorithm (what a standard format can hold).
EXPORTS = {"homo_lr": ("onnx",), "keras": ("onnx",), "custom": ("onnx",), "secureboost": ("xgboost",)}


@dataclass
class ModelArtifact:
    """A loaded ``.model.zip``: its manifest and its weights by tensor name."""

    manifest: dict[str, Any]
    weights: dict[str, np.ndarray]
    #: A vertical job's part (``part.cvw``, confide.vertical.wire); None for a whole model.
    part: bytes | None = None

    @classmethod
    def load(cls, path: str | os.PathLike) -> ModelArtifact:
        """Read and check an artifact; errors name the file and what is wrong with it."""
        path = Path(path)
        if path.name.endswith(".model.cvw"):
            raise InvalidParameterError(
                f"{path}: the raw part of a vertical model (<party>.model.cvw); `confide model` reads the model file "
                f"beside it, {path.name.removesuffix('.model.cvw')}.model.zip; new records are scored by a scoring job "
                "through the controller (docs/vertical.md#scoring-new-records)"
            )
        try:
            with zipfile.ZipFile(path) as archive:
                manifest = json.loads(archive.read("manifest.json"))
                with np.load(io.BytesIO(archive.read("weights.npz")), allow_pickle=False) as npz:
                    weights = {name: npz[name] for name in npz.files}
                part = archive.read("part.cvw") if "part.cvw" in archive.namelist() else None
        except FileNotFoundError:
            raise InvalidParameterError(f"{path}: no such model file") from None
        except UNREADABLE_FILE_ERRORS as error:
            raise InvalidParameterError(
                f"{path}: not a Confide model artifact ({type(error).__name__}); it is the <party>.model.zip "
                "a party writes next to its report"
            ) from None
        if not isinstance(manifest, dict):
            raise InvalidParameterError(f"{path}: manifest.json holds a {type(manifest).__name__}, not an object")
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise InvalidParameterError(
                f"{path}: format {manifest.get('format')!r} version {manifest.get('version')!r}, "
                f"expected {FORMAT!r} version {VERSION}"
            )
        return cls(manifest, weights, part)

    @property
    def vertical(self) -> dict | None:
        """A vertical job's part: ``{"role", "guest", "hosts", "id_column", "common_records"}``; None otherwise."""
        return self.manifest.get("vertical")

    def _whole_model_needed(self) -> None:
        if self.vertical is not None:
            raise InvalidParameterError(
                f"this is {self.manifest['party']}'s part of a vertical {self.manifest['model']['spec']['algorithm']} "
                f"model (the {self.vertical['role']}; partners {', '.join(self._partners())}): it scores only together "
                "with its partners' parts, in a scoring job through the controller (score: {session: ...}, "
                "docs/vertical.md#scoring-new-records)"
            )

    def _partners(self) -> list[str]:
        v = self.vertical or {}
        return [p for p in [v.get("guest"), *(v.get("hosts") or [])] if p and p != self.manifest["party"]]

    @property
    def features(self) -> list[str]:
        """Input columns of the model, in order (after the pipeline)."""
        return list(self.manifest["features"])

    def model(self, keras_backend: str | None = None):
        """The model of the seam with these weights loaded (a Keras network on ``keras_backend``)."""
        self._whole_model_needed()
        from confide.ml import WeightLayout, build_model
        from confide.spec import ModelSpec

        spec = ModelSpec.model_validate(self.manifest["model"]["spec"])
        model = build_model(
            spec,
            seed=0,
            party_id=self.manifest["party"],
            network=self.manifest["model"].get("network"),
            keras_backend=keras_backend,
        )
        model.build(tuple(self.manifest["model"]["example_shape"]), int(self.manifest["model"]["classes"]))
        layout = WeightLayout.from_dict(self.manifest["model"]["layout"])
        layout.check(self.weights, who="artifact")
        model.set_weights(self.weights)
        return model


def _head(spec, party: str, session: str | None, runtime_job_id: str | None) -> dict:
    """The manifest keys every model file starts with."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(),
        "job_id": spec.job_id,
        "runtime_job_id": runtime_job_id,
        "session": session,
        "party": party,
    }


def _write_archive(path: str | os.PathLike, manifest: dict, fill) -> Path:
    """``path`` written atomically (temporary file, fsync, rename): the manifest, then what ``fill(archive)`` adds."""
    path = Path(path)
    temporary = path.with_suffix(".tmp")
    with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
        fill(archive)
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return path


def write_artifact(
    path: str | os.PathLike,
    *,
    model,
    layout,
    spec,
    party: str,
    session: str | None,
    data,
    rounds: int,
    protection: dict | None,
    metrics: dict | None,
    runtime_job_id: str | None,
    checkpoint_leaf: dict | None,
) -> Path:
    """Write ``path`` atomically (temporary file, fsync, rename)."""
    fl_data = spec.fl_data_object()
    manifest = {
        **_head(spec, party, session, runtime_job_id),
        "label": fl_data.label if fl_data is not None else None,
        "features": list(data.feature_names) if data.feature_names else None,
        "pipeline": [step.to_dict() for step in fl_data.pipeline] if fl_data is not None else None,
        "fitted": data.fitted,
        "ranges": getattr(data, "ranges", None),
        "dataset": (spec.datasets() or {}).get(party),
        "model": {
            "spec": spec.model.model_dump(mode="json"),
            "network": spec.network(),
            "layout": layout.to_dict(),
            "example_shape": list(data.example_shape),
            "classes": int(data.classes),
        },
        "rounds": rounds,
        "protection": (protection or {}).get("mode"),
        "metrics": metrics or {},
        "checkpoint": checkpoint_leaf,
    }

    def fill(archive: zipfile.ZipFile) -> None:
        # Streamed into the archive: a large model's artifact holds no second copy of it in memory.
        # Stored, not deflated: float weights barely compress, and deflating 400 MB takes seconds.
        info = zipfile.ZipInfo("weights.npz", date_time=time.localtime()[:6])
        info.compress_type = zipfile.ZIP_STORED
        with archive.open(info, "w", force_zip64=True) as entry:
            np.savez(entry, **model.get_weights())

    return _write_archive(path, manifest, fill)


def write_vertical_artifact(
    path: str | os.PathLike,
    *,
    spec,
    party: str,
    session: str | None,
    runtime_job_id: str | None,
    report: dict,
    part: bytes,
    prepared: dict | None = None,
) -> Path:
    """Write a vertical job's ``<party>.model.zip``: this site's part of the model, described.

    The manifest says what ``confide model show`` prints for any model (job, session, party,
    rounds, protection, metrics: at the guest only) and, under ``vertical``, the site's role,
    its partners, the id column and how many records PSI found in common. ``part.cvw`` is the
    part itself (the same bytes as ``<party>.model.cvw``); ``weights.npz`` is empty. ``prepared``
    (jobs over FL_Data): the site's pipeline steps as they ran there, their fitted statistics and
    the raw columns' ranges, with which a scoring job prepares new records of this site.
    """
    guest = spec.guest
    fl_data = spec.fl_data_object()
    prepared = prepared or {}
    manifest = {
        **_head(spec, party, session, runtime_job_id),
        "label": fl_data.label if fl_data is not None and party == guest else None,
        "features": list(report.get("columns") or []),
        "pipeline": prepared.get("steps"),
        "fitted": prepared.get("fitted"),
        "ranges": prepared.get("ranges"),
        "dataset": (spec.datasets() or {}).get(party),
        "model": {"spec": spec.model.model_dump(mode="json"), "network": None, "layout": None},
        "rounds": len(report.get("rounds") or []),
        "protection": (report.get("protection") or {}).get("ran"),
        "metrics": report.get("metrics") or {},
        "checkpoint": None,
        "vertical": {
            "role": report.get("role"),
            "holds_labels": party == guest,
            "guest": guest,
            "hosts": [p for p in spec.parties if p != guest],
            "id_column": spec.data.id_column,
            "common_records": (report.get("psi") or {}).get("intersection"),
        },
    }

    def fill(archive: zipfile.ZipFile) -> None:
        buffer = io.BytesIO()
        np.savez(buffer)
        archive.writestr("weights.npz", buffer.getvalue())
        archive.writestr("part.cvw", part)

    return _write_archive(path, manifest, fill)


def vertical_part_path(model_from: str | os.PathLike, party: str) -> Path:
    """Where ``party``'s part of a vertical model is: an agent's session folder (its current run) or a folder."""
    folder = Path(model_from)
    current = folder / "current-run"
    if current.exists():
        folder = folder / f"run-{int(current.read_text().strip())}"
    return folder / f"{party}.model.zip"


def load_vertical_part(spec, party: str, model_from: str | os.PathLike | None) -> tuple[ModelArtifact, dict]:
    """The part of a vertical model a scoring job (``spec.score``) uses at ``party``, checked against the job.

    Errors say which part is missing, or which model it belongs to when it is not the job's.
    """
    from confide.errors import JobFailedError
    from confide.vertical import wire

    if model_from is None:
        raise JobFailedError(f"party {party!r}: a scoring job needs the folder of the trained model")
    path = vertical_part_path(model_from, party)
    if not path.exists():
        raise JobFailedError(
            f"party {party!r}: no part of the trained model at {path}: the training run did not complete at this site"
        )
    artifact = ModelArtifact.load(path)
    vertical = artifact.vertical
    trained = artifact.manifest["model"]["spec"]["algorithm"]
    if vertical is None:
        raise JobFailedError(f"party {party!r}: {path} holds a whole {trained} model, not a part of a vertical one")
    hosts = sorted(p for p in spec.parties if p != spec.guest)
    if trained != spec.model.algorithm or vertical["guest"] != spec.guest or sorted(vertical["hosts"]) != hosts:
        raise JobFailedError(
            f"party {party!r}: {path} is a part of a {trained} model with guest {vertical['guest']!r} and hosts "
            f"{sorted(vertical['hosts'])}; this job scores with a {spec.model.algorithm} model, guest {spec.guest!r} "
            f"and hosts {hosts}"
        )
    if artifact.manifest.get("pipeline") is None:
        raise JobFailedError(
            f"party {party!r}: {path} was trained on embedded example data (or written before model files recorded "
            "the fitted pipeline): it has no steps to prepare new records with"
        )
    return artifact, wire.decode(artifact.part)


def _records_entry(path: str | os.PathLike, delimiter: str, missing: list[str] | None) -> tuple[dict, Path]:
    from confide.data.catalog import MISSING_MARKERS

    path = Path(path).resolve()
    entry = {"source": "csv", "path": str(path), "delimiter": delimiter, "missing": list(missing or MISSING_MARKERS)}
    if path.suffix in (".parquet", ".pq") or path.is_dir():
        entry = {"source": "parquet", "path": str(path)}
    return entry, path


def predict_stream(
    artifact: ModelArtifact,
    records: str | os.PathLike,
    *,
    delimiter: str = "auto",
    missing: list[str] | None = None,
    keep: Sequence[str] = (),
    block_bytes: int = 8 << 20,
):
    """:func:`predict` over a file too large to hold: ``(row numbers, scores, kept columns)`` block by block.

    Memory holds one block of the file (about ``block_bytes`` of CSV, a Parquet row group) and its
    scores. Row numbers count from the file's first record; ``keep`` names columns returned as
    they are, for each scored row (an id column). The last item yielded is the
    :class:`~confide.data.flsteps.RecordChecks` of every block. Columns the pipeline encodes or
    compares with text (and those in ``keep``) are read as text, all others as numbers.
    """
    from confide.data.flsteps import RecordChecks, read_columns
    from confide.data.onnx_graph import text_columns
    from confide.data.sources import iter_records, parse_entry

    manifest = _fl_data_manifest(artifact)
    entry, path = _records_entry(records, delimiter, missing)
    parsed = parse_entry("records", entry, path.parent)
    checks = RecordChecks(manifest["pipeline"], manifest["fitted"], manifest.get("ranges"))
    start = 0
    needed = read_columns(manifest["pipeline"], manifest["fitted"], manifest["features"]) | set(keep)
    text = text_columns(manifest["pipeline"]) | set(keep)
    for table in iter_records(parsed, needed, text, block_bytes):
        missing_keep = [c for c in keep if c not in table.columns]
        if missing_keep:
            raise InvalidParameterError(f"the records lack the column(s) {missing_keep}")
        checks.add(table)
        rows, scores = predict(artifact, table)
        yield rows + start, scores, {c: table.columns[c][rows] for c in keep}
        start += table.rows
    yield checks


def read_records(path: str | os.PathLike, delimiter: str = "auto", missing: list[str] | None = None):
    """A CSV (or Parquet) of records as a catalog reads it (delimiter detected, missing markers)."""
    from confide.data.catalog import Catalog

    entry, path = _records_entry(path, delimiter, missing)
    return Catalog.from_mapping({"datasets": {"records": entry}}, base_dir=path.parent).table("records")


def predict(artifact: ModelArtifact, records, **reader) -> tuple[np.ndarray, np.ndarray]:
    """Score a CSV (or Parquet) of new records, or a :func:`read_records` table: ``(row numbers, scores)``.

    The records go through the job's pipeline with the statistics fitted at training time. Rows
    a pipeline filter drops are not scored (their numbers are absent from the result). Scores:
    P(label = 1) for binary models, one column per class otherwise.
    """
    from confide.data.catalog import Table
    from confide.data.fldata import Step, transform

    manifest = _fl_data_manifest(artifact)
    table = records if isinstance(records, Table) else read_records(records, **reader)
    pipeline = [Step.from_value(step) for step in manifest["pipeline"]]
    X, rows = transform(pipeline, manifest["label"], manifest["fitted"], table, manifest["features"])
    model = artifact.model()
    if not hasattr(model, "predict"):
        raise InvalidParameterError(f"model {manifest['model']['spec']['algorithm']!r} cannot score records yet")
    return rows, np.asarray(model.predict(X))


def _fl_data_manifest(artifact: ModelArtifact) -> dict:
    artifact._whole_model_needed()
    manifest = artifact.manifest
    if manifest.get("features") is None or manifest.get("pipeline") is None:
        raise InvalidParameterError(
            "this model was trained on embedded example data, not FL_Data: it has no feature names to read records by"
        )
    return manifest


def check_records(artifact: ModelArtifact, table) -> list[str]:
    """What in new records (a :func:`read_records` table) the model never saw: warnings with counts, never values.

    Categories an encode step does not know, and numbers outside the training range of their
    column (artifacts written before the ranges were recorded check categories only).
    """
    from confide.data.flsteps import record_warnings

    manifest = _fl_data_manifest(artifact)
    return record_warnings(manifest["pipeline"], manifest["fitted"], manifest.get("ranges"), table)


def export_onnx(artifact: ModelArtifact, path: str | os.PathLike, *, prepared: bool = False) -> Path:
    """The model in ONNX, with the fitted FL_Data pipeline in front of it; opens in onnxruntime.

    The graph takes the raw columns by name (:mod:`confide.data.onnx_graph` says in which types)
    and outputs the model's outputs and ``kept`` (which rows the pipeline's filters keep): on raw
    records it gives what :func:`predict` gives, to float32 precision. ``prepared``: the model
    alone, taking the prepared features (float32, the manifest's order) as its one input.
    Linear models (``homo_lr``) through skl2onnx's converter; Keras networks through Keras's own
    exporter on the torch backend; own PyTorch code (``custom`` with a
    :class:`~confide.ml.torch_adapter.TorchModel`) through PyTorch's exporter, with the sigmoid or
    softmax of :meth:`~confide.ml.torch_adapter.TorchModel.predict` in the graph. Own scikit-learn
    code has none yet.
    """
    algorithm = artifact.manifest["model"]["spec"]["algorithm"]
    if "onnx" not in EXPORTS.get(algorithm, ()):
        raise InvalidParameterError(
            f"model {algorithm!r} has no ONNX export yet (exports: "
            f"{', '.join(f'{a}: {f}' for a, fs in EXPORTS.items() for f in fs)}); the artifact's weights.npz holds "
            "its tensors by name"
        )
    try:
        import onnx
    except ImportError:
        raise InvalidParameterError("ONNX export needs the 'export' extra: pip install 'confide[export]'") from None
    exporters = {"keras": _keras_onnx, "custom": _torch_onnx, "homo_lr": _linear_onnx}
    model = exporters[algorithm](artifact)
    manifest = artifact.manifest
    if not prepared:
        if manifest.get("features") is None or manifest.get("pipeline") is None:
            raise InvalidParameterError(
                "this model was trained on embedded example data, not FL_Data: it has no raw columns to take; "
                "export it with prepared=True (--prepared) to take the prepared features"
            )
        model = _with_pipeline(model, manifest)
    model.doc_string = f"Confide {algorithm} of job {manifest['job_id']} (party {manifest['party']}); inputs: " + (
        f"{', '.join(artifact.features or [])} after the job's pipeline (float32)"
        if prepared
        else "the raw columns by name (confide.data.onnx_graph); outputs also 'kept' (rows the filters keep)"
    )
    path = Path(path)
    onnx.save_model(model, str(path))
    return path


def export_xgboost(artifact: ModelArtifact, path: str | os.PathLike) -> Path:
    """A SecureBoost guest's trees as an XGBoost JSON model, when every split is the guest's.

    The model takes the guest's prepared features (the manifest's ``features``, in order, as
    float32): the pipeline is not in it. Refused, with the reason, for another model, a host's
    part, or trees that split on hosts' features
    (:mod:`confide.vertical.secureboost.xgboost_json`).
    """
    import json as json_module

    from confide.vertical import wire
    from confide.vertical.secureboost.tree import SecureBoostGuestModel
    from confide.vertical.secureboost.xgboost_json import guest_trees_json

    manifest = artifact.manifest
    algorithm = manifest["model"]["spec"]["algorithm"]
    vertical = artifact.vertical or {}
    if algorithm != "secureboost" or vertical.get("role") != "guest":
        what = f"the {vertical['role']}'s part of a {algorithm} model" if vertical else f"a {algorithm} model"
        raise InvalidParameterError(
            f"this is {what}: XGBoost's format holds a SecureBoost guest's trees only (the guest's model.zip)"
        )
    model = SecureBoostGuestModel.from_dict(wire.decode(artifact.part)["model"])
    document = guest_trees_json(model, list(manifest["features"]))
    path = Path(path)
    path.write_text(json_module.dumps(document))
    return path


def _keras_onnx(artifact: ModelArtifact):
    """The network through Keras's own exporter (maintained with Keras), on the torch backend.

    Whatever backend trained it: the weights are the same numpy arrays on every backend.
    """
    import tempfile

    import onnx

    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "model.onnx"
        artifact.model(keras_backend="torch").export_onnx(str(target))
        return onnx.load_model(str(target))


def _torch_onnx(artifact: ModelArtifact):
    """Own PyTorch code: the module, then the sigmoid (one logit) or softmax ``predict`` applies.

    Input ``features`` (rows x the manifest's features, float32), output ``probabilities``: P(label
    = 1) in one column for one logit, else one column per class. A module fed through an
    ``input_transform`` (Python on numpy arrays, which a graph cannot hold) is refused.
    """
    import tempfile

    import onnx

    from confide.ml.torch_adapter import TorchModel, import_torch

    model = artifact.model()
    entry = artifact.manifest["model"]["spec"].get("entry")
    if not isinstance(model, TorchModel):
        raise InvalidParameterError(
            f"model.entry {entry!r} builds a {type(model).__name__}: the ONNX export of own code covers PyTorch "
            "modules (confide.ml.torch_adapter.TorchModel)"
        )
    if model.input_transform is not None:
        raise InvalidParameterError(
            f"model.entry {entry!r} feeds its module through an input_transform, Python on numpy arrays that an "
            "ONNX graph cannot hold: reshape inside the module's forward to export it"
        )
    torch = import_torch()

    class Scores(torch.nn.Module):
        def __init__(self, net) -> None:
            super().__init__()
            self.net = net

        def forward(self, features):
            logits = self.net(features)
            if logits.ndim == 1 or logits.shape[-1] == 1:
                return torch.sigmoid(logits.reshape(-1, 1))
            return torch.softmax(logits, dim=1)

    module = Scores(model.module).eval()
    example = torch.zeros((2, *artifact.manifest["model"]["example_shape"]), dtype=torch.float32)
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(
                module,
                (example,),
                str(target),
                input_names=["features"],
                output_names=["probabilities"],
                dynamic_axes={"features": {0: "rows"}, "probabilities": {0: "rows"}},
                opset_version=17,
                dynamo=False,
            )
        return onnx.load_model(str(target))


def _linear_onnx(artifact: ModelArtifact):
    try:
        from skl2onnx import to_onnx
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise InvalidParameterError("ONNX export needs the 'export' extra: pip install 'confide[export]'") from None
    coef = np.asarray(artifact.weights["lr/coef"], dtype=np.float64).reshape(1, -1)
    intercept = np.asarray(artifact.weights["lr/intercept"], dtype=np.float64).reshape(1)
    estimator = LogisticRegression()
    estimator.classes_ = np.array([0, 1])
    estimator.coef_, estimator.intercept_ = coef, intercept
    estimator.n_features_in_ = coef.shape[1]
    return to_onnx(
        estimator,
        np.zeros((1, coef.shape[1]), dtype=np.float32),
        options={id(estimator): {"zipmap": False}},
        target_opset=17,
    )


def _with_pipeline(model, manifest: dict):
    """``model`` with the manifest's fitted pipeline in front: raw columns in, the model's outputs and ``kept`` out."""
    from onnx import compose, helper

    from confide.data.onnx_graph import FEATURES, KEPT, pipeline_model

    # One opset per domain in the joined model: the model's, with ONNX-ML at 3 at least (the
    # pipeline's LabelEncoder takes string keys from 2 on; the model's ML operators are unchanged).
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    ml_opset = max([3, *(o.version for o in model.opset_import if o.domain == "ai.onnx.ml")])
    for entry in model.opset_import:
        if entry.domain == "ai.onnx.ml":
            entry.version = ml_opset
    pipeline = pipeline_model(
        manifest["pipeline"],
        manifest["fitted"],
        manifest["features"],
        manifest.get("label"),
        opset=opset,
        ml_opset=ml_opset,
        ir_version=model.ir_version,
    )
    inputs = [i.name for i in pipeline.graph.input]
    outputs = [o.name for o in model.graph.output]
    clash = sorted(set(inputs) & {*outputs, KEPT})
    if clash:
        raise InvalidParameterError(f"raw columns {clash} are named like the export's outputs; rename them in the data")
    merged = compose.merge_models(
        pipeline, compose.add_prefix(model, "model/"), io_map=[(FEATURES, "model/" + model.graph.input[0].name)]
    )
    graph = merged.graph
    for name in outputs:  # the model's outputs under their own names again
        graph.node.append(helper.make_node("Identity", ["model/" + name], [name], name=f"output/{name}"))
    renamed = []
    for output in graph.output:
        if output.name.startswith("model/"):
            output.name = output.name[len("model/") :]
        renamed.append(output)
    del graph.output[:]
    graph.output.extend(sorted(renamed, key=lambda o: o.name == KEPT))
    return merged
