"""The aggregator process: Aggregation and Relay services over mutual TLS.

It learns a round from the parties' headers (no job file needed) and combines slices as they
arrive. It never holds key material: the protection modes give it float32 words (plain),
masked words (secagg, groupmask) or ciphertexts and the public key (paillier). A round attempt
ends in one of three ways: complete (every participant sent every slice; the result is stored
on disk before the last slice is delivered), aborted (a participant's stream broke and it did
not come back within ``dropout_grace_s``, or it never showed up within ``round_timeout_s``: the
survivors are told and retry under a new attempt number), or superseded by the next round.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from confide import _native
from confide.aggregator.mailbox import Mailboxes
from confide.aggregator.rounds import RoundKey, RoundState, expected_length, is_tee, validate_header
from confide.aggregator.store import ResultStore
from confide.crypto.identity import Identity, name_from_der
from confide.errors import ConfideError, PermissionDeniedError, ProtocolError, RoundClosedError
from confide.transport import status, tls
from confide.transport.client import ADMIT_PREFIX, CONTROL_ROUND, REJOIN_PREFIX
from confide.transport.revocation import RevocationGate, RevocationList
from confide.v1 import runtime_pb2 as pb
from confide.v1 import runtime_pb2_grpc as rpc

__all__ = ["AggregatorConfig", "AggregatorCore", "NativeDataPath", "serve"]

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
    mailbox_cap_bytes : int
        Cap on relay/delivery bytes retained for all parties together.
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
    mailbox_cap_bytes: int = 2 * 1024**3
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
        self.mailboxes = Mailboxes(config.mailbox_cap_bytes)
        self.store = ResultStore(config.state_dir)
        self.observer = observer
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
        self._completed: dict[RoundKey, tuple[pb.RoundHeader, dict[int, bytes]]] = {}
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
        self.completion_listeners: list[Callable[[pb.RoundHeader, dict[int, bytes]], None]] = []
        for header, done in self.store.load():
            key = (header.job_id, header.round, header.attempt, header.share)
            self._completed[key] = (header, done)
            self._latest[header.job_id] = max(self._latest.get(header.job_id, 0), header.round)
        #: Parties cut off for a revoked certificate (name -> why), until one joins a round again.
        self._revoked_parties: dict[str, str] = {}
        self._monitor = threading.Thread(target=self._watch, name="confide-round-monitor", daemon=True)
        self._monitor.start()
        #: The Rust data path (see :class:`NativeDataPath`), when started by :func:`serve`.
        self.data_server: _native.DataServer | None = None
        #: The revocation check of every port, when :func:`serve` was given a CRL.
        self.revocation_gate: RevocationGate | None = None
        self.data_path: NativeDataPath | None = None

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
                state = RoundState(key=key, header=header, encryption_key=encryption_key, plane=self.dataplane)
                self._rounds[key] = state
                self._latest[header.job_id] = max(latest, header.round)
                self.mailboxes.retire(header.job_id, header.round - 1)
            else:
                validate_header(header)
                state.check_header(header)
        if state.status == "aborted":
            raise RoundClosedError(f"round {header.round} attempt {header.attempt} was aborted: {state.reason}")
        self._revoked_parties.pop(header.party_id, None)  # admitted, so its certificate now is not revoked
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
        state.close()
        stored = state.stored_header()
        self.store.save(stored, state.done)
        with self._lock:
            self._completed[state.key] = (stored, state.done)
            self._rounds.pop(state.key, None)
            old = [k for k in self._completed if k[0] == state.key[0] and k[1] + 2 < state.key[1]]
            for key in old:
                del self._completed[key]
        for listener in list(self.completion_listeners):
            try:
                listener(state.header, state.done)
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
        delivery = pb.Delivery(job_id=header.job_id, aggregate=self._aggregated(header, index, payload))
        for party in recipients:
            self.mailboxes.deliver(header.job_id, party, header.round, delivery)

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
        for party in header.participants if only is None else [only]:
            self.mailboxes.deliver(header.job_id, party, header.round, delivery)

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


class NativeDataPath:
    """The control side of the Rust data path (``_native.DataServer``, crate ``confide-aggnet``).

    The data server receives a party's ``PushSlices`` stream, parses and checks every batch
    and folds it in the data plane without the GIL. It calls this object once per stream
    (:meth:`open`, :meth:`ended`), when a batch completed slices (:meth:`folded`) or was
    refused (:meth:`refused`), and per message only while an observer is attached. The
    replies and status codes are those of :meth:`AggregationServicer.PushSlices`.
    """

    def __init__(self, core: AggregatorCore) -> None:
        self._core = core
        self._streams: dict[int, tuple[str, RoundState]] = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self.observing = core.observer is not None
        #: Streams this path opened (a measure that slices took it).
        self.streams_opened = 0

    def open(self, peer_der: bytes | None, raw: bytes) -> tuple[int, int, int] | None:
        """A stream's header: (round id, party position, token), or None if already complete."""
        if self._core.revocation_gate is not None:
            self._core.revocation_gate.check_der(peer_der)
        header = _push_message(raw).header
        party = tls.check_caller(name_from_der(peer_der), header.party_id, "header.party_id")
        self._core.observe("header", party, header)
        state = self._core.open_round(header)
        if state is None:
            self._core.redeliver((header.job_id, header.round, header.attempt, header.share), party)
            return None
        token = next(self._tokens)
        with self._lock:
            self._streams[token] = (party, state)
            self.streams_opened += 1
        return state.round_id, state.position(party), token

    def _stream(self, token: int) -> tuple[str, RoundState]:
        with self._lock:
            return self._streams[token]

    def observe(self, token: int, raw: bytes) -> None:
        """Hand the slices of a received message to the observer."""
        party, _ = self._stream(token)
        message = _push_message(raw)
        items = unbatch(message.batch) if message.HasField("batch") else [message.slice]
        for item in items:
            self._core.observe("slice", party, item)

    def folded(self, token: int, completed: list[tuple[int, bytes]]) -> None:
        """Book and deliver the slices a batch completed."""
        _, state = self._stream(token)
        self._core._deliver(state, completed, state.record(completed))

    def refused(self, token: int, kind: str, message: str, slices: int) -> int:
        """The data plane refused a batch: late copies (returned) or the error to end with."""
        _, state = self._stream(token)
        if state.status == "complete":
            return slices  # late copies of slices whose indices completed
        if kind == "closed" or state.status != "open":
            raise RoundClosedError(f"round attempt {state.key} is {state.status}")
        # Slices of the batch folded before the refused one stay folded; deliver what they completed.
        self._core._deliver(state, *state.drain())
        if kind == "invalid":
            raise ProtocolError(message)
        raise ConfideError(message)

    def ended(self, token: int) -> bool:
        """The stream ended; whether the round attempt (share) is complete."""
        with self._lock:
            party, state = self._streams.pop(token)
        self._core.stream_ended(party, state)
        return state.status == "complete"

    def status_of(self, error: BaseException) -> tuple[int, str]:
        """The gRPC status code (number) and message for an error raised here."""
        code, message = status.code_of(error)
        return int(code.value[0]), message

    def log_failure(self, what: str, error: BaseException) -> None:
        """A callback failed where no status can be sent (the stream is gone)."""
        log.error("data path %s failed: %s: %s", what, type(error).__name__, error)


class AggregationServicer(rpc.AggregationServicer):
    """gRPC Aggregation service."""

    def __init__(self, core: AggregatorCore, name: str) -> None:
        self._core = core
        self._name = name

    def PushSlices(self, request_iterator, context):  # noqa: N802 - gRPC method name
        """Receive one party's slices for one round attempt."""
        state: RoundState | None = None
        party = ""
        accepted = duplicates = 0
        try:
            # Messages arrive as received bytes (see add_aggregation_service): batches go to the
            # data plane as they are, so their payload is never copied in Python.
            raw = next(request_iterator, None)
            first = _push_message(raw) if raw is not None else None
            if first is None or not first.HasField("header"):
                raise ProtocolError("a PushSlices stream must start with a header")
            header = first.header
            party = tls.require_caller(context, header.party_id, "header.party_id")
            self._core.observe("header", party, header)
            state = self._core.open_round(header)
            if state is None:
                self._core.redeliver((header.job_id, header.round, header.attempt, header.share), party)
                return pb.PushReply(round_complete=True)
            for raw in request_iterator:
                try:
                    view = _native.agg_parse_batch(raw)
                except ValueError as error:
                    raise ProtocolError(str(error)) from None
                if view is not None:
                    if self._core.observer is not None:
                        for item in unbatch(_push_message(raw).batch):
                            self._core.observe("slice", party, item)
                    took, repeated = self._core.push_message(party, state, raw, view)
                    accepted += took
                    duplicates += repeated
                    continue
                message = _push_message(raw)
                body = message.WhichOneof("body")
                if body == "slice":
                    self._core.observe("slice", party, message.slice)
                    if self._core.push(party, state, message.slice):
                        accepted += 1
                    else:
                        duplicates += 1
                else:
                    raise ProtocolError("only the first message of a PushSlices stream may be a header")
            return pb.PushReply(accepted=accepted, duplicates=duplicates, round_complete=state.status == "complete")
        except (ConfideError, ValueError) as error:
            status.abort(context, error)
        finally:
            if state is not None:
                self._core.stream_ended(party, state)

    def FetchResult(self, request, context):  # noqa: N802
        """Combined slices of a completed round attempt again."""
        try:
            party = tls.caller_name(context) or ""
            key = (request.job_id, request.round, request.attempt, request.share)
            yield from self._core.fetch(key, party, list(request.indices))
        except (ConfideError, ValueError) as error:
            status.abort(context, error)

    @status.guarded
    def Health(self, request, context):  # noqa: N802
        """Name and load."""
        return self._core.health(self._name, request)


class RelayServicer(rpc.RelayServicer):
    """gRPC Relay service: routes end-to-end protected envelopes between parties."""

    def __init__(self, core: AggregatorCore) -> None:
        self._core = core

    @status.guarded
    def Send(self, request, context):  # noqa: N802
        """Deliver one envelope to its recipients' mailboxes."""
        tls.require_caller(context, request.sender, "envelope.sender")
        if not request.job_id or not request.tag:
            raise ProtocolError("envelope.job_id and envelope.tag are required")
        recipients = list(request.recipients)
        if not recipients or any(not 0 < len(r) <= MAX_NAME for r in recipients):
            raise ProtocolError(f"envelope.recipients must list 1.. names of 1..{MAX_NAME} characters")
        self._core.observe("envelope", request.sender, request)
        if request.round == CONTROL_ROUND and request.tag.startswith(REJOIN_PREFIX):
            # A restarted party: the process that held its place in an open round is gone.
            self._core.party_restarted(request.job_id, request.sender, _incarnation(request.tag))
        elif request.round == CONTROL_ROUND and request.tag.startswith(ADMIT_PREFIX):
            self._core.parties_admitted(request.job_id, recipients, _incarnation(request.tag))
        elif request.round > 1:
            # Relay-only jobs (vertical) never push slices: retire by the envelopes' rounds too.
            self._core.mailboxes.retire(request.job_id, request.round - 1)
        delivery = pb.Delivery(job_id=request.job_id, envelope=request)
        for party in recipients:
            self._core.mailboxes.deliver(request.job_id, party, request.round, delivery)
        return pb.RelayReply(delivered=len(recipients))

    def Subscribe(self, request, context):  # noqa: N802
        """Replay the party's mailbox, then stream new deliveries."""
        try:
            tls.require_caller(context, request.party_id, "subscribe.party_id")
        except ConfideError as error:
            status.abort(context, error)
        yield from self._core.mailboxes.subscribe(request.job_id, request.party_id, context.is_active)


def add_aggregation_service(servicer: AggregationServicer, server: grpc.Server) -> None:
    """The Aggregation service, with PushSlices receiving each message as its bytes."""
    handlers = {
        "PushSlices": grpc.stream_unary_rpc_method_handler(
            servicer.PushSlices, request_deserializer=None, response_serializer=pb.PushReply.SerializeToString
        ),
        "FetchResult": grpc.unary_stream_rpc_method_handler(
            servicer.FetchResult,
            request_deserializer=pb.FetchRequest.FromString,
            response_serializer=pb.AggregatedSlice.SerializeToString,
        ),
        "Health": grpc.unary_unary_rpc_method_handler(
            servicer.Health,
            request_deserializer=pb.HealthRequest.FromString,
            response_serializer=pb.HealthReply.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("confide.v1.Aggregation", handlers),))


def _incarnation(tag: str) -> int:
    """The number at the end of a rejoin or admission tag (0 when there is none)."""
    try:
        return int(tag.rsplit("/", 1)[-1])
    except ValueError:
        return 0


def _push_message(raw: bytes) -> pb.PushMessage:
    """One received ``PushMessage``; bytes protobuf cannot parse are a :class:`ProtocolError`."""
    try:
        return pb.PushMessage.FromString(raw)
    except DecodeError as error:
        raise ProtocolError(f"push message ({len(raw)} bytes) does not parse: {error}") from None


def unbatch(batch: pb.SliceBatch) -> list[pb.Slice]:
    """The slices of a batch (for observers; the data path never splits a batch in Python)."""
    out, offset = [], 0
    for index, n_valid, length in zip(batch.indices, batch.n_valid, batch.lengths, strict=False):
        out.append(pb.Slice(index=index, n_valid=n_valid, payload=batch.payload[offset : offset + length]))
        offset += length
    return out


def keep_freed_memory() -> bool:
    """Ask glibc to reuse freed buffers instead of returning them to the kernel at once.

    Every received message is a fresh ~1 MiB buffer; with glibc's defaults each one is mapped,
    faulted in page by page (zeroed by the kernel) and unmapped again, which cost the node more
    CPU than TLS and folding together (measured: ~40% of its cycles in clear_page). Raising the
    mmap and trim thresholds and the top pad keeps those buffers in the heap (measured: node
    throughput 340 → 520–800 MB/s with 200 participants). No-op where glibc is absent.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_threshold, m_arena_max = -1, -2, -3, -8
        settings = (
            (m_mmap_threshold, 32 * 1024 * 1024),
            (m_trim_threshold, 512 * 1024 * 1024),
            (m_top_pad, 256 * 1024 * 1024),
            # One arena: hundreds of stream threads otherwise each grow and trim a heap of their own.
            (m_arena_max, 1),
        )
        return all(libc.mallopt(option, value) == 1 for option, value in settings)
    except (OSError, AttributeError):
        return False


def serve(
    identity: Identity, address: str, config: AggregatorConfig, *, observer: Observer | None = None
) -> tuple[grpc.Server, int, AggregatorCore]:
    """Start the aggregator's gRPC server; returns (server, bound port, core)."""
    keep_freed_memory()
    gate = None
    if config.crl_path is not None:
        gate = RevocationGate(RevocationList(config.crl_path, identity.ca_pem), identity.name)
    core = AggregatorCore(config, observer)
    if gate is not None:
        core.revocation_gate = gate
        gate.on_cut(lambda party, _serial, message: core.drop_revoked(party, message))
        gate.start()
    server, port = tls.server(
        identity, address, max_workers=config.max_workers, interceptors=[gate] if gate is not None else []
    )
    add_aggregation_service(AggregationServicer(core, identity.name), server)
    rpc.add_RelayServicer_to_server(RelayServicer(core), server)
    if config.data_port is not None:
        host = address.rpartition(":")[0] or "0.0.0.0"
        core.data_path = NativeDataPath(core)
        core.data_server = _native.DataServer(
            core.dataplane,
            core.data_path,
            f"{host}:{config.data_port}",
            identity.cert_pem,
            identity.key_pem,
            identity.ca_pem,
            threads=config.data_threads,
            max_message_bytes=tls.MAX_MESSAGE_BYTES,
        )
        log.info("data path (Rust) listening on port %d", core.data_server.port)
    server.start()
    return server, port, core
