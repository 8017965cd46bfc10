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

import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from confide import checkpoints as ckpt
from confide.artifact import write_artifact
from confide.compute.base import peak_rss_mb
from confide.crypto.identity import Identity
from confide.errors import (
    ConfideError,
    DataAccessDeniedError,
    DataAccessRevokedError,
    DataProblemError,
    InvalidParameterError,
    JobFailedError,
    RoundAbortedError,
    RunStoppedError,
)
from confide.hooks import load_hooks
from confide.ml import FitConfig, WeightLayout, build_model
from confide.party.checkpointing import (
    drop_later_checkpoints,
    final_leaf,
    load_checkpoint,
    load_privacy,
    save_model,
    write_checkpoint,
    write_ledger,
)
from confide.party.data import PARTITIONED_MODELS, PartyData, close_compute, load_party_data
from confide.party.rejoin import Membership, request_rejoin
from confide.party.upload import PartyExchange, RoundUpload, encode_workers
from confide.protect import RoundContext, make_protection
from confide.reports import Failure, ModelSummary, PartyReport, RoundReport
from confide.spec import JobSpec
from confide.transport.client import AGGREGATOR, CONTROL_ROUND, AggregatorClient
from confide.transport.slicing import slice_length_for
from confide.v1 import runtime_pb2 as pb

__all__ = ["PartyExchange", "failure_of", "load_party_data", "report_failure", "run_party"]

log = logging.getLogger("confide.party")
MAX_WEIGHTS_IN_REPORT = 10_000
#: Observers of this process (CONFIDE_PARTY_HOOKS; confide.hooks).
HOOKS = load_hooks()


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
    before the crash and names the ones it missed.

    Any failure is written to the report as a :class:`~confide.reports.Failure` (step, dataset,
    columns, error class, message, hint; never a value), which the agent forwards to the
    controller.
    """
    if party_id not in spec.parties:
        raise JobFailedError(f"party {party_id!r} is not in the job's parties {spec.parties}")
    if spec.vertical:
        from confide.vertical.runner import run_vertical_party

        return run_vertical_party(
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
        )
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
    params = spec.protection.params()
    current: dict = {}

    def fetch(context: RoundContext, indices: list[int]) -> list[pb.Slice]:
        return client.fetch(context.round, context.attempt, indices)

    extra = {"fetch": fetch} if spec.protection.mode == "paillier" else {}
    protection = make_protection(spec.protection.mode, exchange, params, **extra)
    # Several slices encoded at once, one thread each; without the pipeline one slice uses every core.
    protection.encode_threads = 1 if encode_workers(spec.transport.pipeline) > 1 else 0
    protection.pipeline = spec.transport.pipeline
    restore = _stop_on_sigterm(stop_file)
    admitted_round = attempt_admitted = 0
    try:
        client.connect()
        started = time.perf_counter()
        if rejoin:
            if privacy is not None and not privacy.allow(checkpoint_round + 1):
                raise JobFailedError("its privacy budget is spent: it does not ask back into the job")
            admission = _rejoin(spec, protection, exchange, client, model, layout, strategy)
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
            _agree_on_model(protection, party_id, list(spec.parties), model, layout, distribute=not resume_round)
            participants = list(spec.parties)
        membership = Membership(
            spec.parties, party_id, protection, exchange, client, counts, revoked=_revocation_check(identity, certs_dir)
        )
        if rejoin:
            membership.incarnations.update(admission.incarnations)
        report.setup_seconds = time.perf_counter() - started
        report.protection = protection.report()
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
            )
            aggregate, _ = _run_attempt(protection, exchange, client, context, share, spec)
            if party_id in joining:
                model.set_weights(layout.unflatten(np.asarray(aggregate, dtype=np.float64)))
            report.bootstrap = {"round": resume_round, "joining": joining, "holders": holders}
        training = _Training(
            spec,
            party_id,
            spec.parties.index(party_id),
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
                and not _privacy_allows(protection, privacy, party_id, participants, round_number)
            ):
                break  # the budget is spent for some party: all stop together
            if not admitted:  # after the budget vote: nobody is admitted to a round that does not run
                membership.open_round(round_number, participants, lambda: (model.get_weights(), strategy.state()))
            first_attempt = attempt_admitted if admitted else 0
            entry = _train_and_aggregate(
                training, participants, round_number, settled=admitted, first_attempt=first_attempt
            )
            if privacy is not None:
                write_ledger(checkpoint_dir, privacy)
            participants = entry.participants
            report.rounds.append(entry)
            report.status = "running"
            interval = spec.checkpoint_interval
            if interval and (round_number % interval == 0 or round_number == spec.rounds):
                write_checkpoint(checkpoint_dir, round_number, model, layout, strategy, participants)
            _write_report(report_path, report)
            if on_round is not None:
                on_round(entry.model_dump(mode="json", exclude_none=True))
            HOOKS.round_done(round_number)
        report.status = "completed"
        report.protection = protection.report()
        if privacy is not None:
            report.protection["privacy"] = privacy.report()
        final = layout.flatten(model.get_weights())
        report.weights = final.tolist() if final.size <= MAX_WEIGHTS_IN_REPORT else None
        save_model(workdir / f"{party_id}.model.npz", model, layout, spec)
        last = report.rounds[-1] if report.rounds else None
        metrics = {
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
            metrics=metrics,
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


@dataclass
class _Training:
    """What stays fixed over a party's rounds."""

    spec: JobSpec
    party_id: str
    index: int
    model: object
    layout: WeightLayout
    strategy: object
    data: PartyData
    protection: object
    exchange: PartyExchange
    client: AggregatorClient
    counts: dict
    slice_length: int
    privacy: object = None
    membership: Membership | None = None


def _train_and_aggregate(
    training: _Training, participants: list[str], round_number: int, *, settled: bool = False, first_attempt: int = 0
) -> RoundReport:
    """One round: local training, then the protected aggregation (retried without dropouts).

    Unless ``settled`` (a rejoined party's first round), the round's membership is read after
    training: the leader may have admitted a restarted party. ``first_attempt``: the attempt a
    rejoined party was admitted to (a lone survivor's retry; 0 otherwise). A lone survivor of an
    attempt that leaves fewer than ``min_parties`` waits for the dropped parties to ask back in
    and admits them to the next attempt (:func:`_readmit`) before it gives up on the job.
    """
    spec, party_id, model, layout, strategy, data = (
        training.spec,
        training.party_id,
        training.model,
        training.layout,
        training.strategy,
        training.data,
    )
    protection, exchange, client, counts = training.protection, training.exchange, training.client, training.counts
    slice_length, index = training.slice_length, training.index
    timings: dict[str, float] = {}
    round_started = time.perf_counter()
    global_vector = layout.flatten(model.get_weights())
    config = FitConfig(
        round=round_number,
        seed=(spec.seed, index, round_number),
        epochs=spec.model.local_epochs,
        proximal_mu=strategy.proximal_mu,
        global_weights=layout.unflatten(global_vector) if strategy.proximal_mu > 0 else None,
        dp_sgd=training.privacy.fit_dp_sgd() if training.privacy is not None else None,
    )
    started = time.perf_counter()
    fitted = model.fit(data.X, data.y, config)
    timings["train_s"] = time.perf_counter() - started
    delta = layout.flatten(model.get_weights(), who=f"party {party_id!r} after local training") - global_vector
    _check_finite(delta, layout, party_id, round_number)
    if training.membership is not None and not settled:
        participants = training.membership.settle(round_number, participants, client.message_timeout_s)
    attempt = first_attempt
    while True:
        total = sum(float(counts[p][0]) for p in participants)
        private = training.privacy.privatize(delta, participants) if training.privacy else None
        if private is None:
            vector, clipping = strategy.contribution(delta, float(counts[party_id][0]) / total), None
        else:
            vector, clipping = private
        context = RoundContext(
            round=round_number,
            attempt=attempt,
            participants=list(participants),
            party_id=party_id,
            vector_length=vector.size,
            slice_length=slice_length,
            layers=layout.layers(),
            clipping=clipping,
        )
        try:
            aggregate, attempt_timings = _run_attempt(protection, exchange, client, context, vector, spec)
            timings.update(attempt_timings)
            excluded = client.excluded(round_number, attempt)
            if excluded:
                # Recovered without them: the contributions were weighted over everyone who started.
                survivors = [p for p in participants if p not in excluded]
                if len(survivors) < spec.protection.min_parties:
                    raise JobFailedError(
                        f"round {round_number}: {', '.join(excluded)} excluded as dropouts; {len(survivors)} parties "
                        f"left, protection.min_parties is {spec.protection.min_parties}"
                    )
                kept = sum(float(counts[p][0]) for p in survivors)
                aggregate = np.asarray(aggregate, dtype=np.float64) * (total / kept)
                log.warning("round %d: %s excluded as dropouts; their masks removed, no retry", round_number, excluded)
                participants = survivors
            break
        except RoundAbortedError as aborted:
            if party_id in aborted.dropped:
                raise JobFailedError(f"this party was dropped from round {round_number}: {aborted}") from None
            if spec.protection.on_dropout == "fail":
                raise JobFailedError(f"{aborted}; on_dropout is 'fail'") from None
            if len(aborted.survivors) < spec.protection.min_parties:
                members = _readmit(training, aborted, round_number, global_vector, attempt + 1)
                if members is None:
                    raise JobFailedError(
                        f"{aborted}; {len(aborted.survivors)} parties left, protection.min_parties is "
                        f"{spec.protection.min_parties}"
                    ) from None
                log.warning("%s; retrying round %d with %s, readmitted", aborted, round_number, members)
                participants = members
                attempt += 1
                continue
            log.warning("%s; retrying round %d with %s", aborted, round_number, aborted.survivors)
            participants = list(aborted.survivors)
            attempt += 1
    if training.privacy is not None:
        aggregate = training.privacy.finish(np.asarray(aggregate, dtype=np.float64), participants)
        steps = fitted.metrics.get("dp_sgd_steps")
        context.stats["privacy"] = training.privacy.record(int(steps) if steps is not None else None)
    new_global = strategy.apply(global_vector, np.asarray(aggregate, dtype=np.float64))
    if not np.isfinite(new_global).all():
        raise JobFailedError(f"round {round_number}: the aggregated model is not finite (a participant diverged)")
    model.set_weights(layout.unflatten(new_global))
    iteration_seconds = time.perf_counter() - round_started
    started = time.perf_counter()
    train_loss = model.evaluate(data.X, data.y, ["loss"])["loss"]
    entry: dict = {
        "round": round_number,
        "attempts": attempt + 1,
        "participants": list(participants),
        "seconds": time.perf_counter() - round_started,
        **{k: round(v, 6) for k, v in timings.items()},
        "iteration_s": round(iteration_seconds, 6),
        "train_loss": train_loss,
        "local_examples": fitted.num_examples,
        "local_metrics": fitted.metrics,
        "bytes_sent": client.bytes_sent.get(round_number, 0),
        "bytes_received": client.bytes_received.get(round_number, 0),
        "stats": context.stats,
    }
    # Metrics of the global model on held-out rows (train loss is always reported).
    wanted = [m for m in spec.metrics if m != "loss"]
    if data.X_test is not None and wanted and len(data.y_test):
        for name, value in model.evaluate(data.X_test, data.y_test, wanted).items():
            if name in wanted or name == "loss":
                entry[f"test_{name}"] = float(value)
    if new_global.size <= MAX_WEIGHTS_IN_REPORT:
        entry["weights"] = new_global.tolist()
    entry["eval_s"] = round(time.perf_counter() - started, 6)
    return RoundReport(**entry)


def _readmit(
    training: _Training, aborted: RoundAbortedError, round_number: int, global_vector, attempt: int
) -> list[str] | None:
    """A lone survivor's retry with the dropped parties back: the members of ``attempt``, or None.

    Only where this party is the one survivor (it leads the retry, so no other survivor needs to
    hear of it), the mode can take a party back, and no privacy budget is in play (its vote is
    held at a round's start). The joiners get the round-start model and train the round anew.
    """
    spec, membership = training.spec, training.membership
    if membership is None or training.privacy is not None or aborted.survivors != [training.party_id]:
        return None
    needed = spec.protection.min_parties - 1
    wait = max(60.0, spec.transport.round_timeout_s)
    if not membership.await_rejoiners(round_number, aborted.dropped, needed, wait):
        return None
    round_start = training.layout.unflatten(global_vector)
    members = membership.open_round(
        round_number, [training.party_id], lambda: (round_start, training.strategy.state()), attempt=attempt
    )
    return members if len(members) >= spec.protection.min_parties else None


def _rejoin(spec: JobSpec, protection, exchange, client, model, layout: WeightLayout, strategy):
    """Ask the peers to take this restarted party back; load what the admitting leader gave it."""
    timeout = max(600.0, 3 * spec.transport.round_timeout_s)
    admission = request_rejoin(protection, exchange, client, list(spec.parties), timeout)
    protection.adopt_secrets(admission.secrets)
    try:
        layout.check(admission.weights, who=f"the model {admission.leader!r} handed over")
    except InvalidParameterError as error:
        raise JobFailedError(f"cannot rejoin: {error}") from None
    model.set_weights(admission.weights)
    strategy.load_state(admission.strategy)
    log.info("rejoined at round %d (admitted by %s)", admission.round, admission.leader)
    return admission


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


def _check_finite(delta: np.ndarray, layout: WeightLayout, party_id: str, round_number: int) -> None:
    """A non-finite update never leaves the party: fail naming the tensor."""
    if np.isfinite(delta).all():
        return
    for tensor, (start, stop) in zip(layout.tensors, layout.segments(), strict=True):
        if not np.isfinite(delta[start:stop]).all():
            raise JobFailedError(
                f"party {party_id!r}, round {round_number}: local training gave a non-finite update in weight "
                f"{tensor.name!r} (diverged; lower model.learning_rate); nothing was sent"
            )


def _agree_on_model(protection, party_id: str, parties: list[str], model, layout: WeightLayout, *, distribute: bool):
    """Before round 1: every party's weight layout must match; start from the leader's weights.

    Parties share their layout and a digest of their initial weights. A different layout fails the
    job naming the party and the tensor. Different initial weights (a framework that drew them
    from its own generator) are replaced by the leader's (the first party's), sent under the mode's
    peer protection in 32 MiB pieces, so every party starts from one model.
    """
    peers = [p for p in parties if p != party_id]
    initial = layout.flatten(model.get_weights())
    mine = {"layout": layout.to_dict(), "weights": hashlib.sha256(initial.tobytes()).hexdigest()}
    protection.share(0, "model", json.dumps(mine).encode(), peers)
    digests = {party_id: mine["weights"]}
    for peer in peers:
        theirs = json.loads(protection.collect(0, "model", peer))
        difference = layout.difference(WeightLayout.from_dict(theirs["layout"]))
        if difference:
            raise JobFailedError(f"party {peer!r} has another model than {party_id!r}: {difference}")
        digests[peer] = theirs["weights"]
    leader = parties[0]
    if not distribute or len(set(digests.values())) == 1:
        return
    piece = 32 * 1024 * 1024
    pieces = max(1, -(-initial.nbytes // piece))
    if party_id == leader:
        data = initial.tobytes()
        for i in range(pieces):
            protection.share(0, f"initial/{i}", data[i * piece : (i + 1) * piece], peers)
        return
    data = b"".join(protection.collect(0, f"initial/{i}", leader) for i in range(pieces))
    model.set_weights(layout.unflatten(np.frombuffer(data, dtype=np.float64)))
    log.info("initial weights differ between parties: starting from %s's", leader)


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
        recover_dropouts=protection.params.recover,
    )
    reconnects = client.reconnects

    def excluded() -> list[str]:
        dropped = client.excluded(context.round, context.attempt)
        if dropped and client.reconnects != reconnects:
            # The aggregator may have restarted after excluding them and lost that (an open attempt is not
            # stored): what it completes now may not match. Nothing is revealed; everyone retries.
            raise RoundAbortedError(
                f"round {context.round} attempt {context.attempt}: the aggregator connection was renewed after "
                f"{', '.join(dropped)} were excluded; retrying under fresh masks",
                dropped,
                [p for p in context.participants if p not in dropped],
            )
        return dropped

    context.excluded = excluded
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

    upload = RoundUpload(client, header, produce, context.num_slices, spec, HOOKS)
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
            combined = exchange.wait((client.job_id, context.round, f"agg/{context.attempt}/{index}", AGGREGATOR))
            if index == 0:
                HOOKS.round_summed(context.round)
            return combined

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


def _privacy_allows(protection, privacy, party_id: str, participants: list[str], round_number: int) -> bool:
    """Each party's budget check, shared: one party over its budget stops every party (no one waits)."""
    mine = privacy.allow(round_number)
    peers = [p for p in participants if p != party_id]
    votes = protection.exchange_values(round_number, "privacy/allow", [1.0 if mine else 0.0], peers)
    allowed = all(float(v[0]) == 1.0 for v in votes.values())
    if not allowed and privacy.stopped_at is None:
        privacy.stopped_at = round_number
    return allowed


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
