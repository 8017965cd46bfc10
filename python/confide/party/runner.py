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

This module sets a run up (data, model, protection, resume or rejoin) and writes its report; one
round, its attempts and the readmission of dropped parties are :mod:`confide.party.rounds`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from confide import checkpoints as ckpt
from confide import metrics
from confide.artifact import load_vertical_part, write_artifact, write_vertical_artifact
from confide.compute.base import peak_rss_mb
from confide.crypto.identity import Identity
from confide.errors import (
    ConfideError,
    DataAccessDeniedError,
    DataAccessRevokedError,
    DataProblemError,
    JobFailedError,
    RunStoppedError,
)
from confide.ml import WeightLayout, build_model
from confide.ml.strategies import RobustStrategy
from confide.party.checkpointing import (
    drop_later_checkpoints,
    final_leaf,
    load_checkpoint,
    load_privacy,
    save_model,
    write_checkpoint,
    write_ledger,
)
from confide.party.context import PartyContext
from confide.party.data import PARTITIONED_MODELS, close_compute, load_party_data
from confide.party.memory import check_memory_limit, return_large_buffers
from confide.party.rejoin import Membership
from confide.party.rounds import (
    HOOKS,
    MAX_WEIGHTS_IN_REPORT,
    Training,
    agree_on_model,
    privacy_allows,
    rejoin_peers,
    run_attempt,
    train_and_aggregate,
)
from confide.party.upload import PartyExchange, encode_workers
from confide.protect import RoundContext, make_protection
from confide.protect.bound import BoundProver
from confide.protect.bound import describe as describe_bound
from confide.protect.verify import Verifier, describe
from confide.reports import Failure, ModelSummary, PartyReport
from confide.spec import JobSpec
from confide.transport.client import CONTROL_ROUND, AggregatorClient
from confide.transport.slicing import slice_length_for
from confide.v1 import runtime_pb2 as pb

__all__ = ["PartyExchange", "failure_of", "load_party_data", "report_failure", "run_party"]

log = logging.getLogger("confide.party")


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
    keras_backend: str | None = None,
    stop_file: str | os.PathLike | None = None,
    session: str | None = None,
    compute: str | None = None,
    rejoin: bool = False,
    model_from: str | os.PathLike | None = None,
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
    ``keras_backend``: this party's choice of Keras backend (``model.algorithm: keras``), which
    wins over the job's ``model.backends``. ``stop_file``: checked before the data is read and at
    every round boundary; once it exists (the agent writes it when the data owner revokes the
    grant) the party trains no further round and stops with status ``stopped``. ``compute``: where a
    partitioned dataset's rows are held and worked on (``inline``, ``ray`` or ``ray:ADDRESS``;
    :func:`confide.compute.open_compute`). ``rejoin``: this process replaces one of this party that
    died mid-job: it reloads its latest checkpoint, asks its peers to take it back and goes on
    from the round they admit it to (:mod:`confide.party.rejoin`); its report keeps the rounds
    before the crash and names the ones it missed. ``model_from``: a scoring job's trained model
    (``spec.score``): the training session's folder at this site, or a folder of model files.

    Any failure is written to the report as a :class:`~confide.reports.Failure` (step, dataset,
    columns, error class, message, hint; never a value), which the agent forwards to the
    controller.
    """
    if party_id not in spec.parties:
        raise JobFailedError(f"party {party_id!r} is not in the job's parties {spec.parties}")
    if spec.vertical:
        return _run_vertical(
            spec,
            party_id,
            aggregator=aggregator,
            certs_dir=certs_dir,
            workdir=workdir,
            runtime_job_id=runtime_job_id,
            catalog=catalog,
            checkpoint_dir=checkpoint_dir,
            resume_round=resume_round,
            compute=compute,
            session=session,
            model_from=model_from,
        )
    return_large_buffers()  # freed slices and pieces leave the process (docs/models.md, "Memory")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else workdir / f"{party_id}.checkpoints"
    report_path = workdir / f"{party_id}.report.json"
    dataset = (spec.datasets() or {}).get(party_id)
    stage = "data"
    engine = data = None
    try:
        _check_stop(stop_file)
        identity = Identity.load(certs_dir, party_id)
        if compute is not None:
            from confide.compute import open_compute

            engine = open_compute(compute)
        data = load_party_data(spec, party_id, catalog, engine)
        stage = "model"
        model = build_model(
            spec.model, seed=spec.seed, party_id=party_id, network=spec.network(), keras_backend=keras_backend
        )
        if hasattr(data.X, "holders") and spec.model.algorithm not in PARTITIONED_MODELS:
            from confide.compute.parallel import DataParallel

            recipe = {
                "model": spec.model.model_dump(mode="json"),
                "network": spec.network(),
                "seed": spec.seed,
                "party": party_id,
                "keras_backend": getattr(model, "backend", None),
            }
            model = DataParallel(model, recipe)
        model.build(data.example_shape, data.classes)
        layout = WeightLayout.of(model.get_weights())
        if spec.model.memory_limit_mb is not None:
            check_memory_limit(party_id, layout.size, layout.nbytes, spec.model.memory_limit_mb)
        stage = "privacy"
        privacy = None
        if spec.privacy is not None:
            from confide.privacy.party import PartyPrivacy

            privacy = PartyPrivacy(spec, party_id, int(data.X.shape[0]), model)
    except Exception as error:
        # Before any peer is contacted: the report says why, and the launcher stops the others.
        report_failure(workdir, spec.job_id, party_id, error, stage=stage, dataset=dataset, round_number=0)
        close_compute(engine, data)
        raise
    strategy = spec.strategy.build()
    job = PartyContext.of(spec, party_id)
    first_round = 1
    joining = [p for p in joining if p in spec.parties]
    checkpoint_round = 0
    if rejoin:
        if resume_round or joining:
            raise JobFailedError("--rejoin continues a running job; it does not combine with a resume")
        latest = ckpt.latest(checkpoint_dir)
        if latest is not None:
            checkpoint_round = int(latest.name.rsplit("-", 1)[-1])
            load_checkpoint(checkpoint_dir, checkpoint_round, model, layout, strategy)
        if privacy is not None:
            load_privacy(checkpoint_dir, privacy)
    elif resume_round:
        if privacy is not None and joining:
            raise JobFailedError(
                f"a job with privacy cannot take in new parties on resume ({', '.join(joining)}): they hold no "
                f"ledger of the rounds already run, so their noise and budget would differ from the others'"
            )
        if party_id not in joining:
            load_checkpoint(checkpoint_dir, resume_round, model, layout, strategy)
            if privacy is not None:
                load_privacy(checkpoint_dir, privacy)
        first_round = resume_round + 1
    if not rejoin:
        drop_later_checkpoints(checkpoint_dir, resume_round)
    report = PartyReport(
        job_id=spec.job_id,
        runtime_job_id=runtime_job_id or spec.job_id,
        resumed_after_round=resume_round,
        party=party_id,
        status="starting",
        samples=int(data.X.shape[0]),
        test_samples=int(data.X_test.shape[0]) if data.X_test is not None else None,
        features=int(np.prod(data.example_shape)),
        model=ModelSummary(
            algorithm=spec.model.algorithm,
            parameters=layout.size,
            tensors=len(layout.tensors),
            layers=len(layout.layers()),
            backend=getattr(model, "backend", None) if spec.model.algorithm == "keras" else None,
            **(getattr(model, "report_fields", None) or {}),
        ),
        strategy=strategy.describe(),
        compute=getattr(data.X, "engine", None) or None,
    )
    if rejoin:
        _carry_over(report, report_path)
    client = AggregatorClient(
        aggregator,
        identity,
        runtime_job_id or spec.job_id,
        reconnect_timeout_s=spec.transport.reconnect_timeout_s,
        message_timeout_s=spec.transport.message_timeout_s,
    )
    exchange = PartyExchange(client)
    exchange.hooks = HOOKS
    params = spec.protection.params()
    current: dict = {}

    def fetch(context: RoundContext, indices: list[int]) -> list[pb.Slice]:
        return client.fetch(context.round, context.attempt, indices)

    extra = {"fetch": fetch} if spec.protection.mode == "paillier" else {}
    protection = make_protection(spec.protection.mode, exchange, params, **extra)
    metrics.PROTECTION_MODE.labels(protection.mode).set(1)
    # Several slices encoded at once, one thread each; without the pipeline one slice uses every core.
    protection.encode_threads = 1 if encode_workers(spec.transport.pipeline) > 1 else 0
    protection.pipeline = spec.transport.pipeline
    if isinstance(strategy, RobustStrategy):
        protection.use_robust(strategy.rule())  # the aggregator applies it: its estimate is not a sum to verify
    elif spec.protection.verifies and protection.verify_arithmetic is not None:
        protection.verifier = Verifier(protection, timeout_s=spec.protection.share_timeout_s)
    if spec.protection.prove_bound:
        protection.bounds = BoundProver(
            protection, timeout_s=spec.protection.share_timeout_s, l2_bound=spec.protection.l2_bound
        )
    restore = _stop_on_sigterm(stop_file)
    admitted_round = attempt_admitted = 0
    try:
        client.connect()
        started = time.perf_counter()
        if rejoin:
            if privacy is not None and not privacy.allow(checkpoint_round + 1):
                raise JobFailedError("its privacy budget is spent: it does not ask back into the job")
            admission = rejoin_peers(job, protection, exchange, client, model, layout, strategy)
            client.forget(CONTROL_ROUND, admission.requests)  # a reconnect must not send them again
            counts, participants = admission.counts, admission.participants
            first_round = admitted_round = admission.round
            attempt_admitted = admission.attempt
            done = [r.round for r in report.rounds]
            report.rejoins.append(
                {
                    "checkpoint_round": checkpoint_round,
                    "at_round": admission.round,
                    "missed_rounds": [r for r in range(max(done, default=0) + 1, admission.round)],
                    "admitted_by": admission.leader,
                }
            )
            _write_report(report_path, report)  # the launcher sees at once that it is back in
        else:
            protection.setup(list(spec.parties))
            # Under differential privacy every party weighs the same: an exact row count reveals
            # whether a record is in (and the distributed mechanism's sensitivity assumes equal weights).
            shared_count = 1.0 if privacy is not None else float(data.X.shape[0])
            peers = [p for p in spec.parties if p != party_id]
            counts = protection.exchange_values(0, "samples", [shared_count], peers)
            agree_on_model(protection, party_id, list(spec.parties), model, layout, distribute=not resume_round)
            participants = list(spec.parties)
        membership = Membership(
            spec.parties, party_id, protection, exchange, client, counts, revoked=_revocation_check(identity, certs_dir)
        )
        if rejoin:
            membership.incarnations.update(admission.incarnations)
        report.setup_seconds = time.perf_counter() - started
        report.protection = _protection_report(protection, spec)
        slice_length = slice_length_for(spec.transport.slice_bytes)
        if resume_round and joining:
            holders = [p for p in spec.parties if p not in joining]
            if not holders:
                raise JobFailedError("every party is joining: nobody holds the checkpointed model")
            weights = layout.flatten(model.get_weights())
            share = weights / len(holders) if party_id in holders else np.zeros_like(weights)
            context = RoundContext(
                round=resume_round,
                attempt=0,
                participants=participants,
                party_id=party_id,
                vector_length=share.size,
                slice_length=slice_length,
                layers=layout.layers(),
                dtype=share.dtype.name,
            )
            aggregate, _ = run_attempt(protection, exchange, client, context, share, spec.transport)
            if party_id in joining:
                model.set_weights(layout.unflatten(aggregate))
            report.bootstrap = {"round": resume_round, "joining": joining, "holders": holders}
        training = Training(
            job,
            model,
            layout,
            strategy,
            data,
            protection,
            exchange,
            client,
            counts,
            slice_length,
            privacy,
            membership,
        )
        for round_number in range(first_round, spec.rounds + 1):
            current = {"round": round_number}
            _check_stop(stop_file)  # a round boundary: an owner's revocation takes effect here
            admitted = round_number == admitted_round  # this rejoined party's first round: already settled
            if (
                privacy is not None
                and not admitted
                and not privacy_allows(protection, privacy, party_id, participants, round_number)
            ):
                break  # the budget is spent for some party: all stop together
            if not admitted:  # after the budget vote: nobody is admitted to a round that does not run
                membership.open_round(round_number, participants, lambda: (model.get_weights(), strategy.state()))
            first_attempt = attempt_admitted if admitted else 0
            entry = train_and_aggregate(
                training, participants, round_number, settled=admitted, first_attempt=first_attempt
            )
            if privacy is not None:
                write_ledger(checkpoint_dir, privacy)
            participants = entry.participants
            report.rounds.append(entry)
            _observe(entry, protection.mode)
            report.status = "running"
            interval = spec.checkpoint_interval
            if interval and (round_number % interval == 0 or round_number == spec.rounds):
                write_checkpoint(checkpoint_dir, round_number, model, layout, strategy, participants)
            _write_report(report_path, report)
            if on_round is not None:
                on_round(entry.model_dump(mode="json", exclude_none=True))
            HOOKS.round_done(round_number)
        report.status = "completed"
        report.protection = _protection_report(protection, spec)
        if privacy is not None:
            report.protection["privacy"] = privacy.report()
        report.weights = layout.flatten(model.get_weights()).tolist() if layout.size <= MAX_WEIGHTS_IN_REPORT else None
        save_model(workdir / f"{party_id}.model.npz", model, layout, spec)
        last = report.rounds[-1] if report.rounds else None
        final_metrics = {
            k: v
            for k, v in {
                "test_auc": last.test_auc if last else None,
                "test_accuracy": last.test_accuracy if last else None,
                "test_samples": int(data.X_test.shape[0]) if data.X_test is not None else None,
            }.items()
            if v is not None
        }
        write_artifact(
            workdir / f"{party_id}.model.zip",
            model=model,
            layout=layout,
            spec=spec,
            party=party_id,
            session=session,
            data=data,
            rounds=report.rounds[-1].round if report.rounds else spec.rounds,
            protection=report.protection,
            metrics=final_metrics,
            runtime_job_id=runtime_job_id,
            checkpoint_leaf=final_leaf(checkpoint_dir, spec),
        )
    except Exception as error:
        failure = failure_of(error, stage="round", dataset=dataset, round_number=current.get("round"))
        report.status = _status_after(error)
        report.error = f"{failure.error}: {failure.message}"
        report.failed_round = current.get("round")
        report.failure = failure
        _write_report(report_path, report)
        raise
    finally:
        restore()
        close_compute(engine, data)
        report.bytes_setup = {"sent": client.bytes_sent.get(0, 0), "received": client.bytes_received.get(0, 0)}
        report.reconnects = client.reconnects
        if report.status != "failed":
            _write_report(report_path, report)
        client.close()
    return report.model_dump(mode="json", exclude_none=True)


def _revocation_check(identity: Identity, certs_dir):
    """Raise for a revoked certificate, per the CRL in the certificate directory (none there: nothing is)."""
    from confide.transport.revocation import RevocationList, crl_path_for

    revocations = RevocationList(crl_path_for(certs_dir), identity.ca_pem)
    return lambda cert_pem: revocations.check(cert_pem)


def _carry_over(report: PartyReport, path: Path) -> None:
    """The rounds this party's crashed process completed, and its earlier rejoins."""
    try:
        earlier = PartyReport.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return
    if earlier.job_id != report.job_id:
        return
    report.rounds = list(earlier.rounds)
    report.rejoins = list(earlier.rejoins)


def _status_after(error: BaseException) -> str:
    """``stopped`` when the run was ended from outside (revocation, cancel, SIGTERM), else ``failed``."""
    return "stopped" if isinstance(error, (DataAccessDeniedError, RunStoppedError)) else "failed"


def _stop_on_sigterm(stop_file: str | os.PathLike | None) -> Callable[[], None]:
    """SIGTERM (the agent ending this run) becomes an exception, so the report says ``stopped``.

    A party blocked in a round whose peers already stopped is terminated by its agent; without
    this its report would stay ``running``. Only in the main thread (where Python runs signal
    handlers); returns the function that puts the previous handler back.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stopped(_signal, _frame):
        _check_stop(stop_file)  # the owner's reason, when the agent left one
        raise RunStoppedError("terminated mid-round (SIGTERM from its agent or launcher: the session stopped)")

    previous = signal.signal(signal.SIGTERM, stopped)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _run_vertical(spec: JobSpec, party_id: str, *, session, model_from, workdir, **options) -> dict:
    """A vertical job's side at this party; a training run leaves the site's model file, a scoring run uses it."""
    from confide.vertical.runner import run_vertical_party

    scoring = None
    if spec.score is not None:

        def scoring() -> tuple[dict, dict]:
            artifact, part = load_vertical_part(spec, party_id, model_from or spec.score.model_dir)
            return artifact.manifest, part

    def on_part(part: bytes, prepared: dict | None, report: dict) -> None:
        write_vertical_artifact(
            Path(workdir) / f"{party_id}.model.zip",
            spec=spec,
            party=party_id,
            session=session,
            runtime_job_id=options.get("runtime_job_id"),
            report=report,
            part=part,
            prepared=prepared,
        )

    return run_vertical_party(spec, party_id, workdir=workdir, scoring=scoring, on_part=on_part, **options)


def _check_stop(stop_file: str | os.PathLike | None) -> None:
    if stop_file is None:
        return
    try:
        stop = json.loads(Path(stop_file).read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        stop = {}
    reason = str(stop.get("reason") or "")
    if stop.get("state") == "revoked":
        raise DataAccessRevokedError(reason or "the data owner revoked this session's use of its dataset")
    raise RunStoppedError(reason or "the controller stopped this session")


def failure_of(error: BaseException, *, stage: str, dataset: str | None = None, round_number=None) -> Failure:
    """What may be said of ``error`` across sites: class, message with names, never values.

    Confide's own errors carry messages that name columns and counts only. Any other exception
    (a library's, whose text may quote a row) is reported by its class alone; its details stay
    in the party's own log (``run-N/party.log`` under the agent's workdir).
    """
    if isinstance(error, DataAccessDeniedError):
        stage = "access"
    elif isinstance(error, DataProblemError):
        stage = "data"
    if isinstance(error, ConfideError):
        message = str(error)[:2000]
    else:
        message = (
            f"unexpected {type(error).__name__} at the party; its details are in the party's own log "
            "(party.log of the run) and were not sent"
        )
        stage = "internal"
    return Failure(
        stage=stage,
        error=type(error).__name__,
        message=message,
        dataset=dataset,
        step=getattr(error, "step", None),
        columns=list(getattr(error, "columns", []) or []),
        round=round_number,
        hint=getattr(error, "hint", None),
    )


def report_failure(
    workdir: str | os.PathLike,
    job_id: str,
    party_id: str,
    error: BaseException,
    *,
    stage: str,
    dataset: str | None = None,
    round_number: int | None = 0,
) -> None:
    """Write a failed (or stopped) report for a party that could not start its rounds."""
    failure = failure_of(error, stage=stage, dataset=dataset, round_number=round_number)
    report = PartyReport(
        job_id=job_id,
        party=party_id,
        status=_status_after(error),
        failed_round=round_number,
        error=f"{failure.error}: {failure.message}",
        failure=failure,
    )
    Path(workdir).mkdir(parents=True, exist_ok=True)
    _write_report(Path(workdir) / f"{party_id}.report.json", report)


def _write_report(path: Path, report: PartyReport) -> None:
    report.peak_rss_mb = round(peak_rss_mb(), 1)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(report.model_dump_json(indent=1, exclude_none=True))
    os.replace(temporary, path)


def _observe(entry, mode: str) -> None:
    """One completed round in this process's metrics (confide.metrics): phases, bytes, retries."""
    for phase in metrics.PHASES:
        seconds = entry.seconds if phase == "round" else getattr(entry, f"{phase}_s")
        metrics.ROUND_SECONDS.labels("party", phase).observe(seconds)
    metrics.ROUNDS.labels("party", "completed").inc()
    metrics.RETRIES.labels("party").inc(entry.attempts - 1)
    metrics.BYTES.labels("party", "sent").inc(entry.bytes_sent)
    metrics.BYTES.labels("party", "received").inc(entry.bytes_received)
    metrics.CRYPTO_SECONDS.labels(mode).inc(entry.crypto_s)


def _protection_report(protection, spec) -> dict:
    """What ran: the mode's own report, whether the sums were verified, whether updates were proven bounded."""
    return {
        **protection.report(),
        "verification": describe(protection, spec.protection.verify),
        "bound": describe_bound(spec.protection.prove_bound, protection.mode, spec.protection.l2_bound),
    }
