"""Verifiable aggregation: every party checks every combined slice against the parties' linear tags.

The aggregator (or one node of a cluster) could drop an update, replay an old one, swap slices
or add anything to a sum, and each mode would decode the result faithfully. This module lets the
parties refuse such a round. It is the linear-tag check of VerifyNet/VeriFL, made
non-interactive with a challenge that is fixed only after the aggregator has committed
(docs/crypto.md, "Verifiable aggregation"):

1. **Commitment.** The combined slice ``s`` as delivered (its payload bytes ``P_s``) is the
   aggregator's commitment. Each party hashes it: ``d_s = SHA-256(domain | job | round | attempt |
   s | P_s)``. Whatever the aggregator delivers, it chose before any challenge existed.
2. **Challenge.** ``r_{s,k}`` = the AES-128-CTR keystream under the first 16 bytes of ``d_s`` from
   counter block ``k * 2^64``, for k < :data:`VECTORS` (``confide_codec::tags``): public, but a
   function of the commitment, so changing the sum changes the challenge (Fiat-Shamir).
3. **Tags.** Each party computes ``t_{i,s,k} = <r_{s,k}, q_{i,s}>`` over the exact image ``q`` of
   what it contributed (the mode's integers mod ``p = 2^31 - 1``; the float32 values it sent in
   ``plain`` and ``tee``), masks it with pairwise pads that cancel over the included parties
   (``K_ij`` from the mode's X25519 pair keys, purpose ``verify``), and sends the masked tags and
   its ``d_s`` to every peer through the relay.
4. **Check.** Each party sums the included parties' masked tags (the pads cancel) and checks
   ``sum_i t_{i,s,k} == <r_{s,k}, S_s>`` for the sum image ``S_s`` it decoded; and that every
   peer hashed the same ``P_s``. Integer modes check exactly; float modes within the float32
   rounding bound ``m * 2^-24 * sum_i <|r|, |x_i|>`` (each party also sends its padded
   ``<|r|, |x_i|>``).

A wrong sum passes with probability ``p^-VECTORS`` (2^-62) per try of the aggregator, who must
redo a commitment (hash) and an inner product over the slice for each try; a dropped update
leaves pads that do not cancel; a replayed update or result is under another (round, attempt),
so its tags and pads are another round's; a swapped slice hashes to another challenge; serving
different results to different parties shows as different ``d_s``. A party that learns nothing
of its peers' updates in its mode learns nothing more here: a peer's tag reaches it padded (in
``plain``, whose peers hold no pair keys, the tags travel unpadded: one public random projection
of each slice of an update the aggregator sees whole anyway).

What it does not cover: a party colluding with the aggregator can add anything to the sum, as it
could by adding it to its own update (bounded updates are the defence there).
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from confide import _native
from confide.errors import ProtocolError
from confide.protect.base import awaited
from confide.protect.keys import prg_words, round_key

__all__ = [
    "PRIME",
    "VECTORS",
    "VerificationError",
    "Verifier",
    "describe",
    "integer_tags",
    "pack_tags",
    "unpack_tags",
]

#: Tags of integer modes live in Z_p.
PRIME = (1 << 31) - 1
#: Challenge vectors per slice: a wrong sum passes with probability PRIME ** -VECTORS.
VECTORS = 2
#: Float tags travel as fixed point with this many fraction bits, mod 2^64.
FLOAT_FRACTION_BITS = 24
#: float32's unit roundoff: each of the m - 1 additions of a float32 sum (and its final rounding).
FLOAT32_UNIT = 2.0**-24
_RING64 = 1 << 64
_DOMAIN = b"confide-verify-v1"
_MAGIC = b"CVT1"


class VerificationError(ProtocolError):
    """A combined slice failed its check: the round is refused.

    ``slices``: the slice indices that failed; ``kind``: ``sum`` (tags do not match the sum),
    ``equivocation`` (peers were served different slices) or ``message`` (a peer's tags are missing
    or malformed).
    """

    def __init__(self, message: str, *, slices: Sequence[int] = (), kind: str = "sum", round_number: int = 0) -> None:
        super().__init__(message)
        self.slices = list(slices)
        self.kind = kind
        self.round = round_number

    def served_by(self, node_of: Callable[[int], str]) -> VerificationError:
        """The same failure, naming the node(s) that served its slices (for errors raised while decoding)."""
        nodes = sorted({node_of(index) for index in self.slices})
        if not nodes or any(node in str(self) for node in nodes):
            return self
        return VerificationError(
            f"{self} (served by {', '.join(nodes)})", slices=self.slices, kind=self.kind, round_number=self.round
        )


def challenge_key(digest: bytes) -> bytes:
    """The AES-128 key of a slice's challenge vectors: the first 16 bytes of its commitment hash."""
    return digest[:16]


def integer_tags(words: np.ndarray, bits: int, digest: bytes) -> list[int]:
    """``<r_k, q> mod PRIME`` for each challenge vector; ``words`` hold residues mod ``2^bits`` (signed values)."""
    words = np.ascontiguousarray(words, dtype=np.uint32)
    return list(_native.verify_integer_tags(words, bits, challenge_key(digest), VECTORS))


@dataclass
class _Slice:
    digest: bytes
    sums: list  # <r_k, S>: ints mod PRIME, or floats
    tags: list  # this party's own <r_k, q>
    weights: list = field(default_factory=list)  # float modes: <|r_k|, |q|>


class Verifier:
    """One party's side of the check, for one protection mode.

    The party's round loop calls :meth:`begin` with the attempt and its contribution, the mode's
    ``finish_round`` calls :meth:`observe` for each combined slice it decodes, and the loop calls
    :meth:`settle` once the aggregate is complete (it exchanges the tags and raises
    :class:`VerificationError` on a mismatch).
    """

    def __init__(self, protection, *, timeout_s: float = 30.0) -> None:
        self.protection = protection
        self.exchange = protection.exchange
        self.timeout_s = timeout_s
        #: "integer" (exact, mod PRIME) or "float" (within float32 rounding).
        self.arithmetic = protection.verify_arithmetic
        self._context = None
        self._vector = None
        self._slices: dict[int, _Slice] = {}
        # The per-slice checks run here, off the decode loop, while the next slice is awaited.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="confide-verify")
        self._pending: list[Future] = []
        #: What verification adds to the round's critical path: from :meth:`settle` (waiting for the
        #: slice checks still running, the tag message, the peers' tags, the check) and any check
        #: made in the decode loop itself (``observe_digest``).
        self.seconds = 0.0
        #: Work: the per-slice checks (commitment hash, the sum's and this party's inner products;
        #: mostly off the critical path, on the worker) and the tag message (pads) ...
        self.tag_seconds = 0.0
        #: ... and the check once the peers' tags are in (added, compared); waiting for them is neither.
        self.check_seconds = 0.0

    # -- during the round ---------------------------------------------------------------------
    def begin(self, context, vector: np.ndarray) -> None:
        """A new attempt: ``vector`` is this party's contribution (what it encodes)."""
        self._context, self._vector, self._slices, self._pending = context, vector, {}, []
        self.seconds = self.tag_seconds = self.check_seconds = 0.0

    def observe(self, index: int, payload: bytes, total: np.ndarray) -> None:
        """Combined slice ``index`` as delivered (``payload``) and the sum image the mode decoded from it.

        One native call per slice hashes the payload, draws the challenge and takes the inner
        products of the sum and of this party's own image (a fixed-point mode's encoding is
        recomputed inside it from the party's values, never held). It runs on the verifier's
        worker thread (the GIL released), so the round's decode loop goes on to await the next
        slice; :meth:`settle` waits for every check and raises what one raised.
        """
        context = self._context
        if context is None:
            return
        self._pending.append(
            self._worker.submit(self._observe, context, self._slices, self._vector, index, payload, total)
        )

    def checked(self) -> None:
        """Wait for the slice checks submitted so far; raise what one of them raised."""
        pending, self._pending = self._pending, []
        for check in pending:
            check.result()

    def _observe(self, context, slices: dict, vector: np.ndarray, index: int, payload: bytes, total) -> None:
        began = time.perf_counter()
        prefix = self._prefix(context, index, len(payload))
        start, stop = context.bounds(index)
        values = np.ascontiguousarray(vector[start:stop])
        weights: list = []
        if self.arithmetic == "integer":
            words = np.ascontiguousarray(total, dtype=np.uint32)
            fixed = getattr(self.protection, "verify_fixed", None)
            if fixed is not None:
                if values.dtype not in (np.float32, np.float64):
                    values = values.astype(np.float64)
                digest, sums, tags = _native.verify_check_fixed(prefix, payload, words, values, *fixed, VECTORS)
            else:
                digest = hashlib.sha256(prefix + payload).digest()
                bits = self.protection.verify_bits
                image = self.protection.verify_image(context, index, values)
                sums, tags = integer_tags(words, bits, digest), integer_tags(image, bits, digest)
        else:
            image = np.ascontiguousarray(self.protection.verify_image(context, index, values), dtype=np.float32)
            sums_f32 = np.ascontiguousarray(total, dtype=np.float32)
            digest, sums, tags, weights = _native.verify_check_float(prefix, payload, sums_f32, image, VECTORS)
        slices[index] = _Slice(bytes(digest), list(sums), list(tags), list(weights))
        if slices is self._slices:  # not a check of an attempt given up on
            self.tag_seconds += time.perf_counter() - began

    def observe_digest(self, index: int, digest: bytes, total: np.ndarray) -> None:
        """Combined slice ``index`` as another party received it (its commitment hash) and its decoded sum.

        For a mode whose slices go to one party each (``paillier``: slice i to participant i mod
        m, who decrypts it and shares the sum): the challenge comes from the hash that party sends.
        """
        context = self._context
        if context is None:
            return
        began = time.perf_counter()
        start, stop = context.bounds(index)
        image = self.protection.verify_image(context, index, np.ascontiguousarray(self._vector[start:stop]))
        bits = self.protection.verify_bits
        sums = integer_tags(np.ascontiguousarray(total, dtype=np.uint32), bits, digest)
        tags = integer_tags(np.ascontiguousarray(image, dtype=np.uint32), bits, digest)
        self._slices[index] = _Slice(bytes(digest), sums, tags, [])
        elapsed = time.perf_counter() - began
        self.tag_seconds += elapsed
        self.seconds += elapsed

    def _prefix(self, context, index: int, length: int) -> bytes:
        job = self.exchange.job_id.encode()
        return (
            _DOMAIN
            + struct.pack("<I", len(job))
            + job
            + struct.pack("<IIII", context.round, context.attempt, index, length)
        )

    def commitment(self, context, index: int, payload: bytes) -> bytes:
        """The hash of a delivered combined slice, bound to the job, round, attempt and slice index."""
        return hashlib.sha256(self._prefix(context, index, len(payload)) + payload).digest()

    # -- after the round ----------------------------------------------------------------------
    def settle(self, included: Sequence[str], node_of: Callable[[int], str] = lambda _: "the aggregator") -> dict:
        """Exchange tags with the ``included`` parties and check every slice; returns the round's figures.

        Raises :class:`VerificationError` naming the slice and the node that served it, or
        :class:`RoundAbortedError` when an included peer sent no tags within the timeout (it left
        after the sum: the survivors retry without it).
        """
        context = self._context
        began = time.perf_counter()
        self.checked()
        joined = time.perf_counter() - began
        self._vector = None  # every image is taken: the contribution is not kept alive past the round
        missing = [i for i in range(context.num_slices) if i not in self._slices]
        if missing:
            raise VerificationError(
                f"round {context.round}: combined slices {missing[:5]} were never checked",
                slices=missing,
                round_number=context.round,
            )
        me = self.exchange.party_id
        peers = [p for p in included if p != me]
        tag = f"verify/{context.attempt}"
        message, totals = self._message(context, peers)
        composed = time.perf_counter() - began - joined
        self.tag_seconds += composed
        self.exchange.send(context.round, tag, message, peers)
        waited = 0.0
        for peer in peers:
            asked = time.perf_counter()
            data = awaited(
                lambda peer=peer: self.exchange.recv(context.round, tag, peer, timeout=self.timeout_s),
                peer,
                included,
                f"round {context.round} attempt {context.attempt}: {peer!r} sent no verification tags within "
                f"{self.timeout_s:g} s after the sum; the sum cannot be checked without them",
            )
            waited += time.perf_counter() - asked
            self._absorb(context, peer, data, totals, node_of)
        self._check(context, totals, node_of)
        settled = time.perf_counter() - began
        self.seconds += settled
        self.check_seconds = settled - joined - composed - waited
        return {
            "verified_slices": context.num_slices,
            "verify_arithmetic": self.arithmetic,
            "verify_s": round(self.seconds, 6),
            "verify_tag_s": round(self.tag_seconds, 6),
            "verify_check_s": round(self.check_seconds, 6),
            "verify_wait_s": round(waited, 6),
            "verify_join_s": round(joined, 6),
        }

    def _pads(self, context, peers: Sequence[str]) -> np.ndarray:
        """Pads of this party (one per slice, vector and field) that cancel over the included parties.

        Integer fields: int64 values in [0, PRIME); float fields: uint64 words (arithmetic mod 2^64).
        """
        count = context.num_slices * self._width
        keys = getattr(self.protection, "keys", None)
        if self.arithmetic == "integer":
            total = np.zeros(count, dtype=np.int64)  # 200 peers' pads below 2^31 stay below 2^39
        else:
            total = np.zeros(count, dtype=np.uint64)
        if keys is None:
            return total  # plain: no pair keys (see the module docs)
        me = self.exchange.party_id
        for peer in peers:
            key = round_key(keys.pair_key(peer, b"verify"), b"verify-pad", context.round, context.attempt)
            pad = prg_words(key, 0, 2 * count).view("<u8")
            if self.arithmetic == "integer":
                pad = (pad % np.uint64(PRIME)).astype(np.int64)
            if me < peer:
                np.add(total, pad, out=total)
            else:
                np.subtract(total, pad, out=total)  # uint64 wraps: arithmetic mod 2^64
        if self.arithmetic == "integer":
            total %= PRIME
        return total

    @property
    def _width(self) -> int:
        """Fields per slice: the tags, and in float modes their weights."""
        return VECTORS * (2 if self.arithmetic == "float" else 1)

    @property
    def _modulus(self) -> int:
        return PRIME if self.arithmetic == "integer" else _RING64

    def _fields(self, entry: _Slice) -> list[int]:
        """A slice's tag fields as ring elements (mod PRIME, or fixed point mod 2^64)."""
        if self.arithmetic == "integer":
            return list(entry.tags)
        return [_fixed(v) for v in (*entry.tags, *entry.weights)]

    def _message(self, context, peers: Sequence[str]) -> tuple[bytes, list[list[int]]]:
        """The tag message of this party, and its padded fields (where the peers' are summed in)."""
        pads = self._pads(context, peers)
        width, modulus = self._width, self._modulus
        rows, padded = [], []
        for index in range(context.num_slices):
            entry = self._slices[index]
            masked = [(value + int(pads[index * width + k])) % modulus for k, value in enumerate(self._fields(entry))]
            rows.append((entry.digest[:16], masked))
            padded.append(masked)
        return pack_tags(rows, width), padded

    def _absorb(self, context, peer: str, data: bytes, totals: list[list[int]], node_of) -> None:
        width, modulus = self._width, self._modulus
        try:
            rows = unpack_tags(data, context.num_slices, width)
        except VerificationError as error:
            raise VerificationError(
                f"round {context.round}: the verification tags from {peer!r} are malformed: {error}",
                kind="message",
                round_number=context.round,
            ) from None
        differ = []
        for index, (digest, fields) in enumerate(rows):
            if digest != self._slices[index].digest[:16]:
                differ.append(index)
            totals[index] = [(a + b) % modulus for a, b in zip(totals[index], fields, strict=True)]
        if differ:
            nodes = sorted({node_of(i) for i in differ})
            raise VerificationError(
                f"round {context.round}: {', '.join(nodes)} served {self.exchange.party_id!r} and {peer!r} different "
                f"combined slices {differ[:8]} (equivocation); the round is refused",
                slices=differ,
                kind="equivocation",
                round_number=context.round,
            )

    def _check(self, context, totals: list[list[int]], node_of) -> None:
        wrong = []
        parties = len(context.participants)
        for index, fields in enumerate(totals):
            entry = self._slices[index]
            if self.arithmetic == "integer":
                if list(fields) != [s % PRIME for s in entry.sums]:
                    wrong.append(index)
                continue
            tags = [_signed_fixed(v) for v in fields[:VECTORS]]
            weights = [_signed_fixed(v) for v in fields[VECTORS:]]
            start, stop = context.bounds(index)
            for k in range(VECTORS):
                bound = (parties * FLOAT32_UNIT + (stop - start) * 2.0**-50) * abs(weights[k]) * 1.0001
                bound += parties * 2.0**-FLOAT_FRACTION_BITS
                if not abs(entry.sums[k] - tags[k]) <= bound:
                    wrong.append(index)
                    break
        if wrong:
            nodes = sorted({node_of(i) for i in wrong})
            raise VerificationError(
                f"round {context.round} attempt {context.attempt}: combined slices {wrong[:8]} served by "
                f"{', '.join(nodes)} are not the sum of the parties' updates (their tags do not match: an update "
                "dropped, replayed or altered, or the sum changed); the round is refused",
                slices=wrong,
                round_number=context.round,
            )


def pack_tags(rows: Sequence[tuple[bytes, Sequence[int]]], width: int) -> bytes:
    """A tag message: magic, slice count, fields a slice, then each slice's 16-byte digest and fields (u64)."""
    out = [_MAGIC, struct.pack("<II", len(rows), width)]
    for digest, fields in rows:
        out.append(digest[:16])
        out.append(struct.pack(f"<{width}Q", *fields))
    return b"".join(out)


def unpack_tags(data: bytes, num_slices: int, width: int) -> list[tuple[bytes, tuple[int, ...]]]:
    """Inverse of :func:`pack_tags` for a message of ``num_slices`` slices of ``width`` fields.

    Anything else (another length, magic, count or width) is a :class:`VerificationError` of kind
    ``message`` that says what was expected.
    """
    expected = 12 + num_slices * (16 + 8 * width)
    if len(data) != expected:
        raise VerificationError(
            f"{len(data)} bytes, expected {expected} for {num_slices} slices of {width} fields", kind="message"
        )
    if data[:4] != _MAGIC:
        raise VerificationError(f"starts with {bytes(data[:4])!r}, not {_MAGIC!r}", kind="message")
    declared = struct.unpack_from("<II", data, 4)
    if declared != (num_slices, width):
        raise VerificationError(
            f"declares {declared[0]} slices of {declared[1]} fields, expected {num_slices} of {width}", kind="message"
        )
    rows, offset = [], 12
    for _ in range(num_slices):
        rows.append((bytes(data[offset : offset + 16]), struct.unpack_from(f"<{width}Q", data, offset + 16)))
        offset += 16 + 8 * width
    return rows


def describe(protection, requested: str) -> dict:
    """What verification ran, for the job report (never silent about a mode whose sums are trusted)."""
    if protection.verifier is not None:
        return {
            "ran": True,
            "scheme": "linear tags under a challenge fixed by the delivered slice (commit, then challenge)",
            "arithmetic": protection.verify_arithmetic,
            "vectors": VECTORS,
            "forgery_probability": f"2^-{VECTORS * 31} per try",
        }
    if requested == "off":
        return {"ran": False, "reason": "protection.verify is off: the aggregator's sums are trusted"}
    if protection.robust is not None:
        return {
            "ran": False,
            "reason": f"the aggregate is the aggregator's {protection.robust.rule} of the updates, not their sum: "
            "there are no tags to check it against (it is trusted)",
        }
    reason = getattr(protection, "verify_unavailable", "")
    return {
        "ran": False,
        "reason": reason or f"mode {protection.mode} cannot be verified yet: the aggregator's sums are trusted",
    }


def _fixed(value: float) -> int:
    return round(value * 2.0**FLOAT_FRACTION_BITS) % _RING64


def _signed_fixed(value: int) -> float:
    value %= _RING64
    if value >= 1 << 63:
        value -= _RING64
    return value * 2.0**-FLOAT_FRACTION_BITS
