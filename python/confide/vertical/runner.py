"""One party's side of a vertical job (hetero_lr, secureboost or hetero_nn), as a runtime process.

The party connects to the aggregator over mutual TLS like any runtime party, but talks to the
other parties through the Relay only (the aggregator routes; every payload is either a
ciphertext, a blinded PSI point, or what the protocol reveals by design: docs/vertical.md):

1. PSI aligns the records (:mod:`confide.vertical.psi`); every party then holds its rows of the
   intersection in one common order.
2. The common rows are split into training and test rows by the job's seed (the same split at
   every party, since the order is common).
3. The algorithm trains; the guest then evaluates on the test rows through the prediction
   protocol (hosts answer for their own splits or partial scores).
4. Each party writes its part of the model (``<party>.model.cvw``: the guest's trees or weights,
   a host's lookup table or weights; never anything of another party) and its report
   (``<party>.report.json``, per tree or epoch: seconds, crypto seconds, bytes).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np

from confide import checkpoints as ckpt
from confide.crypto import gpu
from confide.crypto.identity import Identity
from confide.data.catalog import Table
from confide.data.flops import JOIN_PROTOCOL
from confide.data.flsteps import raw_ranges
from confide.data.vertical import VerticalPartyData, vertical_party_data
from confide.errors import ConfideError, JobFailedError
from confide.hooks import load_hooks
from confide.spec import JobSpec
from confide.transport.client import AggregatorClient
from confide.vertical import psi, wire
from confide.vertical.channel import RelayChannel
from confide.vertical.params import hetero_lr_params, hetero_nn_params, secureboost_params

__all__ = ["evaluate", "run_vertical_party"]


#: Fault injection (tests only): the party process exits abruptly when its protocol reaches this
#: relay round (1 = the first tree or epoch), as a crash mid-training would.
class _ObservedChannel(RelayChannel):
    """The relay channel, telling the party's hooks before each wait (confide.hooks)."""

    def __init__(self, client, *, hooks, **kwargs) -> None:
        super().__init__(client, **kwargs)
        self.hooks = hooks

    def _recv_raw(self, sender: str, key: str, timeout: float) -> bytes:
        self.hooks.message_waited(self.round)
        return super()._recv_raw(sender, key, timeout)


def evaluate(objective: str, y: np.ndarray, predictions: np.ndarray) -> dict:
    """Test metrics: AUC and accuracy (binary), accuracy and log loss (multi-class), RMSE and R² (regression)."""
    if objective == "multi:softprob":
        from sklearn.metrics import log_loss

        classes = np.arange(predictions.shape[1])
        return {
            "accuracy": float(np.mean(predictions.argmax(axis=1) == y)),
            "log_loss": float(log_loss(y, predictions, labels=classes)),
        }
    if objective == "reg:squarederror":
        from sklearn.metrics import r2_score

        return {"rmse": float(np.sqrt(np.mean((predictions - y) ** 2))), "r2": float(r2_score(y, predictions))}
    from confide.ml.metrics import roc_auc

    out = {"accuracy": float(np.mean((predictions >= 0.5) == (y == 1)))}
    if len(np.unique(y)) == 2:
        out["auc"] = roc_auc(y, predictions)
    return out


def _split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng([seed, 11]).permutation(n)
    n_test = min(n - 1, max(1, round(test_fraction * n)))
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def run_vertical_party(
    spec: JobSpec,
    party_id: str,
    *,
    aggregator: str,
    certs_dir: str | os.PathLike,
    workdir: str | os.PathLike,
    runtime_job_id: str | None = None,
    catalog=None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume_round: int = 0,
    compute: str | None = None,
    scoring=None,
    on_part=None,
) -> dict:
    """Run this party's side of a vertical job; returns (and writes) its report.

    ``catalog``: the party's datasets, for jobs whose ``fl_data`` names them (``data.id_column``
    holds the record ids PSI matches); otherwise the embedded data of ``data.dataset``.

    Checkpoints (``checkpoint_interval``): every that many epochs and after the last, the party
    writes ``<checkpoint_dir>/round-NNNNNN/state.cvw``, its whole training state at that
    point (Hetero NN: networks, optimizer moments and its weight share; Hetero LR: its weights,
    optimizer moments and, at the guest, the epoch losses); ``resume_round`` continues from such
    a checkpoint (PSI runs again and gives the same rows). SecureBoost checkpoints after whole
    boosting rounds (the guest's trees and margins, a host's lookup table). A job that stops
    early (SecureBoost's early stopping, Hetero LR's convergence) checkpoints the round it
    stopped at.

    ``compute`` (``ray`` or ``ray:ADDRESS``; :func:`confide.compute.open_compute`): where PSI
    hashes and blinds (every algorithm), a SecureBoost guest encrypts its gradients (public-key
    path: the secret key stays here) and a host builds its encrypted histograms (by row ranges,
    combined exactly). The party's rows still live in this process.

    ``scoring`` (a scoring job, ``spec.score``): returns the manifest and the part of this site's
    trained model (:func:`confide.artifact.load_vertical_part`); the job scores the party's new records
    instead of training (:mod:`confide.vertical.scoring`). ``on_part(part_bytes, prepared, report)``:
    called with the trained part, what new records of this site go through (steps, fitted
    statistics, ranges: they stay at the party) and the report; the party process writes its
    model file with them.
    """
    if party_id not in spec.parties:
        raise JobFailedError(f"party {party_id!r} is not in the job's parties {spec.parties}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    report_path = workdir / f"{party_id}.report.json"
    guest = spec.guest
    hosts = [p for p in spec.parties if p != guest]
    role = "guest" if party_id == guest else "host"
    d = spec.data
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else workdir / f"{party_id}.checkpoints"
    report: dict = {
        "job_id": spec.job_id,
        "runtime_job_id": runtime_job_id or spec.job_id,
        "party": party_id,
        "role": role,
        "algorithm": spec.model.algorithm,
        "status": "starting",
        "rounds": [],
        "protection": {"mode": "paillier", "key_bits": spec.protection.key_bits, "ran": "paillier"},
        "resumed_after_round": resume_round,
    }
    if scoring is not None:
        report["task"] = "score"
        report["protection"]["ran"] = "none: the prediction protocol (docs/vertical.md#scoring-new-records)"
    client = AggregatorClient(
        aggregator,
        Identity.load(certs_dir, party_id),
        runtime_job_id or spec.job_id,
        reconnect_timeout_s=spec.transport.reconnect_timeout_s,
        message_timeout_s=spec.transport.message_timeout_s,
    )
    hooks = load_hooks()
    channel = _ObservedChannel(client, hooks=hooks, timeout_s=spec.transport.message_timeout_s)
    started = time.perf_counter()
    engine = held = None
    try:
        resume_state = _load_state(checkpoint_dir, resume_round) if resume_round else None
        _drop_later_checkpoints(checkpoint_dir, resume_round)
        client.connect()
        try:
            partitions = None if scoring is not None else _partitions(spec, party_id, role, catalog)
            engine = _open_engine(compute, spec, role, report, partitioned=partitions is not None)
            if scoring is not None:
                from confide.vertical import scoring as scores

                manifest, part = scoring()
                report["model_from"] = {k: manifest.get(k) for k in ("job_id", "session", "runtime_job_id")}
                data = scores.records(spec, party_id, manifest, catalog, report)
            elif partitions is not None:
                data = _partitioned_columns(spec, party_id, partitions, engine, report)
                held = data.ids
            else:
                data = _party_rows(spec, party_id, guest, catalog, report)
        except ConfideError as error:
            # the peers would wait for this party's PSI hello until their timeout: tell them now
            with contextlib.suppress(ConfideError):
                psi.refuse(
                    channel,
                    role=role,
                    guest=guest,
                    hosts=hosts,
                    session=spec.job_id,
                    reason=f"it failed before PSI with {type(error).__name__} (its own report says why)",
                )
            raise
        report.update(records=len(data.ids), features=len(data.columns), columns=data.columns)
        psi_stats: dict = {}
        rows = psi.intersect(
            channel,
            data.ids,
            role=role,
            guest=guest,
            hosts=hosts,
            session=spec.job_id,
            stats=psi_stats,
            engine=engine,
        )
        report["psi"] = {"intersection": len(rows), **_jsonable(psi_stats)}
        if "data" in report:  # the join, as a step of this party's data lineage
            report["data"]["join"] = {
                "by": spec.data.id_column,
                "protocol": JOIN_PROTOCOL,
                "records": len(data.ids),
                "common": len(rows),
            }
        X = data.X[rows]
        y = data.y[rows] if data.y is not None else None
        if scoring is not None:
            _score(spec, channel, role, guest, hosts, part, X, y, [data.ids[i] for i in rows], workdir, report)
            return report
        train, test = _split(len(rows), d.test_fraction, spec.seed)
        report.update(samples=len(train), test_samples=len(test), status="running")
        _write(report_path, report)

        def checkpoint(number: int, snapshot, final: bool = False) -> None:
            # every interval, and after the last round (``final``: early stopping ended training)
            interval = spec.checkpoint_interval
            if snapshot is not None and interval and (number % interval == 0 or number == spec.rounds or final):
                _write_state(checkpoint_dir, number, snapshot())

        wire_mark = [channel.bytes_sent, channel.bytes_received]

        def on_round(entry: dict, snapshot=None, final: bool | None = None) -> None:
            # "round": the epoch, or boosting round (a multi-class round grows one tree per
            # class), the progress the agent forwards to the controller
            if "class" in entry:
                number = int(entry["round"]) + 1
            else:
                number = resume_round + len(report["rounds"]) + 1
            entry = _jsonable(entry)
            if "bytes_sent" not in entry:  # what this party's channel carried since the last entry
                entry["bytes_sent"] = channel.bytes_sent - wire_mark[0]
                entry["bytes_received"] = channel.bytes_received - wire_mark[1]
            wire_mark[:] = [channel.bytes_sent, channel.bytes_received]
            report["rounds"].append({**entry, "round": number})
            _write(report_path, report)
            checkpoint(number, snapshot, final=bool(entry.get("stopped_early")) if final is None else final)
            hooks.round_done(number)

        if spec.model.algorithm == "secureboost":
            part = _secureboost(
                spec, channel, role, guest, hosts, X, y, train, test, report, on_round, resume_state, engine
            )
        elif spec.model.algorithm == "hetero_nn":
            part = _hetero_nn(spec, channel, role, guest, hosts, X, y, train, test, report, on_round, resume_state)
        else:
            part = _hetero_lr(spec, channel, role, guest, hosts, X, y, train, test, report, on_round, resume_state)
        encoded = wire.encode(part)
        (workdir / f"{party_id}.model.cvw").write_bytes(encoded)
        report["status"] = "completed"
        if on_part is not None:
            on_part(encoded, data.prepared, report)
    except ConfideError as error:
        report["status"] = "failed"
        report["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        for release in (held, engine):
            if release is not None:
                release.close()
        report["seconds"] = time.perf_counter() - started
        report["bytes"] = {"sent": channel.bytes_sent, "received": channel.bytes_received}
        report["reconnects"] = client.reconnects
        report["paillier_engine"] = gpu.engine_report()  # which engine ran this party's Paillier work
        _write(report_path, report)
        client.close()
    return report


def _partitions(spec: JobSpec, party_id: str, role: str, catalog):
    """The files of this party's dataset when its catalog entry is partitioned; None otherwise."""
    if spec.fl_data is None or catalog is None:
        return None
    dataset = spec.fl_data_object().datasets()[party_id]
    partitions = catalog.partitions(dataset)
    if partitions is not None and (role != "host" or spec.model.algorithm != "secureboost"):
        raise JobFailedError(
            f"party {party_id!r}: dataset {dataset!r} is partitioned; a vertical job reads partitioned data at a "
            f"SecureBoost host only (this party is the {role} of a {spec.model.algorithm} job, whose rows live in "
            "its process): publish it as one Parquet file or table"
        )
    return partitions


def _partitioned_columns(spec: JobSpec, party_id: str, partitions, engine, report: dict) -> VerticalPartyData:
    """Holders of the host's files on ``engine``: ids, features and bins stay with them."""
    from confide.compute.partitions import PartitionTask, partition_columns
    from confide.vertical.columns import PartitionedColumns

    fl_data = spec.fl_data_object()
    # here, so its message (the step) reaches the developer as is; steps on other parties' columns do not count
    fl_data.check_partitionable(party_id, partition_columns(partitions[0]))
    dataset = fl_data.datasets()[party_id]
    task = PartitionTask(party=party_id, dataset=dataset, fl_data=fl_data.to_dict())
    columns = PartitionedColumns.open(engine, task, partitions, spec.data.id_column)
    report["data"] = {
        "dataset": dataset,
        "fl_data_version": fl_data.version,
        "fl_data_fingerprint": fl_data.fingerprint,
        "id_column": spec.data.id_column,
    }
    report["compute"] = {**report.get("compute", {}), **columns.engine}
    return VerticalPartyData(ids=columns, X=_AlignedColumns(columns), y=None, columns=list(columns.features))


class _AlignedColumns:
    """Stands for a partitioned host's matrix: ``X[rows]`` is a view of those rows on the holders."""

    def __init__(self, columns, rows=None) -> None:
        self.columns, self.rows, self.views = columns, rows, 0

    def __getitem__(self, index):
        if self.rows is None:  # the rows PSI aligned
            return _AlignedColumns(self.columns, np.asarray(index))
        self.views += 1
        return self.columns.view(f"rows-{self.views}", self.rows[index])


def _score(spec, channel, role, guest, hosts, part, X, y, ids, workdir: Path, report: dict) -> None:
    """A scoring job's protocol on the aligned rows: the guest writes the scores, a host learns their count."""
    from confide.vertical import scoring

    started = time.perf_counter()
    predictions = scoring.score(spec, channel, role, guest, hosts, part, X)
    report["scored"] = len(ids)
    report["rounds"].append({"round": 1, "seconds": time.perf_counter() - started, "scored": len(ids)})
    if predictions is not None:
        path = workdir / scoring.SCORES.format(party=channel.party)
        scoring.write_scores(path, spec.data.id_column, ids, predictions)
        report["scores"] = path.name
        if y is not None and len(y):
            report["metrics"] = evaluate(_objective(spec, predictions), y, predictions)
    report["status"] = "completed"


def _objective(spec: JobSpec, predictions: np.ndarray) -> str:
    if spec.model.algorithm == "hetero_lr":
        return "binary:logistic"
    if spec.model.objective == "reg:squarederror":
        return "reg:squarederror"
    return "multi:softprob" if np.asarray(predictions).ndim == 2 else "binary:logistic"


def _party_rows(spec: JobSpec, party_id: str, guest: str, catalog, report: dict):
    """The ids, columns and (at the guest) labels of ``party_id``: FL_Data over its catalog, or embedded."""
    d = spec.data
    if spec.fl_data is None:
        return vertical_party_data(
            party_id,
            list(spec.parties),
            guest,
            dataset=d.dataset,
            samples=d.samples,
            features=d.features,
            columns=d.columns,
            overlap=d.overlap,
            seed=d.seed,
            objective="regression" if spec.model.objective == "reg:squarederror" else "classification",
            id_type=d.id_type,
        )
    if catalog is None:
        raise JobFailedError(f"the job provisions data as FL_Data but party {party_id!r} has no dataset catalog")
    fl_data = spec.fl_data_object()
    dataset = fl_data.datasets()[party_id]
    table = catalog.table(dataset)
    # the raw columns' training ranges, before any step runs: new records are checked against them
    ranges = raw_ranges(Table({c: v for c, v in table.columns.items() if c != d.id_column}), fl_data.label)
    rows = fl_data.provision_columns(party_id, table, id_column=d.id_column, with_label=party_id == guest)
    report["data"] = {
        "dataset": dataset,
        "fl_data_version": fl_data.version,
        "fl_data_fingerprint": fl_data.fingerprint,
        "id_column": d.id_column,
    }
    ids = rows.ids.tolist()
    ran = [i for i, step in enumerate(rows.steps) if step is not None]
    prepared = {"steps": [rows.steps[i] for i in ran], "fitted": [rows.fitted[i] for i in ran], "ranges": ranges}
    return VerticalPartyData(ids=ids, X=rows.X, y=rows.y, columns=list(rows.feature_names), prepared=prepared)


def _open_engine(compute: str | None, spec: JobSpec, role: str, report: dict, *, partitioned: bool = False):
    """Where PSI's group arithmetic runs, and a SecureBoost guest's GH encryption or a host's histograms.

    None (this process) without ``compute``, unless the party's dataset is partitioned: its
    holders then live in this process (``inline``).
    """
    if (compute is None or compute == "inline") and not partitioned:
        return None
    from confide.compute import open_compute

    engine = open_compute(compute or "inline")
    work = ["PSI hashing and blinding"]
    if partitioned:
        work.append("partitioned columns: binning, encrypted histograms, splits and predictions by partition")
    elif spec.model.algorithm == "secureboost":
        work.append("GH encryption, public-key path" if role == "guest" else "encrypted histograms by row ranges")
    report["compute"] = {**engine.describe(), "workers": engine.workers, "work": work}
    return engine


def _secureboost(spec, channel, role, guest, hosts, X, y, train, test, report, on_round, resume, engine=None) -> dict:
    from confide.vertical import secureboost as sb

    params = secureboost_params(spec)
    if role == "guest":
        offload = None
        if engine is not None:
            from confide.compute.tasks import encrypt_raw_on

            def offload(encryption_key, plaintexts):
                return encrypt_raw_on(engine, encryption_key, plaintexts)

        model = sb.train_guest(
            channel, hosts, X[train], y[train], params, "train", on_tree=on_round, resume=resume, encrypt_with=offload
        )
        report["setup_seconds"] = getattr(model, "setup_seconds", None)
        predictions = sb.predict_guest(channel, model, X[test], "test")
        report["metrics"] = evaluate(params.objective, y[test], predictions)
        report["feature_importance"] = model.feature_importance()
        if model.validation_loss:
            report["validation_loss"] = model.validation_loss
            report["best_round"] = model.best_round
            report["trees_kept"] = len(model.trees)
        return {"algorithm": "secureboost", "role": "guest", "model": model.to_dict()}
    per_round = params.classes

    def on_tree(tree: int, snapshot, last: bool) -> None:  # after a whole boosting round: the lookup table so far
        if (tree + 1) % per_round == 0:
            # a round entry like the guest's, so the host's progress and bytes reach the console
            on_round(
                {"trees": tree + 1, "seconds": time.perf_counter() - round_started[0]},
                lambda: {"lookup": snapshot()},
                final=last,
            )
            round_started[0] = time.perf_counter()

    round_started = [time.perf_counter()]

    start = sb.SecureBoostHostModel.from_dict(resume["lookup"]) if resume is not None else None
    lookup = sb.serve_host(
        channel, guest, X[train], "train", threads=params.threads, model=start, on_tree=on_tree, engine=engine
    )
    sb.serve_host(channel, guest, X[test], "test", model=lookup)
    report["splits_owned"] = len(lookup.lookup)
    return {"algorithm": "secureboost", "role": "host", "model": lookup.to_dict()}


def _hetero_lr(spec, channel, role, guest, hosts, X, y, train, test, report, on_round, resume_state) -> dict:
    from confide.vertical import hetero_lr as lr

    params = hetero_lr_params(spec)
    if role == "guest":
        model = lr.train_guest(
            channel, hosts, X[train], y[train], params, "train", on_epoch=on_round, resume=resume_state
        )
        predictions = lr.predict_guest(channel, hosts, X[test], model, "test")
        report["metrics"] = evaluate("binary:logistic", y[test], predictions)
        return {"algorithm": "hetero_lr", "role": "guest", "model": model.to_dict()}
    model = lr.train_host(channel, guest, hosts, X[train], params, "train", on_epoch=on_round, resume=resume_state)
    lr.predict_host(channel, guest, X[test], model, "test")
    return {"algorithm": "hetero_lr", "role": "host", "model": model.to_dict()}


def _hetero_nn(spec, channel, role, guest, hosts, X, y, train, test, report, on_round, resume_state) -> dict:
    from confide.vertical import hetero_nn as nn

    params = hetero_nn_params(spec)
    if role == "guest":
        model = nn.train_guest(
            channel, hosts, X[train], y[train], params, "train", on_epoch=on_round, resume=resume_state
        )
        report["setup_seconds"] = model.setup_seconds
        predictions = nn.predict_guest(channel, hosts, X[test], model, "test")
        report["metrics"] = evaluate(params.objective, y[test], predictions)
        return {"algorithm": "hetero_nn", "role": "guest", "model": model.to_dict()}
    model = nn.train_host(channel, guest, X[train], params, "train", on_epoch=on_round, resume=resume_state)
    nn.predict_host(channel, guest, X[test], model, "test")
    return {"algorithm": "hetero_nn", "role": "host", "model": model.to_dict()}


STATE_FILE = "state.cvw"


def _write_state(directory: Path, round_number: int, state: dict) -> None:
    ckpt.write_checkpoint(directory / ckpt.round_name(round_number), {STATE_FILE: wire.encode(state)})


def _load_state(directory: Path, round_number: int) -> dict:
    """The training state a checkpoint holds; errors name the file."""
    path = directory / ckpt.round_name(round_number) / STATE_FILE
    try:
        state = wire.decode(path.read_bytes())
    except (OSError, ConfideError) as error:
        raise JobFailedError(f"cannot resume: checkpoint {path} is unreadable: {error}") from None
    if state.get("final"):
        raise JobFailedError(
            f"cannot resume from {path}: it holds the final model of a completed run, not a training state"
        )
    return state


def _drop_later_checkpoints(directory: Path, resume_round: int) -> None:
    """A run that resumes from round R (or starts over) writes rounds after R afresh."""
    ckpt.drop_after(directory, resume_round)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _write(path: Path, report: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_jsonable(report), indent=1, default=str))
    tmp.replace(path)
