"""SecAgg dropout recovery (``secagg`` with ``on_dropout: recover``): self masks, Shamir shares, SecAgg+ graph.

Bonawitz et al. (CCS 2017) with the sparse neighbour graph of SecAgg+ (Bell et al., CCS 2020),
fitted to the cross-silo runtime (algorithms.md §4.1, §4.2). Per round attempt ``(t, a)``, party u:

1. **Shares.** Draws a self-mask seed ``b_u`` (32 bytes from the OS CSPRNG) and, for each neighbour
   ``v`` in ``N(u)``, has its pair key ``K_uv,t,a`` (the per-attempt key of plain ``secagg``). It
   splits ``b_u`` and every ``K_uv,t,a`` t-of-k with :mod:`confide.crypto.shamir` (k = |N(u)|,
   holder x = participant position + 1) and sends each neighbour its shares, sealed under the pair
   channel (the aggregator reads none of them), *before* its first slice leaves.
2. **Masked upload.** ``y_u = x~_u + PRG(b_u) + sum_{v in N(u)} sgn(u - v) PRG(K_uv,t,a)`` mod 2^32.
3. **Exclusion.** A participant that has sent no slice when the aggregator gives up on it (stream
   broke past ``dropout_grace_s``, never joined within ``round_timeout_s``, restarted, revoked) is
   *excluded* rather than aborting the attempt: the aggregator folds zero words in its place
   (the identity of the sum) and tells everyone who is excluded (``RoundControl.KIND_EXCLUDED``).
   A participant that sent only part of its slices cannot be excluded (its words are already in
   the sums and would need both of its secrets to remove): that attempt is aborted and retried,
   as without recovery.
4. **Consistency.** Every survivor sends every other one, sealed, the excluded set it was told;
   a survivor goes on only with matching views from a majority of the participants and none that
   differ (an aggregator that told parties different stories could otherwise collect, through one
   colluding party, both the self mask and the pair keys of one party).
5. **Unmasking.** Each survivor reveals, sealed to the other survivors: its own ``b_u`` and its
   own pair keys with excluded neighbours, and the shares it holds of every surviving
   neighbour's ``b`` and of that neighbour's pair keys with excluded parties. Never a share of an
   excluded party's ``b``, so its words stay hidden even if it did upload. Every survivor then
   rebuilds (directly, or from ``t`` shares where the owner died after uploading) each
   surviving ``b_u`` and each pair key across the cut, and removes their keystreams:

   ``sum = S - sum_{u in U} PRG(b_u) - sum_{u in U, w in D, w in N(u)} sgn(u - w) PRG(K_uw,t,a)``

Who learns what: the aggregator sees only masked words, so it learns neither the updates nor
(unlike plain ``secagg``) their sum: the self masks are removed by the parties. Fewer than ``t``
colluding neighbours of a party hold fewer than ``t`` shares of each of its secrets, which are
uniformly random (nothing beyond the sum). A party that dies after uploading costs the
survivors ``recovery_timeout_s`` of waiting at most; one that dies before uploading costs
nothing beyond the aggregator's own dropout detection.

Cost: one sealed message per neighbour before the upload, two rounds of small sealed messages
after it (views, reveals), and per survivor ``|U| + (pairs across the cut)`` extra ChaCha20
keystreams of the vector's length to remove the masks, against ``k`` for the masks themselves
(ChaCha20 runs at about 1.4 GB/s on this machine kind: 2.8 ms per million words and keystream).
The graph is complete up to 16 participants (plain SecAgg) and a ring over a per-attempt
permutation with degree ``2 * ceil(1.5 * log2 m)`` beyond, as in SecAgg+.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from confide.crypto import shamir
from confide.errors import MessageTimeoutError, ProtocolError, RoundAbortedError
from confide.protect.keys import decode_fields, encode_fields, prg_words

__all__ = ["RoundRecovery", "default_degree", "default_threshold", "neighbour_graph"]

#: Up to this many participants every pair masks (the graph is complete).
COMPLETE_UP_TO = 16


def default_degree(parties: int) -> int:
    """Neighbours per party: every other one up to 16 parties, else an even 2 * ceil(1.5 * log2 m)."""
    if parties <= COMPLETE_UP_TO:
        return parties - 1
    return min(parties - 1, 2 * math.ceil(1.5 * math.log2(parties)))


def default_threshold(degree: int) -> int:
    """Shares needed to rebuild a secret split among ``degree`` neighbours: a majority of them."""
    return degree // 2 + 1


def neighbour_graph(
    job_id: str, participants: Sequence[str], round_number: int, attempt: int, degree: int | None
) -> dict[str, list[str]]:
    """Who masks with whom in one attempt: complete, or a ring of even degree over a keyed permutation.

    Every party computes the same graph from public values; a new attempt (other participants)
    draws a new permutation.
    """
    m = len(participants)
    wanted = default_degree(m) if degree is None else degree
    if wanted >= m - 1:
        return {p: [q for q in participants if q != p] for p in participants}
    half = max(1, -(-wanted // 2))

    def rank(party: str) -> bytes:
        material = f"{job_id}\x00{round_number}\x00{attempt}\x00{party}".encode()
        return hashlib.sha256(b"confide-secagg-graph\x00" + material).digest()

    order = sorted(participants, key=rank)
    graph: dict[str, set[str]] = {p: set() for p in participants}
    for i, party in enumerate(order):
        for step in range(1, half + 1):
            for other in (order[(i + step) % m], order[(i - step) % m]):
                if other != party:
                    graph[party].add(other)
    position = {p: i for i, p in enumerate(participants)}
    return {p: sorted(graph[p], key=position.__getitem__) for p in participants}


@dataclass
class RoundRecovery:
    """One party's recovery state for one round attempt.

    ``send(tag, payload, peer)`` seals to ``peer`` and relays; ``collect(tag, peer, timeout)``
    opens what ``peer`` sealed for us (raising :class:`MessageTimeoutError`).
    """

    party_id: str
    participants: list[str]
    graph: dict[str, list[str]]
    pair_keys: dict[str, tuple[int, bytes]]
    threshold: int
    tag: Callable[[str], str]
    send: Callable[[str, bytes, str], None]
    collect: Callable[[str, str, float], bytes]
    timeout_s: float
    min_parties: int = 2
    self_seed: bytes = field(default_factory=lambda: os.urandom(32))
    stats: dict = field(default_factory=dict)

    def holder(self, party: str) -> int:
        """Shamir x-coordinate of ``party``."""
        return self.participants.index(party) + 1

    def share_secrets(self) -> None:
        """Split ``b`` and every pair key among our neighbours and send each its shares (before the upload)."""
        neighbours = self.graph[self.party_id]
        if not neighbours:
            return
        holders = [self.holder(v) for v in neighbours]
        secrets = {"b": self.self_seed, **{f"k/{peer}": key for peer, (_, key) in self.pair_keys.items()}}
        split = {name: shamir.split(secret, holders, self.threshold) for name, secret in secrets.items()}
        for peer, x in zip(neighbours, holders, strict=True):
            self.send(self.tag("secagg/shares"), encode_fields(**{n: s[x] for n, s in split.items()}), peer)

    def self_words(self, index: int, count: int) -> np.ndarray:
        """Our self mask of slice ``index``."""
        return prg_words(self.self_seed, index, count)

    def unmask_keys(self, excluded: Sequence[str]) -> list[tuple[int, bytes]]:
        """Run consistency and unmasking; (sign, key) of every keystream to subtract from the sum.

        ``sign`` is +1 for a keystream that was added to the sum (a self mask, or the mask of a
        surviving ``u`` with ``sgn(u - w) = +1``), -1 for one that was subtracted.
        """
        excluded = sorted(set(excluded))
        if self.party_id in excluded:
            raise ProtocolError(f"{self.party_id} was excluded from this attempt as a dropout")
        unknown = [p for p in excluded if p not in self.participants]
        if unknown:
            raise ProtocolError(f"the aggregator excluded {unknown}, who are not participants")
        survivors = [p for p in self.participants if p not in excluded]
        peers = [p for p in survivors if p != self.party_id]
        started = time.perf_counter()
        self._check_recoverable(excluded, survivors)
        self._check_views(excluded)
        held = self._held_shares(excluded, survivors)
        mine = {"self/b": self.self_seed}
        for w in self.graph[self.party_id]:
            if w in excluded:
                mine[f"self/k/{w}"] = self.pair_keys[w][1]
        reveal = encode_fields(**mine, **held)
        for peer in peers:
            self.send(self.tag("secagg/reveal"), reveal, peer)
        keys = self._rebuild(excluded, survivors, peers, held)
        self.stats.update(
            excluded=excluded,
            recovery_s=round(time.perf_counter() - started, 6),
            unmask_keystreams=len(keys),
        )
        return keys

    @property
    def confirmations_needed(self) -> int:
        """Participants that must confirm one excluded set before anything is revealed: more than (m + c) / 2.

        With up to c = t - 1 colluding parties, two different sets cannot both be confirmed this
        often (the honest confirmers of each would have to overlap), so an aggregator that tells
        parties different stories cannot get both halves of one party's secrets revealed.
        """
        return (len(self.participants) + self.threshold - 1) // 2 + 1

    # -- steps --------------------------------------------------------------------------------
    def _give_up(self, why: str, excluded: list[str], survivors: list[str]) -> None:
        # Every honest party sees the same set and reaches the same verdict, so they retry together.
        raise RoundAbortedError(
            f"round attempt not recoverable without {', '.join(excluded)}: {why}; nothing was revealed, the "
            "survivors retry under fresh masks",
            list(excluded),
            list(survivors),
        )

    def _check_recoverable(self, excluded: list[str], survivors: list[str]) -> None:
        """Refuse before revealing anything when the sum would expose a survivor or cannot be trusted."""
        if not excluded:
            return
        if len(survivors) < self.min_parties:
            self._give_up(
                f"{len(survivors)} survivors, fewer than min_parties ({self.min_parties})", excluded, survivors
            )
        if len(survivors) < self.confirmations_needed:
            self._give_up(
                f"{len(survivors)} survivors cannot confirm the excluded set ({self.confirmations_needed} of "
                f"{len(self.participants)} must, to tolerate {self.threshold - 1} colluding parties)",
                excluded,
                survivors,
            )
        for u in survivors:
            near = [v for v in self.graph[u] if v in survivors]
            if len(near) < self.threshold:
                # Its mask would then rest on fewer than t surviving neighbours, possibly all colluders.
                self._give_up(
                    f"{u} keeps {len(near)} surviving neighbours, below t = {self.threshold}", excluded, survivors
                )

    def _poll(self, tag: str, peers: list[str], enough: Callable[[dict[str, bytes]], bool]) -> dict[str, bytes]:
        """Collect ``tag`` from ``peers`` round-robin until all arrived, ``enough`` says so, or the timeout."""
        got: dict[str, bytes] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(got) < len(peers) and not enough(got):
            if time.monotonic() > deadline:
                break
            for peer in peers:
                if peer in got:
                    continue
                try:
                    got[peer] = self.collect(tag, peer, 0.05)
                except MessageTimeoutError:
                    continue
        return got

    def _check_views(self, excluded: list[str]) -> None:
        """Exchange the excluded set with every participant (the excluded too) and count the confirmations."""
        others = [p for p in self.participants if p != self.party_id]
        view = encode_fields(excluded=excluded)
        for peer in others:
            self.send(self.tag("secagg/view"), view, peer)
        needed = self.confirmations_needed
        reached: list[float] = []

        def enough(got: dict[str, bytes]) -> bool:
            # Enough confirmations suffice; wait a moment more for the rest, to catch a dissenter.
            if len(got) + 1 < needed:
                return False
            if not reached:
                reached.append(time.monotonic())
            return time.monotonic() - reached[0] > min(1.0, self.timeout_s)

        views = self._poll(self.tag("secagg/view"), others, enough)
        for peer, data in views.items():
            theirs = decode_fields(data, "excluded")["excluded"]
            if theirs != excluded:
                raise ProtocolError(
                    f"{peer} was told that {theirs} were excluded, this party that {excluded}: "
                    "the aggregator gave the parties different views; nothing is revealed"
                )
        if len(views) + 1 < needed:
            self._give_up(
                f"only {len(views) + 1} of {len(self.participants)} participants confirmed the excluded set within "
                f"{self.timeout_s:g} s ({needed} must)",
                excluded,
                [p for p in self.participants if p not in excluded],
            )

    def _held_shares(self, excluded: list[str], survivors: list[str]) -> dict[str, bytes]:
        """The shares we hold that the unmasking needs: surviving neighbours' b and their keys across the cut."""
        wanted = [u for u in self.graph[self.party_id] if u in survivors]
        out: dict[str, bytes] = {}
        deadline = time.monotonic() + self.timeout_s
        for u in wanted:
            try:
                data = self.collect(self.tag("secagg/shares"), u, max(0.0, deadline - time.monotonic()))
            except MessageTimeoutError:
                continue  # u's shares never reached us; others hold enough, or u reveals its own
            shares = decode_fields(data, "b")
            out[f"b/{u}"] = shares["b"]
            for w in self.graph[u]:
                if w in excluded:
                    share = shares.get(f"k/{w}")
                    if not isinstance(share, bytes):
                        raise ProtocolError(f"{u}'s shares lack its pair key with {w}")
                    out[f"k/{u}/{w}"] = share
        return out

    def _rebuild(
        self, excluded: list[str], survivors: list[str], peers: list[str], held: dict[str, bytes]
    ) -> list[tuple[int, bytes]]:
        position = {p: i for i, p in enumerate(self.participants)}
        # secret name -> (owner, direct value or None, {holder x: share})
        wanted: dict[str, tuple[str, bytes | None, dict[int, bytes]]] = {}
        for u in survivors:
            wanted[f"b/{u}"] = (u, self.self_seed if u == self.party_id else None, {})
            for w in self.graph[u]:
                if w in excluded:
                    direct = self.pair_keys[w][1] if u == self.party_id else None
                    wanted[f"k/{u}/{w}"] = (u, direct, {})
        me = self.holder(self.party_id)
        for name, share in held.items():
            if name in wanted:
                wanted[name][2][me] = share

        def absorb(peer: str, fields: dict) -> None:
            x = self.holder(peer)
            for name, value in fields.items():
                if not isinstance(value, bytes):
                    continue
                if name.startswith("self/"):
                    key = f"{name[5:6]}/{peer}" + name[6:]  # "self/b" -> "b/peer", "self/k/w" -> "k/peer/w"
                    if key in wanted and wanted[key][0] == peer:
                        owner, _, shares = wanted[key]
                        wanted[key] = (owner, value, shares)
                elif name in wanted:
                    wanted[name][2][x] = value

        def complete(_: dict[str, bytes]) -> bool:
            return all(direct is not None or len(shares) >= self.threshold for _, direct, shares in wanted.values())

        received: dict[str, bytes] = {}

        def enough(got: dict[str, bytes]) -> bool:
            for peer, data in got.items():
                if peer not in received:
                    received[peer] = data
                    absorb(peer, decode_fields(data))
            return complete(got)

        enough(self._poll(self.tag("secagg/reveal"), peers, enough))
        keys: list[tuple[int, bytes]] = []
        rebuilt = 0
        for name, (owner, direct, shares) in sorted(wanted.items()):
            if direct is None:
                direct = shamir.reconstruct(shares, self.threshold, f"{owner}'s {name.split('/')[0]} secret")
                rebuilt += 1
            if name.startswith("b/"):
                keys.append((1, direct))
            else:
                w = name.split("/")[2]
                keys.append((1 if position[owner] > position[w] else -1, direct))
        self.stats["rebuilt_from_shares"] = rebuilt
        return keys
