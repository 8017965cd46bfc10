"""``lattice``: updates encrypted under fresh RLWE keys; only the parties rebuild the sum of the keys.

Per round attempt (docs/crypto.md, "Lattice aggregation"; :mod:`confide.crypto.lattice`):

1. every participant draws a fresh ternary key ``s_i``, and sends each other participant its
   t-of-m Shamir share of it (over F_65521, two bytes a coefficient), sealed pairwise (X25519 pair
   keys, as ``secagg``): the aggregator relays shares it cannot read. The key does not depend on
   the update, so this happens before local training (:meth:`LatticeProtection.prepare_round`)
   and the shares wait at the peers; an attempt whose participants differ draws afresh;
2. each slice of the update, in the masking modes' fixed point (narrowed to ``bits`` bits so the
   lanes and the summed error fit), is encrypted two values to a coefficient mod the 62-bit prime
   ``q``: ``b = a*s_i + e + 2^d*(x_0 + 2^w*x_1)``, block by block under public polynomials drawn
   in the NTT domain from the attempt's seed (``confide-lattice``'s ``packed``). Eight bytes for two
   values, four a value like float32; the data plane sums the words mod ``q``
   (``AGGREGATION_KIND_RLWE_SUM``), refusing any word outside ``[0, q)``;
3. each participant adds the key shares it received (its share of ``sum s_i``) and sends that
   summed share, sealed, to the other participants (right after local training; with
   ``on_dropout: recover`` once the sum says whom the aggregator excluded); once the summed
   slices arrive it rebuilds ``sum s_i`` from its own and the first ``t - 1`` that arrived, and
   with it each slice of the sum decrypts to the sum of the updates.

The aggregator sees ciphertexts under keys no party holds alone; a single update stays hidden
from any coalition of the aggregator and fewer than ``t`` parties (``t`` of them could rebuild one
party's round key from the shares it sent them). Every attempt has fresh keys and a fresh seed:
a retry after a dropout never reveals two key sums of one attempt.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import struct
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import combinations, islice

import numpy as np

from confide import _native
from confide.errors import InvalidParameterError, MessageTimeoutError, ProtocolError, RoundAbortedError
from confide.protect.base import RoundContext
from confide.protect.masking import SecAgg
from confide.protect.verify import VerificationError
from confide.v1 import runtime_pb2 as pb

__all__ = ["LatticeProtection"]

log = logging.getLogger(__name__)

#: Ring dimension: 128-bit security with a ternary secret at log q = 62 (docs/crypto.md).
RING_DIMENSION = 4096
#: Values in one ciphertext word.
LANES = 2
#: The error's centred binomial parameter (confide-lattice: eta 21, standard deviation 3.24).
ETA = 21


def message_bits(parties: int) -> int:
    """The widest values the packed lanes carry for ``parties`` (24 bits for 3, 21 for 10, 15 for 200).

    Lanes of ``bits + ceil(log2 m)`` bits (a sum never carries into the next lane), and the summed
    error ``m * eta`` at most a quarter of the scale ``2^d``, with ``d + 2 * lane <= 61``.

    The spare bit is the decryption check's: a wrong key sum or sum leaves each word's residue
    uniform mod ``q``, past the parties' bound for at least half of the words, so even a slice of
    62 values is caught but for a chance of ``2^-31``.
    """
    return int(_packing_ring().packed_message_bits(parties))


@functools.lru_cache(maxsize=1)
def _packing_ring() -> _native.LatticeRing:
    return _native.LatticeRing(RING_DIMENSION, 16)


def default_threshold(parties: int) -> int:
    """Summed key shares that rebuild the key sum: a majority, at least 2 (all of 2)."""
    return max(2, (parties + 1) // 2)


def _summed_share(peer: str, data: bytes) -> np.ndarray:
    share = np.frombuffer(data, dtype="<u2")
    if share.size != RING_DIMENSION:
        raise ProtocolError(f"summed key share of {peer!r} holds {share.size} coefficients, expected {RING_DIMENSION}")
    return share.astype(np.uint16)


def bad_decryption_shares(
    residual: Callable[[_native.LatticeKeySum], int], summed: dict, threshold: int, parties: int, tries: int = 500
) -> list[str] | None:
    """The parties whose summed key shares do not verify against a sum's first slice (a redundancy check).

    ``summed``: party -> (point, summed share); ``residual(keys)``: how many words of the slice
    decrypt with an error past the bound under a key sum. A set of ``threshold`` shares is right
    when its key sum leaves none; once one is found, each other share is tested in place of one of
    its members. Needs ``threshold + 1`` shares or more, and at least ``threshold`` right ones among
    the first ``tries`` sets; None where none is found.
    """
    names = list(summed)

    def verifies(members) -> bool:
        points, shares = zip(*(summed[name] for name in members), strict=True)
        return residual(_native.LatticeKeySum.reconstruct(list(points), list(shares), parties)) == 0

    good = next((c for c in islice(combinations(names, threshold), tries) if verifies(c)), None)
    if good is None:
        return None
    base = list(good[:-1])
    return [name for name in names if name not in good and not verifies([*base, name])]


class LatticeProtection(SecAgg):
    """RLWE encryption under fresh per-round keys; the key sum rebuilt by the parties, t of m."""

    mode = "lattice"
    kind = pb.AGGREGATION_KIND_RLWE_SUM
    aggregator_sees = (
        "nothing: words encrypted under fresh RLWE keys (two values a word mod a 62-bit prime); only the "
        "parties rebuild the sum of the keys"
    )
    # A slice encrypted twice under one key and public polynomial would hand out two error draws.
    reencodable = False

    def __init__(self, exchange, params) -> None:
        super().__init__(exchange, params)
        # The packed calls take their message bits and parties each time; 16 only satisfies the constructor.
        self._ring = _packing_ring()
        self._key: _native.LatticeKey | None = None
        self._seed = b""
        self._bits = 0
        self._parties = 0
        self._threshold = 0
        self._own_share: np.ndarray | None = None
        self._drawn: tuple = ()
        self._summed: dict[str, tuple[int, np.ndarray]] = {}
        self._sum_tag, self._sum_peers = "", []
        self._ran: dict = {}
        # Key shares and summed shares go out from one thread, in order, while the round goes on: a
        # relay send is a blocking call per peer, and nothing waits on them before the peers do.
        self._outbox = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lattice-shares")
        self._sending: list[Future] = []

    def _share_soon(self, round_number: int, tag: str, payload: bytes, peers: list[str]) -> None:
        """:meth:`share` from the outbox thread; :meth:`_shared` waits for it."""
        self._sending.append(self._outbox.submit(self.share, round_number, tag, payload, peers))

    def _shared(self, *, strict: bool = True) -> None:
        """Wait until the queued shares are sent; their errors are raised (``strict``) or logged."""
        sending, self._sending = self._sending, []
        for future in sending:
            try:
                future.result()
            except Exception as error:
                if strict:
                    raise
                log.warning("a key share of an attempt that is over was not sent: %s", error)

    def _key_tag(self, attempt: int, participants) -> str:
        """The key shares' tag, bound to the participants and the pair keys each holds now.

        A key drawn for other participants is never taken for these; nor is one whose shares were
        sealed to a participant's earlier process: a party that restarted and was admitted back
        has a new pair key, and a share sealed (before training) to its old one would not open.
        The tag differs, so the share is drawn and sent again once the membership says who joined.
        """
        self.keys.announcement()  # ours is among them once made
        members = hashlib.sha256("\x00".join(participants).encode())
        for party in participants:
            members.update(hashlib.sha256(self.keys.announcements.get(party, b"")).digest())
        return f"lattice-key/{attempt}/{members.hexdigest()[:16]}"

    def _ring_bits(self, parties: int) -> int:
        bits = message_bits(parties)
        if bits < 8:
            raise ProtocolError(f"{parties} parties leave {bits}-bit messages for the lattice mode, fewer than 8")
        return bits

    def prepare_round(self, round_number: int, attempt: int, participants: list[str]) -> None:
        """Draw the attempt's key and send its shares, sealed, before local training.

        The round loop drops the pooled shares of rounds two back and older (without that a party
        kept 2 (m - 1) shares of 8 KiB a round for the whole job: tests/integration/test_lattice_keys.py).
        """
        self._draw_key(round_number, attempt, list(participants))

    def _draw_key(self, round_number: int, attempt: int, participants: list[str]) -> None:
        self._shared(strict=False)  # what an earlier attempt queued is out, or moot
        m = len(participants)
        self._threshold = min(self.params.threshold or default_threshold(m), m)
        self._key = self._ring.new_key()
        shares = self._key.shares(self._threshold, m)
        me, tag = self.exchange.party_id, self._key_tag(attempt, participants)
        for position, peer in enumerate(participants):
            if peer == me:
                self._own_share = shares[position]
            else:
                share = shares[position].astype("<u2").tobytes()
                self._share_soon(round_number, tag, share, [peer])
        self._drawn = (round_number, attempt, tuple(participants), tag)

    def begin_round(self, context: RoundContext, vector: np.ndarray) -> None:
        """Fix the bound and the message bits; draw the attempt's key unless it was drawn for these participants."""
        m = len(context.participants)
        super(SecAgg, self).begin_round(context, vector)  # the bound and the fixed point (not secagg's masks)
        self._bits = self._fixed.bits
        self._parties = m
        tag = self._key_tag(context.attempt, context.participants)
        if self._key is None or self._drawn != (context.round, context.attempt, tuple(context.participants), tag):
            self._draw_key(context.round, context.attempt, list(context.participants))
        self._seed = hashlib.sha256(
            b"confide-lattice-seed-v1\x00"
            + self.exchange.job_id.encode()
            + struct.pack("<II", context.round, context.attempt)
            + "\x00".join(context.participants).encode()
        ).digest()
        context.stats["message_bits"] = self._bits
        if not self.params.recover:
            self._send_summed(context, excluded=set())  # see _key_sum: no exclusion can follow
        self._ran = {
            "ring": f"Z_q[X]/(X^{RING_DIMENSION} + 1), q = {self._ring.modulus} (62-bit prime)",
            "lanes": LANES,
            "lane_bits": self._bits + (m - 1).bit_length(),
            "scale_bits": 61 - LANES * (self._bits + (m - 1).bit_length()),
            "expansion": "public polynomials: AES-128-CTR keyed by SHAKE128(seed, block), drawn in the NTT domain",
            "key_shares": f"Shamir over F_{_native.LatticeKeySum.SHARE_PRIME}, before local training",
            "secret": "ternary, fresh per party and attempt",
            "error": f"centred binomial, eta {ETA}",
            "message_bits": self._bits,
            "threshold": self._threshold,
            "parties": m,
        }

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """Fixed-point words of the slice, encrypted two values to a ciphertext word."""
        words = self._encode_words(values)
        cipher = self._ring.encrypt_packed(self._seed, index, self._key, words, self._bits, self._parties)
        return cipher.astype("<u8", copy=False).tobytes()  # no copy on a little-endian host

    def _key_sum(self, context: RoundContext) -> _native.LatticeKeySum:
        """The key sum of the summed parties, from this party's summed share and ``t - 1`` of the others'.

        Without dropout recovery an attempt either completes with every participant or is aborted
        (and retried under fresh keys), so the summed shares went out at ``begin_round``, long
        before the sum is back: no exchange is left on the round's path. With ``on_dropout:
        recover`` they go out only now that the aggregator has said whom it excluded
        (:meth:`_send_summed`).
        """
        if self.params.recover:
            self._send_summed(context, excluded=set(context.excluded() if context.excluded is not None else []))
        for peer, data in self._first_arrivals(context.round, self._sum_tag, self._sum_peers, self._threshold - 1):
            self._summed[peer] = (context.participants.index(peer) + 1, _summed_share(peer, data))
        points, shares = zip(*self._summed.values(), strict=True)
        return _native.LatticeKeySum.reconstruct(list(points), list(shares), len(self._sum_peers) + 1)

    def _send_summed(self, context: RoundContext, excluded: set[str]) -> None:
        """Sum the received key shares of the summed parties and send that summed share to them.

        The summed parties are the participants less those the aggregator excluded (lost before
        any of their words arrived). Where some were excluded, the survivors first confirm to each
        other that they were told the same set: a party reveals a summed share for one set only,
        so no coalition can gather two key sums of one attempt (two give away the keys between
        them). Every summed party sends its summed share to the others, and any ``t - 1`` besides
        one's own rebuild the sum: a party lost after its words are in the sum costs nothing.
        """
        summed_parties = [p for p in context.participants if p not in excluded]
        peers = [p for p in summed_parties if p != context.party_id]
        if len(summed_parties) < self._threshold:
            raise RoundAbortedError(
                f"round {context.round} attempt {context.attempt}: {len(summed_parties)} parties left after "
                f"{', '.join(sorted(excluded))} were excluded, the lattice key sum needs protection.threshold "
                f"{self._threshold}; retrying under fresh keys",
                sorted(excluded),
                summed_parties,
            )
        view = hashlib.sha256("\x00".join(summed_parties).encode()).hexdigest()[:16]
        if excluded:
            self._confirm(context, peers, view)
            context.stats["excluded"] = sorted(excluded)
        summed = np.array(self._own_share, dtype=np.uint16)
        tag = self._key_tag(context.attempt, context.participants)
        for peer in peers:
            share = np.frombuffer(self.collect(context.round, tag, peer), dtype="<u2")
            if share.size != RING_DIMENSION:
                raise ProtocolError(
                    f"key share from {peer!r} holds {share.size} coefficients, expected {RING_DIMENSION}"
                )
            _native.LatticeKeySum.add_shares(summed, share.astype(np.uint16))
        self._sum_tag, self._sum_peers = f"lattice-sum/{context.attempt}/{view}", peers
        self._share_soon(context.round, self._sum_tag, summed.astype("<u2").tobytes(), peers)
        self._summed = {context.party_id: (context.position + 1, summed)}

    def _confirm(self, context: RoundContext, peers: list[str], view: str) -> None:
        """Every survivor was told the same exclusions, or the attempt stops naming who was told otherwise."""
        tag = f"lattice-view/{context.attempt}"
        self.share(context.round, tag, view.encode(), peers)
        for peer in peers:
            theirs = self.collect(context.round, tag, peer, timeout=self.params.share_timeout_s).decode()
            if theirs != view:
                raise ProtocolError(
                    f"round {context.round}: {peer!r} was told of other excluded parties than {context.party_id!r}: "
                    "the aggregator told the parties different things; no summed key share was revealed"
                )

    def _first_arrivals(self, round_number: int, tag: str, peers: list[str], needed: int, *, strict: bool = True):
        """``(peer, payload)`` of the first ``needed`` peers whose message under ``tag`` arrives.

        Past ``share_timeout_s`` it fails naming the silent peers, or with ``strict=False`` stops.
        """
        waiting, got = list(peers), 0
        deadline = time.monotonic() + self.params.share_timeout_s
        while got < needed and waiting:
            # One look at every peer first (whichever came first), then a short wait on one of them.
            for peer, timeout in [*((p, 0.001) for p in waiting), *((p, 0.02) for p in waiting[:1])]:
                try:
                    data = self.collect(round_number, tag, peer, timeout=timeout)
                except MessageTimeoutError:
                    continue
                waiting.remove(peer)
                got += 1
                yield peer, data
                break
            else:
                if time.monotonic() > deadline:
                    if not strict:
                        return
                    raise ProtocolError(
                        f"round {round_number}: {needed - got} more summed key shares were needed, none came from "
                        f"{', '.join(waiting)} within {self.params.share_timeout_s:g} s"
                    )
        if got < needed and strict:
            raise ProtocolError(f"round {round_number}: {needed} summed key shares were needed, {got} came")

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """Decrypt every summed slice with the key sum, then decode the fixed point."""
        out = context.output()
        first = result(0)  # the aggregator has summed (and told any exclusion): only now do summed shares go out
        began = time.perf_counter()
        keys = self._key_sum(context)
        context.stats["key_sum_s"] = round(time.perf_counter() - began, 6)
        decrypt_s = decode_s = 0.0
        for index in range(context.num_slices):
            piece = first if index == 0 else result(index)
            start, stop = context.bounds(index)
            words = np.frombuffer(piece.payload, dtype="<u8")
            if words.size != -(-(stop - start) // LANES):
                raise ProtocolError(
                    f"summed slice {index} holds {words.size} words, expected {-(-(stop - start) // LANES)} "
                    f"for {stop - start} values"
                )
            if index == 0 and self._residual(words, stop - start)(keys):
                raise self._blame(context, words, stop - start)
            began = time.perf_counter()
            try:
                messages = self._ring.decrypt_packed(
                    self._seed, index, keys, words, self._bits, self._parties, stop - start
                )
            except InvalidParameterError as error:  # the key sum decrypted slice 0: this sum is not the parties'
                raise VerificationError(
                    f"round {context.round}: summed slice {index} does not decrypt under the key sum that decrypts "
                    f"slice 0: the aggregator's sum is not of the parties' ciphertexts ({error}); the round is refused",
                    slices=[index],
                    round_number=context.round,
                ) from None
            decoded = time.perf_counter()
            self.verified(index, piece.payload, messages)
            out[start:stop] = self._decode_words(messages)
            decrypt_s, decode_s = decrypt_s + decoded - began, decode_s + time.perf_counter() - decoded
        context.stats["decrypt_s"], context.stats["fixed_point_decode_s"] = round(decrypt_s, 6), round(decode_s, 6)
        self._key = None
        self._shared()  # every summed share went out (a failed send fails the round here)
        return out

    def _residual(self, words: np.ndarray, length: int) -> Callable[[_native.LatticeKeySum], int]:
        """Words of slice 0 past the error bound under a key sum."""
        return lambda keys: self._ring.residual_packed(self._seed, 0, keys, words, self._bits, self._parties, length)

    def _blame(self, context: RoundContext, words: np.ndarray, length: int) -> ProtocolError:
        """Why slice 0 does not decrypt: the summed key shares that do not verify, named where they can be.

        None to name: the aggregator's sum is wrong (a :class:`VerificationError`, which names its node).
        """
        waiting = [p for p in self._sum_peers if p not in self._summed]
        for peer, data in self._first_arrivals(context.round, self._sum_tag, waiting, len(waiting), strict=False):
            self._summed[peer] = (context.participants.index(peer) + 1, _summed_share(peer, data))
        parties = len(self._sum_peers) + 1
        bad = bad_decryption_shares(self._residual(words, length), self._summed, self._threshold, parties)
        if bad:
            return ProtocolError(
                f"round {context.round}: the summed key share of {', '.join(bad)} does not verify: with it the sum "
                "decrypts with errors past the parties' bound (a wrong share, or a wrong key share sent to that "
                "party); nothing was decrypted"
            )
        return VerificationError(
            f"round {context.round}: no {self._threshold} of the {len(self._summed)} summed key shares at hand "
            "decrypt the sum: the aggregator's sum is not of the parties' ciphertexts, or too many shares are "
            "wrong to tell which; nothing was decrypted, the round is refused",
            slices=[0],
            round_number=context.round,
        )

    def report(self) -> dict:
        """What ran: ring, moduli, message bits, threshold, parties."""
        return {"mode": self.mode, "aggregator_sees": self.aggregator_sees, **self._ran}
