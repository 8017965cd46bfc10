"""The aggregator's core: rounds, slices and relay messages, whatever the transport.

It learns a round from the parties' headers (no job file needed) and combines slices as they
arrive. It never holds key material: the protection modes give it float32 words (plain),
masked words (secagg, groupmask) or ciphertexts and the public key (paillier). A round attempt
ends in one of three ways: complete (every participant sent every slice; the result is stored
on disk before the last slice is delivered), aborted (a participant's stream broke and it did
not come back within ``dropout_grace_s``, or it never showed up within ``round_timeout_s``: the
survivors are told and retry under a new attempt number), or superseded by the next round.

The gRPC services and the process around this core are :mod:`confide.aggregator.service`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from confide import _native, metrics
from confide.aggregator.mailbox import Mailboxes
from confide.aggregator.rounds import RoundKey, RoundState, expected_length, is_tee, validate_header
from confide.aggregator.store import ResultStore
from confide.errors import ConfideError, PermissionDeniedError, ProtocolError, RoundClosedError
from confide.hooks import load_aggregator_hooks
from confide.transport.revocation import RevocationGate
from confide.v1 import runtime_pb2 as pb

log = logging.getLogger("confide.aggregator")
Observer = Callable[[str, str, object], None]
MAX_NAME = 64


@dataclass(frozen=True)
class AggregatorConfig:
    """Aggregator settings.

    Parameters
    ----------
    round_timeout_s : float
        A participant that has sent no header this long after a round attempt opened is dropped.
    dropout_grace_s : float
        A participant whose slice stream broke with slices missing may reconnect within this time.
    state_dir : str or None
        Where completed rounds are stored (None: memory only; a restart then loses them).
    mailbox_memory_bytes : int
        Deliveries the relay's mailboxes hold in memory (each once, however many recipients);
        beyond it they wait for their readers in spill files (``<state_dir>/mailboxes``, or a
        temporary directory). Nothing is refused for want of room.
    max_workers : int
        gRPC worker threads; every connected party holds two streams.
    workers : int
        Data-plane workers (one per core with its own queue; 0: one per core).
    max_staged_bytes : int
        Cap on partial sums held in memory; beyond it the oldest are spilled and reloaded.
    checkpoint_after_s : float
        A round whose participant's stream broke writes its partial sums out after this long
        (freeing memory while the party is away) and reloads them on the next slice.
    data_port : int or None
        Port of the data path in Rust (``PushSlices`` received, parsed and folded without
        Python; reported in ``Health``), on the host of the listen address: 0 picks a free
        port, None serves ``PushSlices`` only through the Python gRPC server.
    data_threads : int
        Threads of the data path for TLS and HTTP/2 (0: one per core).
    crl_path : str or None
        The federation's CRL (``revoked.crl.pem``): calls of revoked certificates are refused on
        every port, open streams of a newly revoked one are ended and its round attempts aborted
        (:mod:`confide.transport.revocation`). None: no revocation checks.
    """

    round_timeout_s: float = 120.0
    dropout_grace_s: float = 5.0
    state_dir: str | None = None
    mailbox_memory_bytes: int = 512 * 1024**2
    max_workers: int = 128
    workers: int = 0
    max_staged_bytes: int = 256 * 1024**2
    checkpoint_after_s: float = 1.0
    data_port: int | None = 0
    data_threads: int = 0
    crl_path: str | None = None


class AggregatorCore:
    """Round states, completed results and mailboxes; the servicers are thin shells over it."""

    def __init__(self, config: AggregatorConfig, observer: Observer | None = None) -> None:
        self.config = config
        self.mailboxes = Mailboxes(
            config.mailbox_memory_bytes, Path(config.state_dir) / "mailboxes" if config.state_dir else None
        )
        self.store = ResultStore(config.state_dir)
        self.observer = observer
        #: CONFIDE_AGGREGATOR_HOOKS (the suite's lying aggregator); None in production.
        self.hooks = load_aggregator_hooks()
        self.slices_aggregated = 0
        # The enclave side of tee mode: simulated here (no SGX); its report says so.
        self.enclave = _native.SimulatedEnclave(config.workers)
        spill = None
        if config.state_dir:
            spill_path = Path(config.state_dir) / "spill"
            spill_path.mkdir(parents=True, exist_ok=True)
            spill = str(spill_path)
        self.dataplane = _native.DataPlane(config.workers, config.max_staged_bytes, spill, self.enclave)
        self._rounds: dict[RoundKey, RoundState] = {}
        #: Completed attempts of each job's last three rounds: headers here, slices on disk.
        self._completed: dict[RoundKey, tuple[pb.RoundHeader, Mapping[int, bytes]]] = {}
        self._latest: dict[str, int] = {}
        self._job_keys: dict[str, bytes] = self.store.load_keys()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        #: Per-job (round timeout, dropout grace) set by the controller; others use ``config``.
        self._job_timeouts: dict[str, tuple[float, float]] = {}
        #: (job, party) of restarted parties no peer has admitted back yet.
        self._restarted: set[tuple[str, str]] = set()
        #: (job, party) -> the newest incarnation of its rejoin requests (re-sent ones are ignored).
        self._incarnations: dict[tuple[str, str], int] = {}
        #: Job -> the round from which this node serves its shares again (after parties found it lost).
        self._admissions: dict[str, int] = {}
        #: Called with (header, combined slices by index) after a round completes and is stored.
        self.completion_listeners: list[Callable[[pb.RoundHeader, Mapping[int, bytes]], None]] = []
        for header, done in self.store.load():
            key = (header.job_id, header.round, header.attempt, header.share)
            self._completed[key] = (header, done)
            self._latest[header.job_id] = max(self._latest.get(header.job_id, 0), header.round)
        #: Parties cut off for a revoked certificate (name -> why), until one joins a round again.
        self._revoked_parties: dict[str, str] = {}
        self._monitor = threading.Thread(target=self._watch, name="confide-round-monitor", daemon=True)
        self._monitor.start()
        #: The Rust data path (see :class:`confide.aggregator.service.NativeDataPath`), when started by :func:`serve`.
        self.data_server: _native.DataServer | None = None
        #: The revocation check of every port, when :func:`serve` was given a CRL.
        self.revocation_gate: RevocationGate | None = None
        #: The service's NativeDataPath over ``data_server`` (set by serve; not imported here, since the
        #: service module is built on this one).
        self.data_path = None

    def configure_job(self, job_id: str, *, round_timeout_s: float, dropout_grace_s: float) -> None:
        """Timeouts for one job (from its session's aggregator configuration)."""
        with self._lock:
            self._job_timeouts[job_id] = (float(round_timeout_s), float(dropout_grace_s))

    def _timeouts(self, job_id: str) -> tuple[float, float]:
        return self._job_timeouts.get(job_id, (self.config.round_timeout_s, self.config.dropout_grace_s))

    # -- rounds ---------------------------------------------------------------------------
    def open_round(self, header: pb.RoundHeader) -> RoundState | None:
        """The state for the header's attempt (created on first contact); None if completed."""
        key = (header.job_id, header.round, header.attempt, header.share)
        header = self._with_job_key(header)
        with self._lock:
            if key in self._completed:
                stored = self._completed[key][0]
                if header.party_id not in stored.participants:
                    raise PermissionDeniedError(f"{header.party_id!r} is not a participant of round attempt {key}")
                if header.encryption_key and header.encryption_key != stored.encryption_key:
                    raise ProtocolError(
                        f"round attempt {key} completed under another key: a job id names one run "
                        "(use a new job id or a fresh --state)"
                    )
                return None
            latest = self._latest.get(header.job_id, 0)
            if header.round + 1 < latest:
                raise RoundClosedError(
                    f"round {header.round} of job {header.job_id!r} is closed; the job is at round {latest} "
                    "(a job id names one run: use a new job id or a fresh --state)"
                )
            state = self._rounds.get(key)
            if state is None:
                encryption_key = validate_header(header)
                state = RoundState(
                    key=key,
                    header=header,
                    encryption_key=encryption_key,
                    plane=self.dataplane,
                    results=self.store.writer(header),
                )
                self._rounds[key] = state
                self._latest[header.job_id] = max(latest, header.round)
                self.mailboxes.retire(header.job_id, header.round - 1)
            else:
                validate_header(header)
                state.check_header(header)
        if state.status == "aborted":
            raise RoundClosedError(f"round {header.round} attempt {header.attempt} was aborted: {state.reason}")
        self._revoked_parties.pop(header.party_id, None)  # admitted, so its certificate now is not revoked
        # A restarted party that pushes was admitted back: on a cluster the admission may have gone
        # through another node (the leader's relay) while its request came through this one too.
        self._restarted.discard((header.job_id, header.party_id))
        with state.lock:
            state.joined.add(header.party_id)
            state.broken.pop(header.party_id, None)
            state.streams[header.party_id] = state.streams.get(header.party_id, 0) + 1
        state.restore()
        return state

    def _with_job_key(self, header: pb.RoundHeader) -> pb.RoundHeader:
        """Paillier/tee headers carry the job's key material once; later ones may leave it out."""
        if is_tee(header.kind):
            return self._with_tee_key(header)
        if header.kind != pb.AGGREGATION_KIND_PAILLIER_PRODUCT:
            return header
        with self._lock:
            known = self._job_keys.get(header.job_id)
            if header.encryption_key:
                # The first key of a job sticks; a header with another key is checked against its
                # round's other headers, never silently adopted for the job.
                if known is None:
                    self._job_keys[header.job_id] = header.encryption_key
                    self.store.save_key(header.job_id, header.encryption_key)
                return header
        if known is None:
            raise ProtocolError(
                f"header.encryption_key is required: this aggregator holds no public key for job {header.job_id!r}"
            )
        resolved = pb.RoundHeader()
        resolved.CopyFrom(header)
        resolved.encryption_key = known
        return resolved

    def _with_tee_key(self, header: pb.RoundHeader) -> pb.RoundHeader:
        """tee: the session key, wrapped to the enclave's key, is handed to the enclave once."""
        with self._lock:
            known = self._job_keys.get(header.job_id)
            if header.encryption_key:
                if known is None:
                    try:
                        self.enclave.provision(header.job_id, header.encryption_key)
                    except ValueError as error:
                        raise ProtocolError(f"header.encryption_key: {error}") from None
                    self._job_keys[header.job_id] = header.encryption_key
                return header
        if known is None:
            raise ProtocolError(
                f"header.encryption_key is required: the enclave holds no session key for job {header.job_id!r}"
            )
        resolved = pb.RoundHeader()
        resolved.CopyFrom(header)
        resolved.encryption_key = known
        return resolved

    def push(self, party: str, state: RoundState, message: pb.Slice) -> bool:
        """Fold one slice in; deliver the combined slice when its index completes."""
        accepted, _ = self.push_batch(
            party,
            state,
            np.array([message.index], dtype=np.uint32),
            np.array([message.n_valid], dtype=np.uint32),
            np.array([len(message.payload)], dtype=np.uint32),
            message.payload,
        )
        return accepted == 1

    def push_batch(
        self,
        party: str,
        state: RoundState,
        indices: np.ndarray,
        n_valid: np.ndarray,
        lengths: np.ndarray,
        payload: bytes,
        *,
        payload_size: int | None = None,
    ) -> tuple[int, int]:
        """Fold a batch of one party's slices in; returns (accepted, duplicates).

        ``payload`` holds the slices back to back, or (``payload_size`` given) it is the whole
        received message, which the data plane reads in place.
        """
        if self.hooks is not None and hasattr(self.hooks, "received"):
            if payload_size is not None:  # the whole message: the hook gets the slices' bytes
                payload, payload_size = pb.PushMessage.FromString(payload).batch.payload, None
            payload = self.hooks.received(state.header, party, indices, lengths, bytes(payload))
        try:
            accepted, duplicates, completed, finished = state.fold(
                party, indices, n_valid, lengths, payload, payload_size=payload_size
            )
        except ProtocolError:
            # Slices of the batch folded before the refused one stay folded; indices they
            # completed are delivered now rather than with the next batch.
            self._deliver(state, *state.drain())
            raise
        self._deliver(state, completed, finished)
        return accepted, duplicates

    def push_message(self, party: str, state: RoundState, raw: bytes, view: tuple) -> tuple[int, int]:
        """Fold the batch of a received ``PushMessage`` in place; returns (accepted, duplicates)."""
        indices, n_valid, lengths = (np.frombuffer(part, dtype="<u4") for part in view[:3])
        return self.push_batch(party, state, indices, n_valid, lengths, raw, payload_size=view[3])

    def _deliver(self, state: RoundState, completed: list[tuple[int, bytes]], finished: bool) -> None:
        if finished:
            self._complete(state)
        if completed:
            self.slices_aggregated += len(completed)
            for index, combined in completed:
                self._emit(state.header, index, combined, None)

    def stream_ended(self, party: str, state: RoundState) -> None:
        """A party's slice stream ended; with slices missing and no other stream of it open, a dropout candidate.

        A party that reconnected has a new stream open while the old one is still being torn down
        (a half-open connection ends only at a keepalive timeout): the old one's end says nothing.
        """
        with state.lock:
            open_streams = state.streams.get(party, 1) - 1
            state.streams[party] = max(0, open_streams)
            if state.status == "open" and open_streams <= 0 and party in state.missing():
                state.broken[party] = time.monotonic()

    def redeliver(self, key: RoundKey, party: str) -> None:
        """Queue a completed round's slices for ``party`` again (it lost them)."""
        header, done = self._completed[key]
        if header.excluded:  # told again first, as the first time (the stored header names them)
            self._tell(header, pb.RoundControl.KIND_EXCLUDED, list(header.excluded), "excluded as dropouts", party)
        for index, payload in sorted(done.items()):
            self._emit(header, index, payload, party)

    def fetch(self, key: RoundKey, party: str, indices: list[int]) -> list[pb.AggregatedSlice]:
        """Combined slices of a completed attempt, for one of its participants."""
        with self._lock:
            if key not in self._completed:
                raise RoundClosedError(f"round attempt {key} is not complete here")
            header, done = self._completed[key]
        if party not in header.participants:
            raise PermissionDeniedError(f"{party!r} is not a participant of round attempt {key}")
        wanted = indices or sorted(done)
        unknown = [i for i in wanted if i not in done]
        if unknown:
            raise ProtocolError(f"indices {unknown[:5]} are out of range (num_slices {header.num_slices})")
        return [self._aggregated(header, i, done[i]) for i in wanted]

    def _complete(self, state: RoundState) -> None:
        # Stored before the last slice goes out: whoever sees the round complete can get it again.
        metrics.ROUNDS.labels("aggregator", "completed").inc()
        metrics.ROUND_SECONDS.labels("aggregator", "round").observe(time.monotonic() - state.created)
        state.close()
        stored = state.stored_header()
        done = state.results.finish(stored)
        with self._lock:
            self._completed[state.key] = (stored, done)
            self._rounds.pop(state.key, None)
            old = [k for k in self._completed if k[0] == state.key[0] and k[1] + 2 < state.key[1]]
            for key in old:
                del self._completed[key]
        for listener in list(self.completion_listeners):
            try:
                listener(state.header, done)
            except Exception:  # noqa: BLE001 - a listener must not break the data path
                log.exception("completion listener failed for %s", state.key)

    def _aggregated(self, header: pb.RoundHeader, index: int, payload: bytes) -> pb.AggregatedSlice:
        return pb.AggregatedSlice(
            round=header.round,
            attempt=header.attempt,
            slice=pb.Slice(index=index, n_valid=expected_length(header, index), payload=payload),
        )

    def _emit(self, header: pb.RoundHeader, index: int, payload: bytes, only: str | None) -> None:
        participants = list(header.participants)
        if header.routing == pb.RESULT_ROUTING_ROUND_ROBIN:
            recipients = [participants[index % len(participants)]]
        else:
            recipients = participants
        if only is not None:
            recipients = [p for p in recipients if p == only]
        if not recipients:
            return
        if self.hooks is not None and hasattr(self.hooks, "deliver"):
            for recipient in recipients:
                served = self.hooks.deliver(header, index, payload, recipient)
                delivery = pb.Delivery(job_id=header.job_id, aggregate=self._aggregated(header, index, served))
                self.mailboxes.deliver_to(header.job_id, [recipient], header.round, delivery)
            return
        delivery = pb.Delivery(job_id=header.job_id, aggregate=self._aggregated(header, index, payload))
        self.mailboxes.deliver_to(header.job_id, recipients, header.round, delivery)

    def party_restarted(self, job_id: str, party: str, incarnation: int) -> None:
        """``party``'s process was replaced: abort the open attempts it had not sent its share of.

        Its survivors retry at once instead of waiting out the round timeout for a process that
        no longer exists (its new one rejoins at a round boundary). Until a peer admits it, an
        attempt that lists it and has no header from it is aborted too (``_watch``).
        """
        with self._lock:
            if incarnation <= self._incarnations.get((job_id, party), 0):
                return  # a request seen before (re-sent after a reconnect): its process is already known
            self._incarnations[(job_id, party)] = incarnation
            self._restarted.add((job_id, party))
            states = [s for s in self._rounds.values() if s.status == "open" and s.header.job_id == job_id]
        for state in states:
            with state.lock:
                waiting = party in state.participants and party in state.missing()
            if waiting:
                self.drop(state, [party], f"{party} restarted: the process in this round attempt is gone")

    def parties_admitted(self, job_id: str, parties: list[str], incarnation: int) -> None:
        """A peer admitted these restarted parties: attempts that list them wait for them again."""
        with self._lock:
            for party in parties:
                if incarnation >= self._incarnations.get((job_id, party), 0):
                    self._restarted.discard((job_id, party))

    def drop_revoked(self, party: str, reason: str) -> None:
        """``party``'s certificate was revoked while connected: abort the open attempts it is part of.

        Its peers retry without it at once (``on_dropout``), as after any dropout. Attempts opened
        later that list it are aborted too while it has not joined them (``_watch``); joining
        (possible only with a certificate that is not revoked, e.g. after a rotation) ends that.
        """
        with self._lock:
            self._revoked_parties[party] = reason
            states = [s for s in self._rounds.values() if s.status == "open" and party in s.participants]
        for state in states:
            self.drop(state, [party], reason)

    def _abort_revoked(self, states: list[RoundState]) -> None:
        if not self._revoked_parties:
            return
        for state in states:
            with state.lock:
                revoked = [p for p in state.participants if p in self._revoked_parties and p not in state.joined]
            if revoked:
                self.drop(state, revoked, "; ".join(self._revoked_parties.get(p, "revoked") for p in revoked))

    def drop(self, state: RoundState, dropped: list[str], reason: str) -> None:
        """Go on without ``dropped``: exclude them where the round recovers and they sent nothing, else abort."""
        header = state.header
        if header.recover_dropouts and header.cluster_nodes <= 1 and len(dropped) < len(state.participants):
            if not any(state.contributed.get(p, 0) for p in dropped) and self.exclude(state, dropped, reason):
                return
        self.abort(state, dropped, reason)

    def exclude(self, state: RoundState, dropped: list[str], reason: str) -> bool:
        """Complete the attempt without ``dropped`` (secagg recovery); False if one of them had sent slices.

        In order: their slices are refused from now on and none was folded (checked after any fold
        of theirs in flight), then every participant is told the whole excluded set, then zeros
        are folded in their place. Deliveries reach each party in order, so a party that holds a
        combined slice also holds the exclusion that completed it.
        """
        with state.exclusion_lock:
            if state.status != "open" or set(dropped) <= state.excluded:
                return state.status != "aborted" and set(dropped) <= state.excluded
            marked = state.mark_excluded(dropped)
            if marked is None:
                return False
            everyone, new = marked
            self._tell(state.header, pb.RoundControl.KIND_EXCLUDED, everyone, reason)
            try:
                outcome = state.fill_excluded(new)
            except (ConfideError, ValueError) as error:  # aborted meanwhile (closed plane): the abort told everyone
                log.warning("round %s: excluding %s stopped: %s", state.key, ", ".join(new), error)
                return True
        metrics.DROPOUTS.labels("aggregator", "excluded").inc(len(new))
        log.warning("round %s: %s excluded (%s); the survivors remove their masks", state.key, ", ".join(new), reason)
        self._deliver(state, *outcome)
        return True

    def abort(self, state: RoundState, dropped: list[str], reason: str) -> None:
        """Abort a round attempt and tell every participant who is left."""
        with state.lock:
            if state.status != "open":
                return
            state.status = "aborted"
            state.reason = reason
        metrics.ROUNDS.labels("aggregator", "aborted").inc()
        metrics.DROPOUTS.labels("aggregator", "aborted").inc(len(dropped))
        state.close()
        log.warning("round %s aborted: %s", state.key, reason)
        self._tell(state.header, pb.RoundControl.KIND_ABORTED, dropped, reason)

    def _tell(
        self, header: pb.RoundHeader, kind: int, dropped: list[str], reason: str, only: str | None = None
    ) -> None:
        """Deliver a round control (abort, exclusion) to every participant of the attempt (or ``only``)."""
        control = pb.RoundControl(
            kind=kind,
            round=header.round,
            attempt=header.attempt,
            dropped=dropped,
            survivors=[p for p in header.participants if p not in dropped],
            reason=reason,
        )
        delivery = pb.Delivery(job_id=header.job_id, control=control)
        self.mailboxes.deliver_to(
            header.job_id, header.participants if only is None else [only], header.round, delivery
        )

    def _watch(self) -> None:
        while not self._stopped.wait(0.2):
            try:
                self._watch_tick()
            except Exception:  # noqa: BLE001 - one bad round must not stop dropout detection for every job
                log.exception("round watcher: a tick failed; watching on")

    def _watch_tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            states = [s for s in self._rounds.values() if s.status == "open"]
        self._abort_revoked(states)
        for state in states:
            round_timeout_s, dropout_grace_s = self._timeouts(state.header.job_id)
            with state.lock:
                gone = [p for p, t in state.broken.items() if now - t > dropout_grace_s and p not in state.excluded]
                late = now - state.created > round_timeout_s
                absent = [p for p in state.participants if p not in state.joined and p not in state.excluded]
                replaced = [p for p in absent if (state.header.job_id, p) in self._restarted]
                stalled = state.missing() if late else []
                away = (
                    state.checkpoint is None
                    and state.broken
                    and now - min(state.broken.values()) > self.config.checkpoint_after_s
                )
            if away and not gone:
                self._write_checkpoint(state)
            if replaced:
                self.drop(state, replaced, f"{', '.join(replaced)} restarted and has not been admitted back yet")
            elif gone:
                self.drop(
                    state,
                    gone,
                    f"{', '.join(gone)} dropped out mid-round (stream broke and did not resume within "
                    f"{dropout_grace_s:g} s)",
                )
            elif late and (absent or stalled):
                dropped = absent or stalled
                self.drop(
                    state,
                    dropped,
                    f"{', '.join(dropped)} sent no complete update within {round_timeout_s:g} s",
                )
        with self._lock:
            closed = [k for k, s in self._rounds.items() if s.status == "aborted" and now - s.created > 600]
            for key in closed:
                del self._rounds[key]

    def _write_checkpoint(self, state: RoundState) -> None:
        """A participant is away: move the round's partial sums out of memory (Jupiter §3.5)."""
        written = state.write_checkpoint()
        if written is not None:
            log.info(
                "round %s: %s away; partial sums of %d indices checkpointed (%d bytes), waiting for them",
                state.key,
                ", ".join(sorted(state.broken)),
                *written,
            )

    def open_rounds(self) -> int:
        """Round attempts still collecting slices."""
        with self._lock:
            return sum(1 for s in self._rounds.values() if s.status == "open")

    def close(self) -> None:
        """Stop the data path, the monitor thread and the CRL watcher."""
        if self.data_server is not None:
            self.data_server.stop(1.0)
        if self.revocation_gate is not None:
            self.revocation_gate.stop()
        self._stopped.set()
        self.store.close()

    def admitted_round(self, job_id: str, round_number: int) -> int:
        """The round from which this node serves ``job_id`` again, asked by a party about to push ``round_number``.

        Parties that lost this node probe it before each round. The first probe of a loss fixes
        the answer at the next round, so a party that probes later in the same round boundary gets
        the same answer, and none has pushed that round yet (it needs every party's push of the
        round before): every party routes to this node from the same round on. A probe past the
        fixed round starts a new loss (the node was found lost again without restarting).
        """
        with self._lock:
            admitted = self._admissions.get(job_id)
            if admitted is None or round_number > admitted:
                admitted = round_number + 1
                self._admissions[job_id] = admitted
            return admitted

    def health(self, name: str, request: pb.HealthRequest | None = None) -> pb.HealthReply:
        """Name, load and the data plane's figures; with a job and round, the node's admission round."""
        stats = self.dataplane.stats()
        admitted = self.admitted_round(request.job_id, request.round) if request and request.job_id else 0
        return pb.HealthReply(
            name=name,
            open_rounds=self.open_rounds(),
            slices_aggregated=self.slices_aggregated,
            enclave_public_key=self.enclave.public_key(),
            enclave_report=json.dumps(self.enclave.report(), sort_keys=True),
            simd=str(stats["simd_level"]),
            staged_bytes=int(stats["staged_bytes"]),
            peak_staged_bytes=int(stats["peak_staged_bytes"]),
            workers=int(stats["workers"]),
            data_port=self.data_server.port if self.data_server is not None else 0,
            admitted_round=admitted,
        )

    def observe(self, event: str, party: str, message: object) -> None:
        """Hand a received message to the observer (tests, audits)."""
        if self.observer is not None:
            self.observer(event, party, message)


def incarnation_of(tag: str) -> int:
    """The number at the end of a rejoin or admission tag (0 when there is none)."""
    try:
        return int(tag.rsplit("/", 1)[-1])
    except ValueError:
        return 0
