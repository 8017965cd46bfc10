"""One round of a party: local training, then the protected aggregation, retried without dropouts.

:func:`train_and_aggregate` trains from the global model, weighs the change, and runs attempts
(:func:`run_attempt`: header, scale agreement, pipelined slices, the combined result) until
one completes; a lone survivor may take dropped parties back (:func:`_readmit`). What a round
reads of the job is the party's :class:`~confide.party.context.PartyContext`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from confide.errors import (
    InvalidParameterError,
    JobFailedError,
    RoundAbortedError,
)
from confide.hooks import load_hooks
from confide.ml import FitConfig, WeightLayout
from confide.party.context import PartyContext
from confide.party.data import PartyData
from confide.party.memory import HeldVector, SpilledAggregate, byte_pieces, release_freed_memory
from confide.party.rejoin import Membership, request_rejoin
from confide.party.upload import PartyExchange, RoundUpload
from confide.protect import RoundContext
from confide.protect.base import chunks
from confide.protect.bound import BoundViolationError
from confide.protect.verify import VerificationError
from confide.reports import RoundReport
from confide.spec import TransportSpec
from confide.transport.client import AGGREGATOR, AggregatorClient
from confide.v1 import runtime_pb2 as pb

__all__ = ["Training", "agree_on_model", "privacy_allows", "rejoin_peers", "run_attempt", "train_and_aggregate"]

log = logging.getLogger("confide.party")
MAX_WEIGHTS_IN_REPORT = 10_000
#: Observers of this process (CONFIDE_PARTY_HOOKS; confide.hooks).
HOOKS = load_hooks()


@dataclass
class Training:
    """What stays fixed over a party's rounds."""

    job: PartyContext
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


def train_and_aggregate(
    training: Training, participants: list[str], round_number: int, *, settled: bool = False, first_attempt: int = 0
) -> RoundReport:
    """One round: local training, then the protected aggregation (retried without dropouts).

    Unless ``settled`` (a rejoined party's first round), the round's membership is read after
    training: the leader may have admitted a restarted party. ``first_attempt``: the attempt a
    rejoined party was admitted to (a lone survivor's retry; 0 otherwise). A lone survivor of an
    attempt that leaves fewer than ``min_parties`` waits for the dropped parties to ask back in
    and admits them to the next attempt (:func:`_readmit`) before it gives up on the job.
    """
    job, model, layout, strategy, data = (
        training.job,
        training.model,
        training.layout,
        training.strategy,
        training.data,
    )
    protection, exchange, client, counts = training.protection, training.exchange, training.client, training.counts
    slice_length, party_id = training.slice_length, job.party_id
    timings: dict[str, float] = {}
    round_started = time.perf_counter()
    # Memory (docs/models.md): the round holds this party's change (scaled in place into its
    # contribution) and the aggregate, each in the layout's dtype; the global vector of a large model
    # waits on disk meanwhile (confide.party.memory). Nothing else of the model's size.
    held = HeldVector.of_weights(layout, model.get_weights(), keep=strategy.proximal_mu > 0)
    config = FitConfig(
        round=round_number,
        seed=(job.seed, job.index, round_number),
        epochs=job.local_epochs,
        proximal_mu=strategy.proximal_mu,
        global_weights=_read_only(layout.unflatten(held.load(), copy=False)) if strategy.proximal_mu > 0 else None,
        dp_sgd=training.privacy.fit_dp_sgd() if training.privacy is not None else None,
    )
    if round_number > 2:
        # Peer messages of rounds two back and older (key shares, agreements, recovery shares, late
        # copies): every party has finished those rounds, so they leave this party's pool (the
        # relay retires its own). Without this a party kept every round's messages for the job.
        exchange.discard_received(round_number - 2, "")
    # What the mode needs that does not depend on the update (the lattice mode's key shares) travels
    # while this party trains.
    HOOKS.round_started(round_number)
    protection.prepare_round(round_number, first_attempt, participants)
    started = time.perf_counter()
    fitted = model.fit(data.X, data.y, config)
    timings["train_s"] = time.perf_counter() - started
    delta = layout.flatten(model.get_weights(), who=f"party {party_id!r} after local training", consume=True)
    held.subtract_from(delta)
    _check_finite(delta, layout, party_id, round_number)
    if training.membership is not None and not settled:
        participants = training.membership.settle(round_number, participants, client.message_timeout_s)
    attempt = first_attempt
    refused: list[dict] = []  # attempts whose sums failed verification (retried on another node)
    bound_excluded: list[dict] = []  # attempts run again without parties whose bound proofs failed
    scaled = 1.0  # what ``delta`` has been multiplied by so far (without privacy it becomes the contribution in place)
    while True:
        total = sum(float(counts[p][0]) for p in participants)
        private = training.privacy.privatize(delta, participants) if training.privacy else None
        if private is None:
            weight = float(counts[party_id][0]) / total
            vector, clipping = strategy.contribution(delta, weight / scaled), None
            if vector is delta:
                scaled = weight
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
            dtype=vector.dtype.name,  # float64 under privacy: its noisy grid must stay exact
            # A large model's aggregate goes to disk as it is decoded (privacy reads it whole anyway).
            output_factory=SpilledAggregate if held.spilled and training.privacy is None else None,
        )
        try:
            aggregate, attempt_timings = run_attempt(protection, exchange, client, context, vector, job.transport)
            timings.update(attempt_timings)
            excluded = client.excluded(round_number, attempt)
            if excluded:
                # Recovered without them: the contributions were weighted over everyone who started.
                survivors = [p for p in participants if p not in excluded]
                if len(survivors) < job.min_parties:
                    raise JobFailedError(
                        f"round {round_number}: {', '.join(excluded)} excluded as dropouts; {len(survivors)} parties "
                        f"left, protection.min_parties is {job.min_parties}"
                    )
                kept = sum(float(counts[p][0]) for p in survivors)
                aggregate *= total / kept
                log.warning("round %d: %s excluded as dropouts; their masks removed, no retry", round_number, excluded)
                participants = survivors
            break
        except VerificationError as wrong:
            refused.append({"attempt": attempt, "slices": wrong.slices[:8], "kind": wrong.kind, "reason": str(wrong)})
            node = _node_to_avoid(training, wrong, round_number, attempt)
            if node is None:
                raise JobFailedError(f"party {party_id!r}: {wrong}") from None
            log.warning("%s; retrying round %d without %s", wrong, round_number, client.node_name(node))
            client.mark_lost(node, f"it served a wrong sum in round {round_number}")
            attempt += 1
            continue
        except RoundAbortedError as aborted:
            if isinstance(aborted, BoundViolationError):
                bound_excluded.append({"attempt": attempt, "parties": aborted.dropped, "reason": str(aborted)})
            if party_id in aborted.dropped:
                raise JobFailedError(f"this party was dropped from round {round_number}: {aborted}") from None
            if job.on_dropout == "fail":
                raise JobFailedError(f"{aborted}; on_dropout is 'fail'") from None
            if len(aborted.survivors) < job.min_parties:
                members = _readmit(training, aborted, round_number, held, attempt + 1)
                if members is None:
                    raise JobFailedError(
                        f"{aborted}; {len(aborted.survivors)} parties left, protection.min_parties is {job.min_parties}"
                    ) from None
                log.warning("%s; retrying round %d with %s, readmitted", aborted, round_number, members)
                participants = members
                attempt += 1
                continue
            log.warning("%s; retrying round %d with %s", aborted, round_number, aborted.survivors)
            participants = list(aborted.survivors)
            attempt += 1
    if refused:
        context.stats["verification_refused"] = refused
    if bound_excluded:
        context.stats["bound_excluded"] = bound_excluded
    del vector, delta, private  # the contribution is summed: only the global vector and the aggregate remain
    if training.privacy is not None:
        aggregate = training.privacy.finish(aggregate, participants)
        steps = fitted.metrics.get("dp_sgd_steps")
        context.stats["privacy"] = training.privacy.record(int(steps) if steps is not None else None)
    global_vector = held.load()
    held.close()
    if isinstance(aggregate, SpilledAggregate):
        if strategy.adds_aggregate:
            aggregate.add_into(global_vector)  # a chunk at a time: the aggregate never sits in memory
            new_global = global_vector
        else:
            new_global = strategy.apply(global_vector, aggregate.load())
        aggregate.close()
    else:
        new_global = strategy.apply(global_vector, np.asarray(aggregate, dtype=global_vector.dtype))
    del aggregate
    release_freed_memory()  # the round's slices: freed, but held by the allocator until trimmed
    if not all_finite(new_global):
        raise JobFailedError(f"round {round_number}: the aggregated model is not finite (a participant diverged)")
    model.set_weights(layout.unflatten(new_global, copy=False))
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
    wanted = [m for m in job.metrics if m != "loss"]
    if data.X_test is not None and wanted and len(data.y_test):
        for name, value in model.evaluate(data.X_test, data.y_test, wanted).items():
            if name in wanted or name == "loss":
                entry[f"test_{name}"] = float(value)
    if new_global.size <= MAX_WEIGHTS_IN_REPORT:
        entry["weights"] = new_global.tolist()
    entry["eval_s"] = round(time.perf_counter() - started, 6)
    return RoundReport(**entry)


def _readmit(
    training: Training, aborted: RoundAbortedError, round_number: int, held: HeldVector, attempt: int
) -> list[str] | None:
    """A lone survivor's retry with the dropped parties back: the members of ``attempt``, or None.

    Only where this party is the one survivor (it leads the retry, so no other survivor needs to
    hear of it), the mode can take a party back, and no privacy budget is in play (its vote is
    held at a round's start). The joiners get the round-start model and train the round anew.
    """
    job, membership = training.job, training.membership
    if membership is None or training.privacy is not None or aborted.survivors != [job.party_id]:
        return None
    needed = job.min_parties - 1
    wait = max(60.0, job.transport.round_timeout_s)
    if not membership.await_rejoiners(round_number, aborted.dropped, needed, wait):
        return None
    round_start = training.layout.unflatten(held.load())
    members = membership.open_round(
        round_number, [job.party_id], lambda: (round_start, training.strategy.state()), attempt=attempt
    )
    return members if len(members) >= job.min_parties else None


def _node_to_avoid(training: Training, wrong: VerificationError, round_number: int, attempt: int) -> int | None:
    """The cluster node a retry must go around, or None where the job fails instead.

    Only with ``on_wrong_sum: retry``, a wrong sum or an equivocation (not a peer's malformed
    tags), one node to blame, and another live node left to take its share.
    """
    client = training.client
    if training.job.on_wrong_sum != "retry" or wrong.kind == "message" or not wrong.slices:
        return None
    nodes = {client.slice_node(round_number, attempt, index) for index in wrong.slices}
    if len(nodes) != 1 or client.cluster_nodes <= 1 + len(client.lost_nodes):
        return None
    return nodes.pop()


def rejoin_peers(job: PartyContext, protection, exchange, client, model, layout: WeightLayout, strategy):
    """Ask the peers to take this restarted party back; load what the admitting leader gave it."""
    timeout = max(600.0, 3 * job.transport.round_timeout_s)
    admission = request_rejoin(protection, exchange, client, list(job.parties), timeout, asked=HOOKS.rejoin_requested)
    protection.adopt_secrets(admission.secrets)
    try:
        layout.check(admission.weights, who=f"the model {admission.leader!r} handed over")
    except InvalidParameterError as error:
        raise JobFailedError(f"cannot rejoin: {error}") from None
    model.set_weights(admission.weights)
    strategy.load_state(admission.strategy)
    log.info("rejoined at round %d (admitted by %s)", admission.round, admission.leader)
    return admission


def all_finite(vector: np.ndarray) -> bool:
    """Whether every value is finite, checked a chunk at a time (no boolean copy of the model)."""
    return all(np.isfinite(part).all() for part in chunks(vector))


def _read_only(weights: dict) -> dict:
    """Views of the global vector handed to a model's fit: a model must not write into them."""
    for tensor in weights.values():
        tensor.flags.writeable = False
    return weights


def _check_finite(delta: np.ndarray, layout: WeightLayout, party_id: str, round_number: int) -> None:
    """A non-finite update never leaves the party: fail naming the tensor."""
    if all_finite(delta):
        return
    for tensor, (start, stop) in zip(layout.tensors, layout.segments(), strict=True):
        if not all_finite(delta[start:stop]):
            raise JobFailedError(
                f"party {party_id!r}, round {round_number}: local training gave a non-finite update in weight "
                f"{tensor.name!r} (diverged; lower model.learning_rate); nothing was sent"
            )


def agree_on_model(protection, party_id: str, parties: list[str], model, layout: WeightLayout, *, distribute: bool):
    """Before round 1: every party's base model and weight layout must match; start from the leader's weights.

    A model with a frozen base (``base_digest``: a pretrained model under an adapter) compares
    that digest first: a party that loaded another checkpoint fails the job, named.

    Parties share their layout and a digest of their initial weights. A different layout fails the
    job naming the party and the tensor. Different initial weights (a framework that drew them
    from its own generator) are replaced by the leader's (the first party's), sent under the mode's
    peer protection in 32 MiB pieces, so every party starts from one model.
    """
    peers = [p for p in parties if p != party_id]
    weights = model.get_weights()
    digest = hashlib.sha256()  # of the flat vector's bytes, a tensor at a time (no flat copy unless sent)
    for tensor in layout.tensors:
        digest.update(np.ascontiguousarray(weights[tensor.name], dtype=layout.dtype).ravel().data)
    del weights
    mine = {"layout": layout.to_dict(), "weights": digest.hexdigest(), "base": getattr(model, "base_digest", None)}
    protection.share(0, "model", json.dumps(mine).encode(), peers)
    digests = {party_id: mine["weights"]}
    for peer in peers:
        theirs = json.loads(protection.collect(0, "model", peer))
        if theirs.get("base") != mine["base"]:
            # A pretrained model's frozen weights never travel: every party must have loaded the same ones.
            raise JobFailedError(
                f"party {peer!r} has another base model than {party_id!r}: model.hf.pretrained loaded weights with "
                f"SHA-256 {_short(theirs.get('base'))} there and {_short(mine['base'])} here"
            )
        difference = layout.difference(WeightLayout.from_dict(theirs["layout"]))
        if difference:
            raise JobFailedError(f"party {peer!r} has another model than {party_id!r}: {difference}")
        digests[peer] = theirs["weights"]
    leader = parties[0]
    if not distribute or len(set(digests.values())) == 1:
        return
    # Memory: the leader cuts the pieces from its weights (no flat copy) and sends at most
    # INITIAL_WINDOW ahead of the receipts; each side frees a piece (its pool, its re-send copy, the
    # relay's mailbox) once every receiver has it. A receiver fills one vector.
    pieces = max(1, -(-layout.size * np.dtype(layout.dtype).itemsize // INITIAL_PIECE))
    if party_id == leader:
        weights = model.get_weights()
        for i, piece in enumerate(byte_pieces(layout, weights, INITIAL_PIECE)):
            if i >= INITIAL_WINDOW:
                _initial_received(protection, peers, i - INITIAL_WINDOW)
            protection.share(0, f"initial/{i}/", piece, peers)
            del piece
        del weights
        for i in range(max(0, pieces - INITIAL_WINDOW), pieces):
            _initial_received(protection, peers, i)
        return
    flat = np.empty(layout.size, dtype=layout.dtype)
    received = flat.view(np.uint8)
    for i in range(pieces):
        piece = protection.collect(0, f"initial/{i}/", leader)
        received[i * INITIAL_PIECE : i * INITIAL_PIECE + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
        del piece
        protection.exchange.release(0, f"initial/{i}/")
        protection.share(0, f"initial-received/{i}/", b"", [leader])
    model.set_weights(layout.unflatten(flat, copy=False))
    log.info("initial weights differ between parties: starting from %s's", leader)


#: The leader's initial weights travel in pieces of this many bytes ...
INITIAL_PIECE = 16 * 1024 * 1024
#: ... at most this many ahead of the receivers' receipts.
INITIAL_WINDOW = 2


def _initial_received(protection, peers: list[str], index: int) -> None:
    """Wait until every receiver has piece ``index``, then free it (and the receipts)."""
    for peer in peers:
        protection.collect(0, f"initial-received/{index}/", peer)
    protection.exchange.release(0, f"initial/{index}/")
    protection.exchange.release(0, f"initial-received/{index}/")


def _short(digest: str | None) -> str:
    return f"{digest[:16]}..." if digest else "none (no frozen base)"


def run_attempt(
    protection,
    exchange: PartyExchange,
    client: AggregatorClient,
    context: RoundContext,
    vector,
    transport: TransportSpec,
):
    """One attempt of a round: returns the decoded aggregate and the attempt's timings.

    Opens the upload (header first), agrees on the encoding scale, streams the protected slices
    and decodes the combined ones; an exclusion seen after a reconnect aborts the attempt.
    """
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
        robust=protection.robust,
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
        payload = HOOKS.slice_encoded(context.round, index, protection.encode(context, index, vector[start:stop]))
        ended = time.perf_counter()
        with encode_lock:
            timings["encode_cpu_s"] += ended - began
            span[0], span[1] = min(span[0], began), max(span[1], ended)
        return pb.Slice(index=index, n_valid=stop - start, payload=payload)

    upload = RoundUpload(
        client, header, produce, context.num_slices, transport, HOOKS, retain_all=not protection.reencodable
    )
    client.watch_round(context.round, context.attempt)
    exchange.upload = upload
    exchange.header_key = protection.header_key()
    exchange.wait_seconds = 0.0
    upload.start()
    try:
        began = time.perf_counter()
        protection.begin_round(context, vector)
        if protection.bounds is not None:
            protection.bounds.begin(context, vector)  # clips the contribution before any slice is encoded
        timings["agree_s"] = time.perf_counter() - began
        upload.release()
        exchange.wait_seconds = 0.0
        began = time.perf_counter()

        def result(index: int) -> pb.Slice:
            # Taken out of the pool: a round never holds the whole aggregate as received slices.
            key = (client.job_id, context.round, f"agg/{context.attempt}/{index}", AGGREGATOR)
            combined = exchange.wait(key, pop=True)
            if index == 0:
                HOOKS.round_summed(context.round)
            return combined

        verifier = protection.verifier
        if verifier is not None:
            verifier.begin(context, vector)

        def node_of(index: int) -> str:
            return client.node_name(client.slice_node(context.round, context.attempt, index))

        try:
            aggregate = protection.finish_round(context, result)
        except VerificationError as wrong:  # a mode's own check refused a slice while decoding it
            raise wrong.served_by(node_of) from None
        finish = time.perf_counter() - began
        timings["upload_s"] = upload.seconds
        timings["wait_s"] = exchange.wait_seconds
        timings["decode_s"] = max(0.0, finish - exchange.wait_seconds)
        timings["encode_s"] = max(0.0, span[1] - span[0])
        timings["crypto_s"] = timings["encode_s"] + timings["decode_s"]
        upload.join()
        if upload.reply is not None:
            exchange.key_sent_at = client.reconnects
        excluded_now = set(client.excluded(context.round, context.attempt))
        included = [p for p in context.participants if p not in excluded_now]
        if verifier is not None:
            context.stats["verification"] = verifier.settle(included, node_of)
            timings["verify_s"] = context.stats["verification"]["verify_s"]
        if protection.bounds is not None:
            context.stats["bound"] = protection.bounds.settle(included)
        return aggregate, timings
    except BaseException:
        upload.cancel()
        raise
    finally:
        client.watch_round(None)
        exchange.upload = None


def privacy_allows(protection, privacy, party_id: str, participants: list[str], round_number: int) -> bool:
    """Each party's budget check, shared: one party over its budget stops every party (no one waits)."""
    mine = privacy.allow(round_number)
    peers = [p for p in participants if p != party_id]
    votes = protection.exchange_values(round_number, "privacy/allow", [1.0 if mine else 0.0], peers)
    allowed = all(float(v[0]) == 1.0 for v in votes.values())
    if not allowed and privacy.stopped_at is None:
        privacy.stopped_at = round_number
    return allowed
