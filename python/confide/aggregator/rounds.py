"""Round state: the control side of one (job, round, attempt, share) at the aggregator.

A round attempt opens with the first party's header, which fixes the participants, the
aggregation kind, the slice geometry and the key material (paillier: public key; tee: the
session key wrapped to the enclave); every later header must agree. Slices are folded by the
native data plane (:class:`confide._native.DataPlane`, crate ``confide-agg``): one worker per
core, each owning the partial sums of the indices routed to it, so folding runs without the GIL
and without cross-core locks. This module keeps only bookkeeping: who joined, who sent how many
slices, which indices completed, and the round's status.

The aggregator combines only what it can without keys: float32 sums or weighted means (plain),
sums mod 2^32 (masked words), products mod n^2 (Paillier ciphertexts, public key only); in
``tee`` mode the data plane hands AES-GCM sealed slices to the enclave interface, which opens,
folds and re-seals them (simulated where no enclave hardware exists, and reported so).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from confide import _native
from confide._checks import require
from confide.aggregator.robust import EnclaveRobustRound, RobustRound, strategy_of
from confide.aggregator.store import MemoryResults, RoundWriter
from confide.crypto import EncryptionKey
from confide.errors import ProtocolError, RoundClosedError
from confide.ml.strategies.trimmed_mean import TrimmedMean
from confide.transport.routing import share_indices
from confide.v1 import runtime_pb2 as pb

__all__ = ["NATIVE_KIND", "RoundKey", "RoundState", "expected_length", "validate_header"]

RoundKey = tuple[str, int, int, int]  # (job_id, round, attempt, share)
_HEADER_FIELDS = (
    "participants",
    "kind",
    "num_slices",
    "slice_length",
    "vector_length",
    "routing",
    "mode",
    "weights",
    "cluster_nodes",
    "share",
    "recover_dropouts",
)
MAX_PARTICIPANTS = 1024
MAX_SLICES = 1 << 20
MAX_SLICE_LENGTH = 4 * 1024 * 1024
MAX_CLUSTER_NODES = 256
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: Aggregation kind → the native data plane's name for it.
NATIVE_KIND = {
    pb.AGGREGATION_KIND_FLOAT32_SUM: "f32_sum",
    pb.AGGREGATION_KIND_FLOAT32_MEAN: "f32_mean",
    pb.AGGREGATION_KIND_UINT32_SUM: "u32_sum",
    pb.AGGREGATION_KIND_PAILLIER_PRODUCT: "paillier",
    pb.AGGREGATION_KIND_TEE_FLOAT32_SUM: "tee_f32_sum",
    pb.AGGREGATION_KIND_TEE_FLOAT32_MEAN: "tee_f32_mean",
    pb.AGGREGATION_KIND_FLOAT16_SUM: "f16_sum",
    pb.AGGREGATION_KIND_BFLOAT16_SUM: "bf16_sum",
    pb.AGGREGATION_KIND_INT8_SCALED_SUM: "q8_sum",
    pb.AGGREGATION_KIND_TEE_FLOAT16_SUM: "tee_f16_sum",
    pb.AGGREGATION_KIND_TEE_BFLOAT16_SUM: "tee_bf16_sum",
    pb.AGGREGATION_KIND_TEE_INT8_SCALED_SUM: "tee_q8_sum",
    pb.AGGREGATION_KIND_RLWE_SUM: "rlwe_sum",
    pb.AGGREGATION_KIND_FLOAT32_STACK: "f32_stack",
    pb.AGGREGATION_KIND_TEE_FLOAT32_STACK: "tee_f32_stack",
}
#: Kinds whose slices stack the participants' updates for a robust rule (header.robust).
_STACK_KINDS = (pb.AGGREGATION_KIND_FLOAT32_STACK, pb.AGGREGATION_KIND_TEE_FLOAT32_STACK)
#: Sums whose identity is zero words and where a party lost before it sent anything can be left out.
_EXCLUDABLE_KINDS = (pb.AGGREGATION_KIND_UINT32_SUM, pb.AGGREGATION_KIND_RLWE_SUM)
_MEAN_KINDS = (pb.AGGREGATION_KIND_FLOAT32_MEAN, pb.AGGREGATION_KIND_TEE_FLOAT32_MEAN)
_TEE_KINDS = tuple(kind for kind, name in NATIVE_KIND.items() if name.startswith("tee_"))
_round_ids = itertools.count(1)
_default_plane: _native.DataPlane | None = None
_default_lock = threading.Lock()


def default_plane() -> _native.DataPlane:
    """A process-wide data plane for round states made without one (tools and tests)."""
    global _default_plane
    with _default_lock:
        if _default_plane is None:
            _default_plane = _native.DataPlane(0, 256 * 1024**2)
        return _default_plane


def expected_length(header: pb.RoundHeader, index: int) -> int:
    """Values held by slice ``index`` of the round described by ``header``."""
    return int(min(header.slice_length, header.vector_length - index * header.slice_length))


def word_bytes(kind: int, values: np.ndarray) -> np.ndarray:
    """Bytes of slices of ``values`` values as they travel, for the kinds an exclusion fills with zeros."""
    if kind == pb.AGGREGATION_KIND_RLWE_SUM:
        return ((values + 1) // 2 * 8).astype(np.uint32)  # two values a lattice word
    return (values * 4).astype(np.uint32)


def enclave_rule(header: pb.RoundHeader) -> tuple[str, int, int, int, float] | None:
    """(rule, cut, byzantine, selected, norm_bound) of a tee stacked round, for its enclave; None for other kinds.

    ``cut``: the trimmed mean's values dropped at each end; ``norm_bound`` 0: the round's median norm.
    """
    if header.kind != pb.AGGREGATION_KIND_TEE_FLOAT32_STACK:
        return None
    strategy = strategy_of(header)
    cut = strategy.cut(len(header.participants)) if isinstance(strategy, TrimmedMean) else 0
    rule = header.robust
    return strategy.name, cut, rule.byzantine, rule.selected, float(rule.norm_bound or 0.0)


def is_tee(kind: int) -> bool:
    """Whether ``kind`` is sealed for the enclave."""
    return kind in _TEE_KINDS


def validate_header(header: pb.RoundHeader) -> EncryptionKey | None:
    """Check one header on its own; returns the paillier public key when there is one."""
    if not _JOB_ID.match(header.job_id):
        raise ProtocolError("header.job_id must be 1..128 characters of [A-Za-z0-9_.-], starting alphanumeric")
    if header.kind not in NATIVE_KIND:
        raise ProtocolError(f"header.kind {header.kind} is not an aggregation kind this aggregator runs")
    participants = list(header.participants)
    if not 1 <= len(participants) <= MAX_PARTICIPANTS or len(set(participants)) != len(participants):
        raise ProtocolError(f"header.participants must list 1..{MAX_PARTICIPANTS} distinct parties")
    if header.party_id not in participants:
        raise ProtocolError(f"header.party_id {header.party_id!r} is not among header.participants")
    if not 1 <= header.slice_length <= MAX_SLICE_LENGTH:
        raise ProtocolError(f"header.slice_length must be in [1, {MAX_SLICE_LENGTH}], got {header.slice_length}")
    needed = -(-header.vector_length // header.slice_length) if header.vector_length else 0
    if not 1 <= header.num_slices <= MAX_SLICES or header.num_slices != needed:
        raise ProtocolError(
            f"header.num_slices is {header.num_slices}; {header.vector_length} values in slices of "
            f"{header.slice_length} need {needed} (limit {MAX_SLICES})"
        )
    if header.routing not in (pb.RESULT_ROUTING_ALL, pb.RESULT_ROUTING_ROUND_ROBIN):
        raise ProtocolError(f"header.routing {header.routing} is not a result routing")
    if header.cluster_nodes > MAX_CLUSTER_NODES:
        raise ProtocolError(f"header.cluster_nodes must be at most {MAX_CLUSTER_NODES}, got {header.cluster_nodes}")
    if header.share >= max(1, header.cluster_nodes):
        raise ProtocolError(f"header.share {header.share} is out of range (cluster_nodes {header.cluster_nodes})")
    if header.recover_dropouts and header.kind not in _EXCLUDABLE_KINDS:
        raise ProtocolError("header.recover_dropouts is for masked-word and lattice sums (UINT32_SUM, RLWE_SUM) only")
    if header.kind in _MEAN_KINDS:
        weights = np.asarray(header.weights, dtype=np.float64)
        if len(weights) != len(participants) or not np.isfinite(weights).all() or (weights < 0).any():
            raise ProtocolError(
                f"header.weights must hold {len(participants)} finite non-negative weights (one per participant)"
            )
        if weights.sum() <= 0:
            raise ProtocolError("header.weights must not all be zero")
    elif len(header.weights):
        raise ProtocolError("header.weights is only for the weighted-mean kinds")
    if header.kind in _STACK_KINDS:
        strategy_of(header)  # the rule, its options against the participants, no whole-update rule on a cluster
    elif header.HasField("robust"):
        raise ProtocolError("header.robust is only for the stacked kinds (plain or tee with a robust strategy)")
    if header.kind == pb.AGGREGATION_KIND_PAILLIER_PRODUCT:
        if not header.encryption_key:
            raise ProtocolError("header.encryption_key is required for paillier aggregation")
        return EncryptionKey.from_bytes(header.encryption_key)
    if header.kind in _TEE_KINDS:
        if not header.encryption_key:
            raise ProtocolError("header.encryption_key (the session key wrapped to the enclave) is required for tee")
        return None
    if header.encryption_key:
        raise ProtocolError("header.encryption_key must be empty unless kind is paillier or tee")
    return None


@dataclass
class RoundState:
    """One round attempt (one share of it, on a cluster) at the aggregator."""

    key: RoundKey
    header: pb.RoundHeader
    encryption_key: EncryptionKey | None
    #: The native data plane that folds this round's slices (shared by all rounds of a node).
    plane: _native.DataPlane | None = None
    round_id: int = field(default_factory=lambda: next(_round_ids))
    created: float = field(default_factory=time.monotonic)
    owned: frozenset[int] = frozenset()
    #: Where the combined slices go as they complete: the aggregator's store (a file per attempt,
    #: :class:`~confide.aggregator.store.RoundWriter`), or memory for a state made on its own.
    results: RoundWriter | MemoryResults = field(default_factory=MemoryResults)
    joined: set[str] = field(default_factory=set)
    broken: dict[str, float] = field(default_factory=dict)
    status: str = "open"
    reason: str = ""
    #: Incomplete partial sums written out while a participant is away (Jupiter §3.5).
    checkpoint: bytes | None = None
    checkpoints_written: int = 0
    #: Open slice streams per participant (a reconnected party has a new one before the old one ends).
    streams: dict[str, int] = field(default_factory=dict)
    #: Participants excluded as dropouts (recovery): zero words folded in their place.
    excluded: set[str] = field(default_factory=set)
    #: Folds running per participant (an exclusion waits for them, then checks nothing was folded).
    _folding: dict[str, int] = field(default_factory=dict)
    #: Held through one exclusion (mark, tell, fill), so two of them cannot interleave.
    exclusion_lock: threading.Lock = field(default_factory=threading.Lock)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        header = self.header
        self.owned = frozenset(share_indices(header.job_id, header.share, header.cluster_nodes, header.num_slices))
        self._positions = {party: i for i, party in enumerate(header.participants)}
        #: Slices folded per participant, kept when the round's state leaves the data plane.
        self._final_contributions: list[int] | None = None
        #: A robust rule's state (stacked rounds): what the parties receive instead of the stacked updates.
        self.robust: RobustRound | EnclaveRobustRound | None = None
        if header.kind == pb.AGGREGATION_KIND_FLOAT32_STACK:
            self.robust = RobustRound(header, len(self.owned))
        elif header.kind == pb.AGGREGATION_KIND_TEE_FLOAT32_STACK and strategy_of(header).whole_vector:
            self.robust = EnclaveRobustRound(
                len(self.owned), lambda held: self.plane.finish_robust(self.round_id, held)
            )
        if self.plane is None:
            self.plane = default_plane()
        self.plane.open_round(
            self.round_id,
            header.job_id,
            NATIVE_KIND[header.kind],
            len(header.participants),
            header.num_slices,
            header.slice_length,
            header.vector_length,
            list(header.weights) or None,
            self.encryption_key._native if self.encryption_key is not None else None,
            header.round,
            header.attempt,
            # On a cluster the data plane refuses slices of other shares.
            (header.share, header.cluster_nodes, sorted(self.owned)) if header.cluster_nodes > 1 else None,
            enclave_rule(header),
        )

    @property
    def done(self) -> Mapping[int, bytes]:
        """Combined slices completed so far, by index (read from the round's file on access)."""
        return self.results.view

    @property
    def participants(self) -> list[str]:
        """Participants in header order."""
        return list(self.header.participants)

    def position(self, party: str) -> int:
        """Index of ``party`` among the participants."""
        position = self._positions.get(party)
        if position is None:
            raise ProtocolError(f"{party!r} is not a participant of round attempt {self.key}")
        return position

    def check_header(self, header: pb.RoundHeader) -> None:
        """A later party's header must describe the same round."""
        for name in _HEADER_FIELDS:
            mine, theirs = getattr(self.header, name), getattr(header, name)
            if name in ("participants", "weights"):
                mine, theirs = list(mine), list(theirs)
            if mine != theirs:
                raise ProtocolError(
                    f"header.{name} of {header.party_id!r} ({theirs!r}) differs from the round's ({mine!r})"
                )
        if header.encryption_key != self.header.encryption_key:
            raise ProtocolError(f"header.encryption_key of {header.party_id!r} differs from the round's key")

    def fold(
        self,
        party: str,
        indices: np.ndarray,
        n_valid: np.ndarray,
        lengths: np.ndarray,
        payload: bytes,
        *,
        payload_size: int | None = None,
    ) -> tuple[int, int, list[tuple[int, bytes]], bool]:
        """Fold a batch of ``party``'s slices in the data plane.

        ``payload`` is the concatenated slice payloads, or (``payload_size`` given) the whole
        received ``PushMessage``, folded in place by the data plane. The data plane checks the
        batch against the round (index range, values per slice, this node's share).

        Returns (accepted, duplicates or late copies, completed (index, combined payload),
        whether this batch completed the round's share). A refused slice raises
        :class:`ProtocolError`; slices of the batch folded before it stay folded (:meth:`drain`).
        """
        if self.status == "complete":
            return 0, len(indices), [], False  # late copies of slices whose indices already completed
        if self.status != "open":
            raise RoundClosedError(f"round attempt {self.key} is {self.status}")
        position = self.position(party)
        with self.lock:
            if party in self.excluded:
                raise RoundClosedError(f"{party} was excluded from round attempt {self.key} as a dropout")
            self._folding[party] = self._folding.get(party, 0) + 1
        try:
            self.restore()
            require(self.plane, "the round's data plane is closed")
            if payload_size is not None:
                accepted, duplicates, late, completed = self.plane.push_message(self.round_id, position, payload)
            else:
                accepted, duplicates, late, completed = self.plane.push(
                    self.round_id,
                    position,
                    np.asarray(indices).astype("<u4").tobytes(),
                    np.asarray(n_valid).astype("<u4").tobytes(),
                    np.asarray(lengths).astype("<u4").tobytes(),
                    payload,
                )
        except ValueError as error:
            raise ProtocolError(str(error)) from None
        finally:
            with self.lock:
                self._folding[party] -= 1
        return accepted, duplicates + late, *self.settle(completed)

    def mark_excluded(self, parties: list[str]) -> tuple[list[str], list[str]] | None:
        """Refuse ``parties``' slices from now on; (everyone excluded, those newly so), or None if one had sent any.

        Only for sums whose identity is zero words (masked words, lattice words). A fold of theirs
        already running is waited for; if it folded anything, the new exclusions are withdrawn
        (None) and the caller aborts instead.
        Hold :attr:`exclusion_lock` from here until the zeros are folded.
        """
        require(self.header.kind in _EXCLUDABLE_KINDS, "only masked-word and lattice sums can exclude a party")
        with self.lock:
            if self.status != "open":
                return None
            new = [p for p in parties if p not in self.excluded]
            self.excluded.update(new)
            for party in new:
                self.broken.pop(party, None)  # no longer awaited: no checkpointing on its account
        while True:
            with self.lock:
                if not any(self._folding.get(p, 0) for p in new):
                    break
            time.sleep(0.01)
        self.restore()
        if any(self.contributed.get(p, 0) for p in new):
            with self.lock:
                self.excluded.difference_update(new)
            return None
        with self.lock:
            return sorted(self.excluded), new

    def fill_excluded(self, parties: list[str]) -> tuple[list[tuple[int, bytes]], bool]:
        """Fold zero words (the sum's identity) in place of ``parties``; (completed indices, share complete)."""
        require(self.plane, "the round's data plane is closed")
        indices = np.array(sorted(self.owned), dtype=np.uint32)
        n_valid = np.array([expected_length(self.header, int(i)) for i in indices], dtype=np.uint32)
        completed: list[tuple[int, bytes]] = []
        step = max(1, (64 << 20) // int(word_bytes(self.header.kind, np.array([self.header.slice_length]))[0]))
        for party in parties:
            position = self.position(party)
            for start in range(0, len(indices), step):
                part, valid = indices[start : start + step], n_valid[start : start + step]
                lengths = word_bytes(self.header.kind, valid)
                _, _, _, done = self.plane.push(
                    self.round_id,
                    position,
                    part.tobytes(),
                    valid.tobytes(),
                    lengths.tobytes(),
                    bytes(int(lengths.sum())),
                )
                completed.extend(done)
        return completed, self.record(completed)

    def stored_header(self) -> pb.RoundHeader:
        """The header to store with the result: the round's, naming whoever was excluded."""
        if not self.excluded:
            return self.header
        header = pb.RoundHeader()
        header.CopyFrom(self.header)
        header.excluded[:] = sorted(self.excluded)
        return header

    def accept(self, party: str, message: pb.Slice) -> tuple[bool, bytes | None]:
        """Fold one slice; returns (accepted, combined payload if its index completed)."""
        accepted, _, completed, _ = self.fold(
            party,
            np.array([message.index], dtype=np.uint32),
            np.array([message.n_valid], dtype=np.uint32),
            np.array([len(message.payload)], dtype=np.uint32),
            message.payload,
        )
        return accepted == 1, (completed[0][1] if completed else None)

    def drain(self) -> tuple[list[tuple[int, bytes]], bool]:
        """After a batch was refused part-way: the indices its other slices completed.

        Slices of the batch folded before the refused one stay folded (and counted in
        :attr:`contributed` by the data plane); the indices they completed are returned.
        """
        require(self.plane, "the round's data plane is closed")
        completed = self.plane.take_completed(self.round_id)
        return self.settle(completed) if completed else ([], False)

    def restore(self) -> None:
        """Reload partial sums written out while a participant was away."""
        with self.lock:
            blob, self.checkpoint = self.checkpoint, None
            if blob is not None:
                require(self.plane, "the round's data plane is closed")
                self.plane.restore_round(self.round_id, blob)

    def write_checkpoint(self) -> tuple[int, int] | None:
        """Move the partial sums out of memory (a participant is away); (indices, bytes)."""
        with self.lock:
            if self.status != "open" or self.checkpoint is not None:
                return None
            require(self.plane, "the round's data plane is closed")
            missing = self.plane.missing(self.round_id)
            self.checkpoint = self.plane.checkpoint_round(self.round_id)
            self.checkpoints_written += 1
            return len(missing), len(self.checkpoint)

    def close(self) -> None:
        """Free the round's state in the data plane."""
        require(self.plane, "the round's data plane is closed")
        with self.lock:
            self.checkpoint = None
            if self._final_contributions is None:
                self._final_contributions = list(self.plane.contributions(self.round_id))
            if self.status != "complete":
                self.results.discard()
        self.plane.close_round(self.round_id)

    @property
    def contributed(self) -> dict[str, int]:
        """Slices each participant has had folded in (participants with none left out)."""
        counts = self._final_contributions
        if counts is None:
            require(self.plane, "the round's data plane is closed")
            try:
                counts = list(self.plane.contributions(self.round_id))
            except ValueError:  # closed meanwhile
                counts = self._final_contributions or []
        return {party: n for party, n in zip(self.header.participants, counts, strict=False) if n}

    def settle(self, completed: list[tuple[int, bytes]]) -> tuple[list[tuple[int, bytes]], bool]:
        """Completed slices as delivered (a robust rule's estimates), booked; and whether the share is done."""
        if self.robust is not None:
            completed = self.robust.take(completed)
        return completed, self.record(completed)

    def record(self, completed: list[tuple[int, bytes]]) -> bool:
        """Book completed indices; True when the share of the round just completed."""
        with self.lock:
            for index, payload in completed:
                self.results.add(index, payload)
            if self.status == "open" and len(self.done) == len(self.owned):
                self.status = "complete"
                return True
            return False

    def missing(self) -> list[str]:
        """Participants that have not sent every slice of the share yet."""
        need = len(self.owned)
        contributed = self.contributed
        return [p for p in self.header.participants if contributed.get(p, 0) < need]
