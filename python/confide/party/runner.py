"""The party process: local data, local training, one protected aggregation per round.

Per round: train locally from the global model, weight the change by this party's share of
the participants' samples (FedAvg), then run one round attempt:

1. open the upload stream with the header (so the aggregator knows we are alive), agree on
   the encoding scale with the peers (``begin_round``), then protect and stream the slices,
   slice i being protected while slice i-1 is sent (:func:`confide.transport.slicing.pipelined`);
2. wait for the combined slices (and, in ``paillier``, the peers' decrypted parts), decode.

If the aggregator aborts the attempt because a participant dropped out, the survivors retry
the round under a new attempt number (``on_dropout: retry``, at least ``min_parties`` left)
or the job fails with the reason (``on_dropout: fail``). If the aggregator itself goes away,
the party reconnects and uploads the same attempt again from its cached slices. After every
completed round the report is rewritten (atomic replace).

Checkpoints: every ``checkpoint_interval`` rounds (and after the last one) the party writes
``<checkpoints>/round-NNNNNN/{model.npz,state.json}`` atomically; a run started with
``resume_round=R`` loads round R's files and continues with round R+1. The batch order of
round r is drawn from (seed, party, r) alone, so a resumed job trains exactly as an
uninterrupted one would.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from confide import checkpoints as ckpt
from confide.data import breast_cancer_federation, synthetic_lr
from confide.errors import (
    ConfideError,
    JobFailedError,
    MessageTimeoutError,
    RoundAbortedError,
    RoundClosedError,
    TransportUnavailableError,
)
from confide.ml import HomoLR
from confide.protect import ProtectionParams, RoundContext, make_protection
from confide.spec import JobSpec
from confide.transport.certs import Identity
from confide.transport.client import AGGREGATOR, AggregatorClient
from confide.transport.slicing import pipelined, slice_length_for
from confide.v1 import runtime_pb2 as pb

__all__ = ["PartyExchange", "load_party_data", "run_party"]

log = logging.getLogger("confide.party")
MAX_WEIGHTS_IN_REPORT = 10_000
#: Fault injection (tests only): the party process exits abruptly once it has opened this round.
_FAULT_EXIT_ROUND = int(os.environ["CONFIDE_FAULT_EXIT_ROUND"]) if os.environ.get("CONFIDE_FAULT_EXIT_ROUND") else None
#: Fault injection (tests only): pause after every round, so a test can kill processes mid-job.
_FAULT_ROUND_DELAY_S = float(os.environ.get("CONFIDE_FAULT_ROUND_DELAY_S") or 0)


@dataclass
class PartyData:
    """One party's rows (and a local test split when the data set gives one)."""

    X: object
    y: np.ndarray
    X_test: object | None = None
    y_test: np.ndarray | None = None


def load_party_data(spec: JobSpec, party_id: str, catalog=None) -> PartyData:
    """Rows of ``party_id`` as the job provisions them: FL_Data over the party's catalog, or embedded."""
    if spec.fl_data is not None:
        if catalog is None:
            raise JobFailedError(f"the job provisions data as FL_Data but party {party_id!r} has no dataset catalog")
        fl_data = spec.fl_data_object()
        provisioned = fl_data.provision(party_id, catalog.table(fl_data.datasets()[party_id]))
        return PartyData(provisioned.X, provisioned.y, provisioned.X_test, provisioned.y_test)
    index = spec.parties.index(party_id)
    data = spec.data
    if data.dataset == "breast_cancer":
        federation = breast_cancer_federation(
            len(spec.parties), split=data.split, skew=data.skew, test_fraction=data.test_fraction, seed=data.seed
        )
        X, y = federation.parts[index]
        return PartyData(X, y)
    X, y, X_test, y_test = synthetic_lr(
        index,
        len(spec.parties),
        samples=data.samples,
        features=data.features,
        density=data.density,
        alpha=data.alpha,
        beta=data.beta,
        seed=data.seed,
        test_fraction=min(data.test_fraction, 0.5),
    )
    return PartyData(X, y, X_test, y_test)


class RoundUpload:
    """One attempt's upload: header first, slices once the scale is agreed; retried on reconnect."""

    def __init__(self, client: AggregatorClient, header: pb.RoundHeader, produce, count: int, spec: JobSpec) -> None:
        self._client = client
        self._header = header
        self._produce = produce
        self._count = count
        self._spec = spec
        self._cache: list[pb.Slice] = []
        self._ready = threading.Event()
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.reply: pb.PushReply | None = None
        self.seconds = 0.0

    def start(self, key: bytes = b"") -> None:
        """Begin (or begin again) uploading in a background thread; ``key`` goes into the header."""
        if self._thread is not None and self._thread.is_alive():
            return
        if key and not self._header.encryption_key:
            header = pb.RoundHeader()
            header.CopyFrom(self._header)
            header.encryption_key = key
            self._header = header
        self.reply = None
        self._thread = threading.Thread(target=self._run, name="confide-upload", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """The scale is agreed: slices may flow."""
        self._ready.set()

    def cancel(self) -> None:
        """Stop uploading (the attempt was aborted)."""
        self._cancelled.set()
        self._ready.set()

    def join(self) -> None:
        """Wait for the upload thread."""
        if self._thread is not None:
            self._thread.join()

    def _requests(self):
        if _FAULT_EXIT_ROUND is not None and self._header.round == _FAULT_EXIT_ROUND:
            # Fault injection for tests: die mid-round, after the header went out.
            time.sleep(0.5)
            os._exit(17)
        self._ready.wait()
        if self._cancelled.is_set():
            return
        yield from list(self._cache)
        start = len(self._cache)
        transport = self._spec.transport
        for item in pipelined(
            lambda i: self._produce(start + i),
            self._count - start,
            depth=transport.pipeline_depth,
            enabled=transport.pipeline,
            workers=encode_workers(transport.pipeline),
        ):
            self._cache.append(item)
            yield item

    def _run(self) -> None:
        deadline = time.monotonic() + self._spec.transport.reconnect_timeout_s
        while not self._cancelled.is_set():
            started = time.perf_counter()
            try:
                self.reply = self._client.push(self._header, self._requests())
                self.seconds += time.perf_counter() - started
                return
            except TransportUnavailableError as error:
                if time.monotonic() > deadline:
                    self.error = error
                    return
                time.sleep(0.3)
            except BaseException as error:  # noqa: BLE001 - handed to the round's main thread
                self.error = error
                return


class PartyExchange:
    """:class:`confide.protect.Exchange` over the aggregator client, aware of the open attempt.

    Waits run in one-second steps: between steps a failed upload surfaces, and after a
    reconnect (the aggregator may have restarted and lost the attempt's partial sums) the
    upload runs again from its cache.
    """

    def __init__(self, client: AggregatorClient) -> None:
        self.client = client
        #: Public key material for headers after a reconnect (a restarted aggregator may lack it).
        self.header_key = b""
        self.key_sent_at: int | None = None
        self.job_id = client.job_id
        self.party_id = client.party_id
        self.identity = client.identity
        self.upload: RoundUpload | None = None
        self._reconnects = 0
        self._lost = 0
        self.wait_seconds = 0.0

    def send(self, round_number: int, tag: str, payload: bytes, recipients) -> None:
        """Relay a payload."""
        self.client.send(round_number, tag, payload, recipients)

    def recv(self, round_number: int, tag: str, sender: str, *, timeout: float | None = None) -> bytes:
        """Wait for a relayed payload."""
        return self.wait((self.job_id, round_number, tag, sender), timeout)

    def wait(self, key: tuple, timeout: float | None = None):
        """Wait for a pooled message, re-uploading after a reconnect."""
        timeout = self.client.message_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        started = time.perf_counter()
        try:
            while True:
                upload = self.upload
                if upload is not None and upload.error is not None:
                    self._upload_failed(upload, key)
                if self.client.reconnects != self._reconnects:
                    self._reconnects = self.client.reconnects
                    if upload is not None:
                        log.info("reconnected to the aggregator: uploading the open attempt again")
                        upload.start(self.header_key)
                if len(self.client.lost_nodes) != self._lost:
                    # A cluster node was lost: its share goes to the next live node from our retained copy.
                    self._lost = len(self.client.lost_nodes)
                    if upload is not None:
                        log.info(
                            "aggregator node(s) %s lost: re-routing the open attempt", sorted(self.client.lost_nodes)
                        )
                        upload.start(self.header_key)
                self.client.raise_fatal()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MessageTimeoutError(f"no message {key!r} within {timeout:g} s")
                try:
                    return self.client.wait(key, min(1.0, remaining))
                except MessageTimeoutError:
                    continue
        finally:
            self.wait_seconds += time.perf_counter() - started

    def _upload_failed(self, upload: RoundUpload, key: tuple) -> None:
        if isinstance(upload.error, RoundClosedError):
            # The attempt was aborted: the abort notice says who dropped; give it a moment to arrive.
            self.client.raise_if_aborted(5.0)
        raise upload.error


def run_party(
    spec: JobSpec,
    party_id: str,
    *,
    aggregator: str,
    certs_dir: str | os.PathLike,
    workdir: str | os.PathLike,
    on_round: Callable[[dict], None] | None = None,
    runtime_job_id: str | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume_round: int = 0,
    catalog=None,
    joining: list[str] | tuple[str, ...] = (),
) -> dict:
    """Run this party's side of a job to the end; returns (and writes) its report.

    ``runtime_job_id`` names this run at the aggregator (default: the job id; the controller
    gives each run of a session its own). ``checkpoint_dir``: where interval checkpoints go
    (default ``<workdir>/<party>.checkpoints``). ``resume_round``: continue after this checkpointed
    round. ``catalog``: the party's datasets, for jobs that provision data as FL_Data.
    ``joining``: parties of a resumed run that hold no checkpoint (added by tuning); before
    round ``resume_round + 1`` every party runs one bootstrap aggregation in which the holders
    contribute ``w / holders`` and the joiners zeros, so the joiners receive the checkpointed
    model ``w`` through the job's own protection (exact in plain; to its precision otherwise).
    """
    if party_id not in spec.parties:
        raise JobFailedError(f"party {party_id!r} is not in the job's parties {spec.parties}")
    if spec.vertical:
        from confide.vertical.runner import run_vertical_party

        return run_vertical_party(
            spec, party_id, aggregator=aggregator, certs_dir=certs_dir, workdir=workdir, runtime_job_id=runtime_job_id
        )
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else workdir / f"{party_id}.checkpoints"
    report_path = workdir / f"{party_id}.report.json"
    identity = Identity.load(certs_dir, party_id)
    data = load_party_data(spec, party_id, catalog)
    model = HomoLR(
        learning_rate=spec.model.learning_rate,
        local_epochs=spec.model.local_epochs,
        batch_size=spec.model.batch_size,
        l2=spec.model.l2,
        seed=spec.seed * 1000 + spec.parties.index(party_id),
    )
    model.initialize(data.X.shape[1])
    first_round = 1
    joining = [p for p in joining if p in spec.parties]
    if resume_round:
        if party_id not in joining:
            model.set_weights(_load_checkpoint(checkpoint_dir, resume_round, data.X.shape[1]))
        first_round = resume_round + 1
    _drop_later_checkpoints(checkpoint_dir, resume_round)
    report = {
        "job_id": spec.job_id,
        "runtime_job_id": runtime_job_id or spec.job_id,
        "resumed_after_round": resume_round,
        "party": party_id,
        "status": "starting",
        "samples": int(data.X.shape[0]),
        "features": int(data.X.shape[1]),
        "rounds": [],
    }
    client = AggregatorClient(
        aggregator,
        identity,
        runtime_job_id or spec.job_id,
        reconnect_timeout_s=spec.transport.reconnect_timeout_s,
        message_timeout_s=spec.transport.message_timeout_s,
    )
    exchange = PartyExchange(client)
    params = ProtectionParams(
        key_bits=spec.protection.key_bits,
        bits=spec.protection.bits,
        clipping=spec.protection.clipping,
        share_timeout_s=spec.protection.share_timeout_s,
        setup_timeout_s=spec.protection.setup_timeout_s,
        mask_bound=spec.protection.mask_bound,
    )
    current: dict = {}

    def fetch(context: RoundContext, indices: list[int]) -> list[pb.Slice]:
        return client.fetch(context.round, context.attempt, indices)

    extra = {"fetch": fetch} if spec.protection.mode == "paillier" else {}
    protection = make_protection(spec.protection.mode, exchange, params, **extra)
    # Several slices encoded at once, one thread each; without the pipeline one slice uses every core.
    protection.encode_threads = 1 if encode_workers(spec.transport.pipeline) > 1 else 0
    try:
        client.connect()
        started = time.perf_counter()
        protection.setup(list(spec.parties))
        counts = protection.exchange_values(
            0, "samples", [float(data.X.shape[0])], [p for p in spec.parties if p != party_id]
        )
        report["setup_seconds"] = time.perf_counter() - started
        report["protection"] = protection.report()
        participants = list(spec.parties)
        slice_length = slice_length_for(spec.transport.slice_bytes)
        if resume_round and joining:
            holders = [p for p in spec.parties if p not in joining]
            if not holders:
                raise JobFailedError("every party is joining: nobody holds the checkpointed model")
            weights = model.get_weights()
            share = weights / len(holders) if party_id in holders else np.zeros_like(weights)
            context = RoundContext(
                round=resume_round,
                attempt=0,
                participants=participants,
                party_id=party_id,
                vector_length=share.size,
                slice_length=slice_length,
            )
            aggregate, _ = _run_attempt(protection, exchange, client, context, share, spec)
            if party_id in joining:
                model.set_weights(np.asarray(aggregate, dtype=np.float64))
            report["bootstrap"] = {"round": resume_round, "joining": joining, "holders": holders}
        index = spec.parties.index(party_id)
        for round_number in range(first_round, spec.rounds + 1):
            current = {"round": round_number}
            model.reseed([spec.seed, index, round_number])
            entry = _train_and_aggregate(
                spec,
                party_id,
                model,
                data,
                protection,
                exchange,
                client,
                counts,
                participants,
                slice_length,
                round_number,
            )
            participants = entry["participants"]
            report["rounds"].append(entry)
            report["status"] = "running"
            interval = spec.checkpoint_interval
            if interval and (round_number % interval == 0 or round_number == spec.rounds):
                _checkpoint(checkpoint_dir, round_number, model, participants)
            _write_json(report_path, report)
            if on_round is not None:
                on_round(entry)
            if _FAULT_ROUND_DELAY_S:
                time.sleep(_FAULT_ROUND_DELAY_S)
        report["status"] = "completed"
        report["protection"] = protection.report()
        report["weights"] = model.get_weights().tolist() if model.get_weights().size <= MAX_WEIGHTS_IN_REPORT else None
        model.save(workdir / f"{party_id}.model.npz")
    except ConfideError as error:
        report["status"] = "failed"
        report["error"] = f"{type(error).__name__}: {error}"
        report["failed_round"] = current.get("round")
        _write_json(report_path, report)
        raise
    finally:
        report["bytes_setup"] = {"sent": client.bytes_sent.get(0, 0), "received": client.bytes_received.get(0, 0)}
        report["reconnects"] = client.reconnects
        if report["status"] != "failed":
            _write_json(report_path, report)
        client.close()
    return report


def _train_and_aggregate(
    spec, party_id, model, data, protection, exchange, client, counts, participants, slice_length, round_number
) -> dict:
    timings: dict[str, float] = {}
    round_started = time.perf_counter()
    global_weights = model.get_weights()
    started = time.perf_counter()
    model.local_train(data.X, data.y)
    timings["train_s"] = time.perf_counter() - started
    delta = model.get_weights() - global_weights
    attempt = 0
    while True:
        total = sum(float(counts[p][0]) for p in participants)
        vector = delta * (float(counts[party_id][0]) / total)
        context = RoundContext(
            round=round_number,
            attempt=attempt,
            participants=list(participants),
            party_id=party_id,
            vector_length=vector.size,
            slice_length=slice_length,
        )
        try:
            aggregate, attempt_timings = _run_attempt(protection, exchange, client, context, vector, spec)
            timings.update(attempt_timings)
            break
        except RoundAbortedError as aborted:
            if party_id in aborted.dropped:
                raise JobFailedError(f"this party was dropped from round {round_number}: {aborted}") from None
            if spec.protection.on_dropout == "fail":
                raise JobFailedError(f"{aborted}; on_dropout is 'fail'") from None
            if len(aborted.survivors) < spec.protection.min_parties:
                raise JobFailedError(
                    f"{aborted}; {len(aborted.survivors)} parties left, protection.min_parties is "
                    f"{spec.protection.min_parties}"
                ) from None
            log.warning("%s; retrying round %d with %s", aborted, round_number, aborted.survivors)
            participants = list(aborted.survivors)
            attempt += 1
    model.set_weights(global_weights + aggregate)
    entry = {
        "round": round_number,
        "attempts": attempt + 1,
        "participants": list(participants),
        "seconds": time.perf_counter() - round_started,
        **{k: round(v, 6) for k, v in timings.items()},
        "train_loss": model.loss(data.X, data.y),
        "bytes_sent": client.bytes_sent.get(round_number, 0),
        "bytes_received": client.bytes_received.get(round_number, 0),
        "stats": context.stats,
    }
    # Metrics on the party's local held-out rows (train loss is always reported).
    if data.X_test is not None and "auc" in spec.metrics and len(np.unique(data.y_test)) == 2:
        from sklearn.metrics import roc_auc_score

        entry["test_auc"] = float(roc_auc_score(data.y_test, model.decision_function(data.X_test)))
    if data.X_test is not None and "accuracy" in spec.metrics and len(data.y_test):
        predicted = model.decision_function(data.X_test) > 0
        entry["test_accuracy"] = float(np.mean(predicted == (np.asarray(data.y_test) > 0.5)))
    weights = model.get_weights()
    if weights.size <= MAX_WEIGHTS_IN_REPORT:
        entry["weights"] = weights.tolist()
    return entry


def _run_attempt(protection, exchange: PartyExchange, client: AggregatorClient, context: RoundContext, vector, spec):
    timings = {"encode_cpu_s": 0.0}
    span = [float("inf"), 0.0]  # first encode start, last encode end: the wall time of encoding
    header = pb.RoundHeader(
        job_id=client.job_id,
        round=context.round,
        attempt=context.attempt,
        party_id=context.party_id,
        participants=context.participants,
        kind=protection.kind,
        num_slices=context.num_slices,
        slice_length=context.slice_length,
        vector_length=context.vector_length,
        routing=protection.routing,
        # The public key goes to the aggregator once per job and again after a reconnect.
        encryption_key=protection.header_key() if exchange.key_sent_at != client.reconnects else b"",
        mode=protection.mode,
    )
    encode_lock = threading.Lock()

    def produce(index: int) -> pb.Slice:
        start, stop = context.bounds(index)
        began = time.perf_counter()
        payload = protection.encode(context, index, vector[start:stop])
        ended = time.perf_counter()
        with encode_lock:
            timings["encode_cpu_s"] += ended - began
            span[0], span[1] = min(span[0], began), max(span[1], ended)
        return pb.Slice(index=index, n_valid=stop - start, payload=payload)

    upload = RoundUpload(client, header, produce, context.num_slices, spec)
    client.watch_round(context.round, context.attempt)
    exchange.upload = upload
    exchange.header_key = protection.header_key()
    exchange.wait_seconds = 0.0
    upload.start()
    try:
        began = time.perf_counter()
        protection.begin_round(context, vector)
        timings["agree_s"] = time.perf_counter() - began
        upload.release()
        exchange.wait_seconds = 0.0
        began = time.perf_counter()

        def result(index: int) -> pb.Slice:
            return exchange.wait((client.job_id, context.round, f"agg/{context.attempt}/{index}", AGGREGATOR))

        aggregate = protection.finish_round(context, result)
        finish = time.perf_counter() - began
        timings["upload_s"] = upload.seconds
        timings["wait_s"] = exchange.wait_seconds
        timings["decode_s"] = max(0.0, finish - exchange.wait_seconds)
        timings["encode_s"] = max(0.0, span[1] - span[0])
        timings["crypto_s"] = timings["encode_s"] + timings["decode_s"]
        upload.join()
        if upload.reply is not None:
            exchange.key_sent_at = client.reconnects
        return aggregate, timings
    except BaseException:
        upload.cancel()
        raise
    finally:
        client.watch_round(None)
        exchange.upload = None


def encode_workers(pipeline: bool) -> int:
    """Slices protected at once: one per core with the pipeline, one without."""
    return max(1, os.cpu_count() or 1) if pipeline else 1


def _checkpoint(directory: Path, round_number: int, model: HomoLR, participants: list[str]) -> None:
    buffer = io.BytesIO()
    np.save(buffer, model.get_weights(), allow_pickle=False)
    state = {"round": round_number, "participants": list(participants), "format": 1}
    target = directory / ckpt.round_name(round_number)
    if target.exists():  # a previous run of this session wrote it; this run's files replace it
        shutil.rmtree(target)
    ckpt.write_checkpoint(
        target, {"weights.npy": buffer.getvalue(), "state.json": json.dumps(state, sort_keys=True).encode()}
    )


def _load_checkpoint(directory: Path, round_number: int, features: int) -> np.ndarray:
    target = directory / ckpt.round_name(round_number)
    try:
        state = json.loads((target / "state.json").read_text())
        weights = np.load(target / "weights.npy", allow_pickle=False)
    except (OSError, ValueError) as error:
        raise JobFailedError(f"cannot resume: checkpoint {target} is unreadable: {error}") from None
    if state.get("round") != round_number or weights.shape != (features + 1,):
        raise JobFailedError(
            f"cannot resume: checkpoint {target} holds round {state.get('round')} with {weights.shape} weights, "
            f"expected round {round_number} with {features + 1}"
        )
    return weights


def _drop_later_checkpoints(directory: Path, resume_round: int) -> None:
    # Checkpoints of rounds after the resume point belong to an abandoned run.
    if not directory.exists():
        return
    for path in directory.glob("round-*"):
        number = path.name.split("-", 1)[1].split(".", 1)[0]
        if number.isdigit() and int(number) > resume_round:
            shutil.rmtree(path, ignore_errors=True)


def _write_json(path: Path, data: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1, default=float))
    os.replace(temporary, path)
