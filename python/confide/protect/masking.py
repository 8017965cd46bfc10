"""Fixed-point encoding in Z_{2^32} and the two masking modes: ``secagg`` and ``groupmask``.

Encoding (algorithms.md §4.3, item 3): values are clipped to a bound ``B``, then
``x~ = round(x * 2^f) mod 2^32`` with the largest ``f`` such that ``m * (B * 2^f + 1/2) < 2^31``;
the sum of ``m`` encodings read as a signed 32-bit integer, divided by ``2^f``, is the sum of
the clipped inputs to within ``m / 2^(f+1)``. ``B`` is public (``mask_bound``, 8.0 by default,
as Flower's clipping range: with 4 parties f = 26, a resolution of 1.5e-8) so a round needs no
message before its slices; the number of clipped values is reported per round. With
``mask_bound = None`` the parties instead agree on B = the largest magnitude any of them sends
(one relayed message per round, nothing clipped).

``secagg``: pairwise masks. With ``K_uv`` from :class:`PeerKeys` (purpose "mask") and a
per-attempt key ``K_uv,t,a``, party u sends ``x~_u + sum_{v != u} sgn(u - v) * PRG(K_uv,t,a, slice)``;
the masks cancel in the sum, so the aggregator learns the sum and nothing else. A dropout
aborts the attempt; the survivors retry under a new attempt number, so masks are never reused
with another participant set. With ``on_dropout: recover`` (:mod:`confide.protect.recovery`) a
party that sent nothing is excluded instead and the survivors remove its masks (Bonawitz et al.
with SecAgg+'s neighbour graph: self masks, Shamir shares); the aggregator then learns not even
the sum.

``groupmask``: one-time pads from a PRF under the group key ``G`` (distributed by the leader
like the Paillier key). With ``a_i = PRF(G, t, a, slice, i)`` and ``R = PRF(G, t, a, slice, "sum")``,
party i sends ``x~_i + a_i - a_{i+1 mod m}`` (+ ``R`` for i = 0): the pads of the m parties are
jointly uniform (``R`` is), so the aggregator learns nothing, not even the sum; the parties
subtract ``R`` from the combined slice. Each party computes three keystreams per slice,
whatever ``m``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from confide._checks import require
from confide.crypto.fixedpoint import FixedPoint
from confide.errors import ProtocolError
from confide.protect.base import SETUP_ROUND, Protection, RoundContext, chunks
from confide.protect.keys import GroupCipher, PeerKeys, decode_fields, encode_fields, prg_words, round_key
from confide.protect.recovery import RoundRecovery, default_threshold, neighbour_graph
from confide.v1 import runtime_pb2 as pb

__all__ = ["FixedPoint", "GroupMask", "GroupShared", "SecAgg", "distribute_group_secrets"]


class _Masking(Protection):
    kind = pb.AGGREGATION_KIND_UINT32_SUM
    verify_arithmetic = "integer"

    def __init__(self, exchange, params) -> None:
        super().__init__(exchange, params)
        self._fixed: FixedPoint | None = None

    def begin_round(self, context: RoundContext, vector: np.ndarray) -> None:
        """Fix the bound: the public ``mask_bound``, or the largest magnitude any participant sends."""
        if self.params.mask_bound is not None:
            bound = self.params.mask_bound
        else:
            local = max((float(np.max(np.abs(part))) for part in chunks(vector)), default=0.0)
            values = self.exchange_values(context.round, context.tag("bound"), [local], context.peers)
            bound = max(float(v[0]) for v in values.values())
        self._fixed = FixedPoint(bound, len(context.participants), self._ring_bits(len(context.participants)))
        context.stats["fraction_bits"] = self._fixed.fraction_bits
        bound = self._fixed.bound
        context.stats["clipped"] = sum(int(np.count_nonzero(np.abs(part) > bound)) for part in chunks(vector))

    def _ring_bits(self, parties: int) -> int:
        """Bits of the ring the fixed point sums in: 32 (uint32 words, wrapping)."""
        return 32

    def _encode_words(self, values: np.ndarray) -> np.ndarray:
        require(self._fixed, "begin_round first")
        return self._fixed.encode(values)

    def _decode_words(self, words: np.ndarray) -> np.ndarray:
        require(self._fixed, "begin_round first")
        return self._fixed.decode(words)

    @property
    def verify_bits(self) -> int:
        """The ring the fixed point sums in: its words are residues mod 2^verify_bits."""
        require(self._fixed, "begin_round first")
        return self._fixed.bits

    @property
    def verify_fixed(self) -> tuple[float, float, int]:
        """(scale, bound, bits) of the fixed point: the verifier encodes the party's values natively with it."""
        require(self._fixed, "begin_round first")
        return self._fixed.scale, self._fixed.bound, self._fixed.bits

    def verify_image(self, context: RoundContext, index: int, values: np.ndarray) -> np.ndarray:
        """The fixed-point words this party adds to slice ``index`` (before any mask)."""
        return self._encode_words(values)


class SecAgg(_Masking):
    """Pairwise X25519 + ChaCha20 masks; the aggregator learns only the sum."""

    mode = "secagg"
    aggregator_sees = "the sum of the participants' updates (each update is hidden by pairwise masks)"

    def __init__(self, exchange, params) -> None:
        super().__init__(exchange, params)
        self.keys = PeerKeys(exchange.identity, exchange.job_id)
        self._round_keys: dict[str, tuple[int, bytes]] = {}
        self._recovery: RoundRecovery | None = None

    def setup(self, participants: list[str]) -> None:
        """Announce and verify X25519 keys with every peer."""
        peers = [p for p in participants if p != self.exchange.party_id]
        announce_and_verify(self.exchange, self.keys, peers, self.params.setup_timeout_s)

    def share(self, round_number, tag, payload, peers) -> None:
        """Sealed pairwise: the aggregator reads none of it."""
        for peer in peers:
            self.exchange.send(round_number, tag, self.keys.seal_to(peer, tag, payload), [peer])

    def collect(self, round_number, tag, peer, timeout=None) -> bytes:
        """Open what ``peer`` sealed for us."""
        return self.keys.open_from(peer, tag, self.exchange.recv(round_number, tag, peer, timeout=timeout))

    def report(self) -> dict:
        """Mode; with recovery the parties remove the self masks, so the aggregator learns not even the sum."""
        out = super().report()
        if self.params.recover:
            out["aggregator_sees"] = "nothing: pairwise and self masks (the parties remove the self masks of the sum)"
            out["dropout_recovery"] = "self masks + Shamir shares over the SecAgg+ neighbour graph"
        return out

    def begin_round(self, context: RoundContext, vector: np.ndarray) -> None:
        """Agree on the bound and derive this attempt's pairwise mask keys (with recovery: share them)."""
        super().begin_round(context, vector)
        me = context.position
        self._round_keys = {}
        graph = None
        if self.params.recover:
            graph = neighbour_graph(
                self.exchange.job_id, context.participants, context.round, context.attempt, self.params.neighbours
            )
        for position, peer in enumerate(context.participants):
            if peer == context.party_id or (graph is not None and peer not in graph[context.party_id]):
                continue
            key = round_key(self.keys.pair_key(peer, b"mask"), b"secagg-mask", context.round, context.attempt)
            self._round_keys[peer] = (1 if me > position else -1, key)
        self._recovery = None
        if graph is not None:
            degree = len(graph[context.party_id])
            threshold = self.params.recovery_threshold or default_threshold(degree)
            if not default_threshold(degree) <= threshold <= max(1, degree):
                # Below a majority of the neighbours, two disjoint groups of holders could each rebuild a secret.
                raise ProtocolError(
                    f"protection.recovery_threshold {threshold} must be in [{default_threshold(degree)}, {degree}]: "
                    f"more than half of each party's {degree} neighbours, at most all of them"
                )
            self._recovery = RoundRecovery(
                party_id=context.party_id,
                participants=list(context.participants),
                graph=graph,
                pair_keys=dict(self._round_keys),
                threshold=threshold,
                tag=context.tag,
                send=lambda tag, payload, peer: self.share(context.round, tag, payload, [peer]),
                collect=lambda tag, peer, timeout: self.collect(context.round, tag, peer, timeout),
                timeout_s=self.params.recovery_timeout_s,
                min_parties=self.params.min_parties,
                stats=context.stats,
            )
            context.stats.update(neighbours=degree, recovery_threshold=threshold)
            self._recovery.share_secrets()  # before any slice leaves: the upload waits for this call

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """x~ (+ the self mask, with recovery) + sum of signed pairwise masks, mod 2^32."""
        words = self._encode_words(values)
        if self._recovery is not None:
            np.add(words, self._recovery.self_words(index, words.size), out=words)
        for sign, key in self._round_keys.values():
            mask = prg_words(key, index, words.size)
            if sign > 0:
                np.add(words, mask, out=words)
            else:
                np.subtract(words, mask, out=words)
        return words.tobytes()

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """The pairwise masks cancelled at the aggregator (with recovery: remove what is left); decode the sum."""
        out = context.output()
        unmask: list[tuple[int, bytes]] = []
        if self._recovery is not None:
            first = result(0)  # no slice completes before the aggregator has settled who is excluded
            unmask = self._recovery.unmask_keys(context.excluded() if context.excluded is not None else [])
        for index in range(context.num_slices):
            start, stop = context.bounds(index)
            payload = first.payload if unmask and index == 0 else result(index).payload
            words = np.frombuffer(payload, dtype="<u4")
            if unmask:
                words = words.copy()
                for sign, key in unmask:
                    mask = prg_words(key, index, words.size)
                    if sign > 0:
                        np.subtract(words, mask, out=words)
                    else:
                        np.add(words, mask, out=words)
            self.verified(index, payload, words)
            out[start:stop] = self._decode_words(words)
        return out


class GroupShared:
    """``share``/``collect`` under the group key every participant holds (groupmask, paillier)."""

    _group: GroupCipher | None = None

    def share(self, round_number, tag, payload, peers) -> None:
        """One upload under the group key."""
        require(self._group, "setup first")
        self.exchange.send(round_number, tag, self._group.seal(tag, self.exchange.party_id, payload), list(peers))

    def collect(self, round_number, tag, peer, timeout=None) -> bytes:
        """Open a group message from ``peer``."""
        require(self._group, "setup first")
        return self._group.open(tag, peer, self.exchange.recv(round_number, tag, peer, timeout=timeout))


class GroupMask(GroupShared, _Masking):
    """One-time pads under a group key; the aggregator learns nothing."""

    mode = "groupmask"
    aggregator_sees = "nothing: one-time-padded words whose sum is padded too"

    def __init__(self, exchange, params) -> None:
        super().__init__(exchange, params)
        self.keys = PeerKeys(exchange.identity, exchange.job_id)
        self._group: GroupCipher | None = None
        self._group_key = b""
        self._pads: tuple[bytes, bytes, bytes, bool] | None = None

    def setup(self, participants: list[str]) -> None:
        """Announce keys; the leader hands every party the group key, sealed pairwise."""
        self.adopt_secrets(
            distribute_group_secrets(self.exchange, self.keys, participants, {}, self.params.setup_timeout_s)
        )

    def adopt_secrets(self, secrets: dict[str, bytes]) -> None:
        """The group key the pads derive from."""
        self._group_key = secrets["group_key"]
        self._group = GroupCipher(self._group_key, self.exchange.job_id)
        super().adopt_secrets(secrets)

    def begin_round(self, context: RoundContext, vector: np.ndarray) -> None:
        """Agree on the bound; derive this attempt's pad keys."""
        super().begin_round(context, vector)
        m = len(context.participants)
        base = round_key(self._group_key, b"groupmask-pad", context.round, context.attempt)
        me, following = context.position, (context.position + 1) % m
        mine = round_key(base, b"pad", me, 0)
        nxt = round_key(base, b"pad", following, 0)
        total = round_key(base, b"sum", 0, 0)
        self._pads = (mine, nxt, total, me == 0)

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """x~ + a_i - a_{i+1} (+ R for the first participant), mod 2^32."""
        require(self._pads, "begin_round first")
        mine, nxt, total, first = self._pads
        words = self._encode_words(values)
        np.add(words, prg_words(mine, index, words.size), out=words)
        np.subtract(words, prg_words(nxt, index, words.size), out=words)
        if first:
            np.add(words, prg_words(total, index, words.size), out=words)
        return words.tobytes()

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """Remove R from each combined slice and decode."""
        require(self._pads, "begin_round first")
        total = self._pads[2]
        out = context.output()
        for index in range(context.num_slices):
            start, stop = context.bounds(index)
            payload = result(index).payload
            words = np.frombuffer(payload, dtype="<u4") - prg_words(total, index, stop - start)
            self.verified(index, payload, words)
            out[start:stop] = self._decode_words(words)
        return out

    def report(self) -> dict:
        """Mode, and that the pads hide even the sum."""
        return {**super().report(), "group_key_holders": "participants only (sealed pairwise by the leader)"}


def announce_and_verify(exchange, keys: PeerKeys, peers: Sequence[str], timeout: float) -> None:
    """Send our signed X25519 announcement to ``peers`` and verify theirs."""
    exchange.send(SETUP_ROUND, "keys/announce", keys.announcement(), list(peers))
    for peer in peers:
        keys.accept(peer, exchange.recv(SETUP_ROUND, "keys/announce", peer, timeout=timeout))


def distribute_group_secrets(
    exchange, keys: PeerKeys, participants: list[str], extra: dict[str, bytes], timeout: float
) -> dict[str, bytes]:
    """The leader (first participant) makes a group key and seals it, with ``extra``, to each party.

    Returns the secrets every participant now holds: ``group_key`` plus the leader's ``extra``
    (the Paillier secret key in ``paillier`` mode). Nothing passes the relay unsealed.
    """
    me = exchange.party_id
    peers = [p for p in participants if p != me]
    announce_and_verify(exchange, keys, peers, timeout)
    leader = participants[0]
    if me == leader:
        secrets = {"group_key": os.urandom(32), **extra}
        message = encode_fields(**secrets)
        for peer in peers:
            exchange.send(SETUP_ROUND, "keys/group", keys.seal_to(peer, "keys/group", message), [peer])
        return secrets
    sealed = exchange.recv(SETUP_ROUND, "keys/group", leader, timeout=timeout)
    fields = decode_fields(keys.open_from(leader, "keys/group", sealed), "group_key")
    if not isinstance(fields["group_key"], bytes) or len(fields["group_key"]) != 32:
        raise ProtocolError(f"group key from leader {leader!r} must be 32 bytes")
    return fields
