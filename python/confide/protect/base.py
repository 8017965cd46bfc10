"""What every protection mode shares: the session it talks through, the round it protects.

A protection mode is a protocol between parties, with the aggregator as an untrusted relay and
combiner: ``setup`` (once per job: keys), then per round attempt ``begin_round`` (agree on
scales), ``encode`` (one slice at a time, called from the pipeline thread), and
``finish_round`` (turn the combined slices into the float aggregate). Everything leaves a
party through :class:`Exchange`, so the modes run the same over gRPC or in a test harness.
"""

from __future__ import annotations

import struct
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np

from confide.crypto.identity import Identity
from confide.errors import InvalidParameterError, MessageTimeoutError, ProtocolError, RoundAbortedError
from confide.v1 import runtime_pb2 as pb

__all__ = ["Exchange", "Protection", "ProtectionParams", "RoundContext", "SETUP_ROUND", "awaited", "chunks"]

#: Round number of job-level setup messages (training rounds count from 1).
SETUP_ROUND = 0
#: Values a whole-vector statistic looks at once (its temporaries stay a few MB, whatever the model).
CHUNK = 1 << 20


def chunks(vector: np.ndarray, size: int = CHUNK):
    """Consecutive views of ``vector`` of at most ``size`` values."""
    for start in range(0, vector.size, size):
        yield vector[start : start + size]


class Exchange(Protocol):
    """How a party reaches its peers (through the aggregator's relay)."""

    job_id: str
    party_id: str
    identity: Identity

    def send(self, round_number: int, tag: str, payload: bytes, recipients: Sequence[str]) -> None:
        """Send one payload to ``recipients`` (one upload, the relay fans it out)."""

    def recv(self, round_number: int, tag: str, sender: str, *, timeout: float | None = None) -> bytes:
        """The payload ``sender`` sent under (round, tag); interrupted if the round is aborted."""

    def release(self, round_number: int, prefix: str) -> None:
        """Every party is done with the messages of ``round_number`` under tag ``prefix``: free them."""

    def discard_received(self, round_number: int, prefix: str) -> None:
        """Drop this party's own copies of what it received under ``prefix`` in rounds 1..``round_number`` (local)."""


@dataclass(frozen=True)
class ProtectionParams:
    """Mode parameters (from the job specification).

    Parameters
    ----------
    key_bits : int
        Paillier modulus size.
    bits : int
        Paillier: BatchCrypt quantization width r.
    clipping : {"daciq", "max"}
        Paillier: dACIQ threshold from the parties' max/min, or the largest magnitude (no clipping).
    share_timeout_s : float
        Paillier: wait for another party's decrypted part before decrypting it locally.
    setup_timeout_s : float
        How long key set-up waits for every peer.
    mask_bound : float or None
        secagg/groupmask: public clipping bound of the fixed-point encoding; None agrees on the
        largest magnitude every round instead (one more message, nothing clipped).
    threshold : int or None
        threshold: key shares needed to decrypt (t); None takes max(2, (m + 1) // 2).
    keygen : {"distributed", "dealer"}
        threshold: key generation among the parties, or dealt by the leader (who then saw the key).
    recover : bool
        secagg: exclude a participant that sent nothing and remove its masks instead of retrying
        (:mod:`confide.protect.recovery`).
    neighbours : int or None
        secagg with recover: neighbours each party masks with and shares among (None: every other
        party up to 16, else SecAgg+'s 2 * ceil(1.5 * log2 m)).
    recovery_threshold : int or None
        secagg with recover: shares that rebuild a secret (None: a majority of the neighbours).
    recovery_timeout_s : float
        secagg with recover: how long the unmasking waits for survivors that went quiet.
    min_parties : int
        Fewest participants a round may complete with (secagg with recover checks it before revealing).
    wire : {"float32", "float16", "bfloat16", "int8"}
        plain: how values travel to the aggregator (widened to float32 there and summed).
    """

    key_bits: int = 2048
    bits: int = 16
    clipping: str = "daciq"
    share_timeout_s: float = 30.0
    setup_timeout_s: float = 120.0
    mask_bound: float | None = 8.0
    threshold: int | None = None
    keygen: str = "distributed"
    recover: bool = False
    neighbours: int | None = None
    recovery_threshold: int | None = None
    recovery_timeout_s: float = 10.0
    min_parties: int = 2
    wire: str = "float32"


@dataclass
class RoundContext:
    """One round attempt as a party sees it."""

    round: int
    attempt: int
    participants: list[str]
    party_id: str
    vector_length: int
    slice_length: int
    stats: dict = field(default_factory=dict)
    #: (start, stop) of the model's layers in the vector; modes that clip (``paillier``) pick one
    #: threshold per layer. None: the whole vector is one layer.
    layers: list[tuple[int, int]] | None = None
    #: The participants the aggregator excluded as dropouts (``secagg`` with recovery); read once
    #: the first combined slice is in. None: the transport does no exclusion.
    excluded: Callable[[], list[str]] | None = None
    #: A public clipping threshold for this round, set by differential privacy: its noisy values
    #: lie on an integer grid the codec must carry exactly, and data-dependent dACIQ ranges would
    #: leak each party's extremes. Modes that clip (``paillier``, ``threshold``) use it instead of
    #: exchanging ranges; the others ignore it. None: the mode picks its own.
    clipping: float | None = None
    #: The dtype of the vector and of the aggregate ``finish_round`` returns: the model's
    #: (float32, or float64 where a tensor is), so no round holds a wider copy of the model.
    dtype: str = "float64"
    #: Makes the aggregate ``finish_round`` fills, from (length, dtype); None: a numpy array. The
    #: party's round loop gives a file-backed one for a large model (it takes slice assignments
    #: and in-place scaling, all a mode does with it).
    output_factory: Callable[[int, str], np.ndarray] | None = None

    def output(self) -> np.ndarray:
        """An empty aggregate vector in :attr:`dtype`, which ``finish_round`` fills slice by slice."""
        if self.output_factory is not None:
            return self.output_factory(self.vector_length, self.dtype)
        return np.empty(self.vector_length, dtype=self.dtype)

    @property
    def position(self) -> int:
        """Index of this party among the participants."""
        return self.participants.index(self.party_id)

    @property
    def peers(self) -> list[str]:
        """The other participants."""
        return [p for p in self.participants if p != self.party_id]

    @property
    def num_slices(self) -> int:
        """Slices of the vector."""
        return -(-self.vector_length // self.slice_length)

    def bounds(self, index: int) -> tuple[int, int]:
        """(start, stop) of slice ``index``."""
        start = index * self.slice_length
        return start, min(start + self.slice_length, self.vector_length)

    def tag(self, name: str) -> str:
        """A message tag unique to this attempt."""
        return f"{name}/{self.attempt}"


class Protection(ABC):
    """One protection mode as seen by one party."""

    mode: ClassVar[str]
    kind: ClassVar[int]
    routing: ClassVar[int] = pb.RESULT_ROUTING_ALL
    #: What the aggregator can learn, for reports.
    aggregator_sees: ClassVar[str]
    #: Threads one ``encode`` call may use (0: every core; 1 when several slices are encoded at once).
    encode_threads: int = 0
    #: The transport pipeline is on (``transport.pipeline``): a mode that sends in several steps
    #: overlaps its own crypto with them (paillier shares decrypted slices as they are decoded).
    pipeline: bool = False
    #: Whether a restarted party can take its place again: everything it held can be handed back
    #: to it by a peer (not so for a threshold key share, which dies with its process).
    rejoinable: ClassVar[bool] = True
    #: Whether a slice may be encoded again for a re-upload (same values, fresh randomness is
    #: fine): the upload then keeps only its first slices. ``threshold`` decrypts against the
    #: ciphertexts it sent, so it keeps them all.
    reencodable: ClassVar[bool] = True
    #: How the parties check the combined slices (:mod:`confide.protect.verify`): ``integer``
    #: (exactly, over the mode's integer encoding), ``float`` (to float32 rounding), or None where
    #: the mode cannot yet be checked (its report says so).
    verify_arithmetic: ClassVar[str | None] = None
    #: The robust rule the aggregator applies instead of summing (``plain`` with a robust strategy).
    robust: pb.RobustRule | None = None

    def __init__(self, exchange: Exchange, params: ProtectionParams) -> None:
        self.exchange = exchange
        self.params = params
        #: The secrets every participant holds (group key, the shared Paillier key), for a rejoiner.
        self.group_secrets: dict[str, bytes] = {}
        #: Checks every combined slice ``finish_round`` decodes (a :class:`confide.protect.verify.Verifier`).
        self.verifier = None
        #: Proves this party's update within the bound (a :class:`confide.protect.bound.BoundProver`).
        self.bounds = None

    def setup(self, participants: list[str]) -> None:  # noqa: B027 - optional hook
        """Job-level key set-up with the other participants (none by default)."""

    def adopt_secrets(self, secrets: dict[str, bytes]) -> None:
        """Take the group secrets a leader handed out: at set-up, or to a party that rejoins."""
        self.group_secrets = dict(secrets)

    @abstractmethod
    def share(self, round_number: int, tag: str, payload: bytes, peers: Sequence[str]) -> None:
        """Send a payload every peer can read and the aggregator cannot (where the mode allows)."""

    @abstractmethod
    def collect(self, round_number: int, tag: str, peer: str, timeout: float | None = None) -> bytes:
        """Receive what ``peer`` sent with :meth:`share`."""

    def exchange_values(self, round_number: int, tag: str, values: Sequence[float], peers: Sequence[str]) -> dict:
        """Share a few float64 numbers with ``peers``; returns {party: values} including our own."""
        mine = np.asarray(values, dtype="<f8")
        self.share(round_number, tag, mine.tobytes(), peers)
        out = {self.exchange.party_id: mine}
        for peer in peers:
            data = self.collect(round_number, tag, peer)
            if len(data) != mine.nbytes:
                raise ValueError(f"{tag} from {peer!r} holds {len(data)} bytes, expected {mine.nbytes}")
            out[peer] = np.frombuffer(data, dtype="<f8")
        return out

    def prepare_round(self, round_number: int, attempt: int, participants: list[str]) -> None:  # noqa: B027
        """Before local training: start what does not depend on the update (none by default).

        A mode may send key material here so it has arrived when the round needs it; its
        ``begin_round`` must still work, and draw afresh, where the attempt or the participants
        it then gets differ from these.
        """

    def begin_round(self, context: RoundContext, vector: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Agree on whatever the encoding of this attempt needs (none by default)."""

    @abstractmethod
    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """Protect slice ``index`` (thread-safe: runs in the pipeline thread)."""

    def use_robust(self, rule: dict) -> None:
        """Have the aggregator apply a robust rule to every update instead of summing them.

        Only a mode whose aggregator reads every update can (``plain``); the others refuse, naming why.
        """
        raise InvalidParameterError(
            f"strategy.name {rule.get('rule')}: protection mode {self.mode} hides the updates from the aggregator, "
            "which cannot then order, compare or measure them"
        )

    def verify_image(self, context: RoundContext, index: int, values: np.ndarray) -> np.ndarray:
        """The exact image of what ``encode`` contributes for slice ``index`` (for :attr:`verify_arithmetic`).

        Integer modes: uint32 words holding the residues mod ``2^verify_bits`` the combined slice
        sums (signed fixed point); float modes: the float32 values the aggregator widens and sums.
        Deterministic: the verifier recomputes it after the sum.
        """
        raise NotImplementedError(f"mode {self.mode} has no verification image")

    def verified(self, index: int, payload: bytes, total: np.ndarray) -> None:
        """``finish_round`` decoded combined slice ``index`` (delivered as ``payload``) to the sum image ``total``."""
        if self.verifier is not None:
            self.verifier.observe(index, payload, total)
        if self.bounds is not None:
            self.bounds.observe(index, total)

    def header_key(self) -> bytes:
        """Public key material the aggregator needs (paillier only)."""
        return b""

    @abstractmethod
    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """The aggregate (in ``context.dtype``) from the combined slices (``result(i)`` waits for slice i)."""

    def report(self) -> dict:
        """What ran, for the job report."""
        return {"mode": self.mode, "aggregator_sees": self.aggregator_sees}


def pack_parts(parts: dict[int, np.ndarray]) -> bytes:
    """Slices of float32 values with their indices (decrypted shares)."""
    out = [struct.pack("<I", len(parts))]
    for index, values in sorted(parts.items()):
        data = np.ascontiguousarray(values, dtype="<f4").tobytes()
        out.append(struct.pack("<II", index, len(data) // 4))
        out.append(data)
    return b"".join(out)


def unpack_parts(data: bytes) -> dict[int, np.ndarray]:
    """Inverse of :func:`pack_parts`; a malformed message is a :class:`ProtocolError` naming the field."""
    if len(data) < 4:
        raise ProtocolError(f"decrypted-share message: count needs 4 bytes, got {len(data)}")
    (count,) = struct.unpack_from("<I", data, 0)
    offset = 4
    parts = {}
    for number in range(count):
        if offset + 8 > len(data):
            raise ProtocolError(f"decrypted-share message: part {number} of {count} is truncated at offset {offset}")
        index, length = struct.unpack_from("<II", data, offset)
        offset += 8
        if offset + 4 * length > len(data):
            raise ProtocolError(
                f"decrypted-share message: part {number} (slice {index}) declares {length} values, "
                f"only {(len(data) - offset) // 4} follow"
            )
        parts[index] = np.frombuffer(data, dtype="<f4", count=length, offset=offset)
        offset += 4 * length
    if offset != len(data):
        raise ProtocolError(f"decrypted-share message has {len(data) - offset} trailing bytes")
    return parts


def awaited(receive: Callable[[], bytes], peer: str, included: Sequence[str], why: str) -> bytes:
    """``receive()``: a peer's message after the sum; if it times out, the round runs again without ``peer``.

    A peer that sends nothing once the sum is in (verification tags, bound proofs, commitment
    hashes) has left: the survivors cannot check a sum it is part of, so the attempt is aborted
    with ``why`` and retried among the others (:class:`RoundAbortedError`).
    """
    try:
        return receive()
    except MessageTimeoutError:
        raise RoundAbortedError(why, [peer], [p for p in included if p != peer]) from None


def gathered(
    peers: Sequence[str], receive: Callable[[str], bytes], included: Sequence[str], why: Callable[[str], str]
) -> tuple[dict[str, bytes], float]:
    """``receive(peer)`` of each peer in turn, :func:`awaited`: the messages, and the seconds spent waiting."""
    messages: dict[str, bytes] = {}
    waited = 0.0
    for peer in peers:
        asked = time.perf_counter()
        messages[peer] = awaited(lambda peer=peer: receive(peer), peer, included, why(peer))
        waited += time.perf_counter() - asked
    return messages, waited
