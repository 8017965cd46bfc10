"""Round state: incremental aggregation per (job, round, attempt, slice index).

A round attempt opens with the first party's header, which fixes the participants, the
aggregation kind, the slice geometry and (paillier) the public key; every later header must
agree. Each arriving slice is checked (index, length, key, structure) and folded into the
accumulator of its index at once, whatever the arrival order; a second copy from the same
party is counted and ignored. When every participant has contributed to an index, the
combined slice is emitted and the accumulator freed.

The aggregator combines only what it can without keys: float32 sums (plain), sums mod 2^32
(masked words) and products mod n^2 (Paillier ciphertexts, public key only).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from confide.crypto import EncryptedVector, EncryptionKey, sum_encrypted
from confide.errors import ProtocolError, RoundClosedError
from confide.v1 import runtime_pb2 as pb

__all__ = ["Accumulator", "RoundKey", "RoundState", "expected_length", "make_accumulator"]

RoundKey = tuple[str, int, int]  # (job_id, round, attempt)
_HEADER_FIELDS = ("participants", "kind", "num_slices", "slice_length", "vector_length", "routing", "mode")
MAX_PARTICIPANTS = 1024
MAX_SLICES = 1 << 20
MAX_SLICE_LENGTH = 4 * 1024 * 1024
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_KINDS = (pb.AGGREGATION_KIND_FLOAT32_SUM, pb.AGGREGATION_KIND_UINT32_SUM, pb.AGGREGATION_KIND_PAILLIER_PRODUCT)


def expected_length(header: pb.RoundHeader, index: int) -> int:
    """Values held by slice ``index`` of the round described by ``header``."""
    return int(min(header.slice_length, header.vector_length - index * header.slice_length))


class Accumulator:
    """Combines the payloads of one slice index; kind-specific subclasses below."""

    def check(self, payload: bytes, n_valid: int):
        """Validate a payload of ``n_valid`` values; return the parsed form to :meth:`add`."""
        raise NotImplementedError

    def add(self, parsed) -> None:
        """Fold one parsed payload in."""
        raise NotImplementedError

    def result(self) -> bytes:
        """The combined payload."""
        raise NotImplementedError


class _WordSum(Accumulator):
    dtype: np.dtype

    def __init__(self) -> None:
        self._total: np.ndarray | None = None

    def check(self, payload: bytes, n_valid: int) -> np.ndarray:
        width = self.dtype.itemsize
        if len(payload) != n_valid * width:
            raise ProtocolError(
                f"payload holds {len(payload)} bytes; slice of {n_valid} values needs {n_valid * width} "
                f"({self.dtype.name} words)"
            )
        return np.frombuffer(payload, dtype=self.dtype)

    def add(self, parsed: np.ndarray) -> None:
        if self._total is None:
            self._total = parsed.copy()
        else:
            # uint32 addition wraps: exactly the sum mod 2^32 the masks need.
            np.add(self._total, parsed, out=self._total)

    def result(self) -> bytes:
        assert self._total is not None
        return self._total.tobytes()


class Float32Sum(_WordSum):
    """plain: float32 sum."""

    dtype = np.dtype("<f4")

    def check(self, payload: bytes, n_valid: int) -> np.ndarray:
        values = super().check(payload, n_valid)
        if not np.isfinite(values).all():
            raise ProtocolError(f"payload holds {int((~np.isfinite(values)).sum())} non-finite float32 values")
        return values


class Uint32Sum(_WordSum):
    """secagg / groupmask: masked words summed mod 2^32."""

    dtype = np.dtype("<u4")


class PaillierProduct(Accumulator):
    """paillier: packed ciphertext blocks multiplied mod n^2 under the round's public key."""

    def __init__(self, key: EncryptionKey) -> None:
        self._key = key
        self._total: EncryptedVector | None = None

    def check(self, payload: bytes, n_valid: int) -> EncryptedVector:
        vector = EncryptedVector.from_bytes(payload, self._key)
        if vector.length != n_valid:
            raise ProtocolError(f"ciphertext block packs {vector.length} values; the slice holds {n_valid}")
        if vector.summed != 1:
            raise ProtocolError(f"ciphertext block is already a sum of {vector.summed} vectors")
        return vector

    def add(self, parsed: EncryptedVector) -> None:
        self._total = parsed if self._total is None else sum_encrypted([self._total, parsed], threads=1)

    def result(self) -> bytes:
        assert self._total is not None
        return self._total.to_bytes()


def make_accumulator(header: pb.RoundHeader, key: EncryptionKey | None) -> Accumulator:
    """The accumulator for the round's aggregation kind."""
    if header.kind == pb.AGGREGATION_KIND_FLOAT32_SUM:
        return Float32Sum()
    if header.kind == pb.AGGREGATION_KIND_UINT32_SUM:
        return Uint32Sum()
    if header.kind == pb.AGGREGATION_KIND_PAILLIER_PRODUCT and key is not None:
        return PaillierProduct(key)
    raise ProtocolError(f"header.kind {header.kind} is not an aggregation kind this aggregator runs")


def validate_header(header: pb.RoundHeader) -> EncryptionKey | None:
    """Check one header on its own; returns the paillier public key when there is one."""
    if not _JOB_ID.match(header.job_id):
        raise ProtocolError("header.job_id must be 1..128 characters of [A-Za-z0-9_.-], starting alphanumeric")
    if header.kind not in _KINDS:
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
    if header.kind == pb.AGGREGATION_KIND_PAILLIER_PRODUCT:
        if not header.encryption_key:
            raise ProtocolError("header.encryption_key is required for paillier aggregation")
        return EncryptionKey.from_bytes(header.encryption_key)
    if header.encryption_key:
        raise ProtocolError("header.encryption_key must be empty unless kind is paillier")
    return None


@dataclass
class RoundState:
    """One round attempt at the aggregator."""

    key: RoundKey
    header: pb.RoundHeader
    encryption_key: EncryptionKey | None
    created: float = field(default_factory=time.monotonic)
    partial: dict[int, tuple[Accumulator, set[str]]] = field(default_factory=dict)
    done: dict[int, bytes] = field(default_factory=dict)
    joined: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    contributed: dict[str, int] = field(default_factory=dict)
    broken: dict[str, float] = field(default_factory=dict)
    status: str = "open"
    reason: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def participants(self) -> list[str]:
        """Participants in header order."""
        return list(self.header.participants)

    def check_header(self, header: pb.RoundHeader) -> None:
        """A later party's header must describe the same round."""
        for name in _HEADER_FIELDS:
            mine, theirs = getattr(self.header, name), getattr(header, name)
            if name == "participants":
                mine, theirs = list(mine), list(theirs)
            if mine != theirs:
                raise ProtocolError(
                    f"header.{name} of {header.party_id!r} ({theirs!r}) differs from the round's ({mine!r})"
                )
        if header.encryption_key != self.header.encryption_key:
            raise ProtocolError(f"header.encryption_key of {header.party_id!r} differs from the round's key")

    def accept(self, party: str, message: pb.Slice) -> tuple[bool, bytes | None]:
        """Fold ``message`` in; returns (accepted, combined payload if the index completed)."""
        if self.status == "complete":
            return False, None  # a late copy of a slice that already completed its index
        if self.status != "open":
            raise RoundClosedError(f"round attempt {self.key} is {self.status}")
        if party not in self.header.participants:
            raise ProtocolError(f"{party!r} is not a participant of round attempt {self.key}")
        index = message.index
        if index >= self.header.num_slices:
            raise ProtocolError(f"slice.index {index} is out of range (num_slices {self.header.num_slices})")
        wanted = expected_length(self.header, index)
        if message.n_valid != wanted:
            raise ProtocolError(f"slice.n_valid of slice {index} is {message.n_valid}; it must be {wanted}")
        with self.lock:
            if index in self.done:
                return False, None
            entry = self.partial.get(index)
            if entry is not None and party in entry[1]:
                return False, None
        # Parsing and checking run outside the lock: they are the expensive part for ciphertexts.
        probe = entry[0] if entry is not None else make_accumulator(self.header, self.encryption_key)
        parsed = probe.check(message.payload, wanted)
        with self.lock:
            if index in self.done:
                return False, None
            entry = self.partial.get(index)
            if entry is None:
                entry = (probe, set())
                self.partial[index] = entry
            accumulator, seen = entry
            if party in seen:
                return False, None
            accumulator.add(parsed)
            seen.add(party)
            self.contributed[party] = self.contributed.get(party, 0) + 1
            if len(seen) < len(self.header.participants):
                return True, None
            combined = accumulator.result()
            del self.partial[index]
            self.done[index] = combined
            if len(self.done) == self.header.num_slices:
                self.status = "complete"
            return True, combined

    def missing(self) -> list[str]:
        """Participants that have not sent every slice yet."""
        return [p for p in self.header.participants if self.contributed.get(p, 0) < self.header.num_slices]
