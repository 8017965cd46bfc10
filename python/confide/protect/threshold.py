"""``threshold``: BatchCrypt-packed Paillier whose key no one holds; any t of the m parties decrypt.

Set-up: the parties run the distributed key generation of :mod:`confide.crypto.threshold`
over the relay (every message sealed pairwise under the X25519 pair keys, so the aggregator
relays ciphertext it cannot read), or, with ``keygen: dealer``, the leader deals the shares
and the report says so. The leader also hands out a group key, used only for the dACIQ ranges
and the decoded sums, which every party learns anyway.

Per round attempt: dACIQ ranges and packing exactly as in ``paillier`` (shared code); each
slice is encrypted under the public key (no party can use CRT). The aggregator multiplies the
ciphertexts and sends every combined slice to every participant. Slice i is decrypted by the t
participants at positions i, i+1, ..., i+t-1 (mod the round's participants). Every participant
also sends its own slice i, sealed under the group key, to those t: they multiply the slices
themselves and refuse the aggregator's product if it differs, so an aggregator cannot get one
party's slice decrypted by passing it off as the sum. Each decryptor raises the product to its
key share (native engine) and sends the partial decryptions with a batched proof, under the
group key, to the slice's combiner (position i), who checks every proof, names a party whose
proof fails, combines, decodes and shares the float sums with everyone. Fewer than t participants,
or a decryptor silent for ``share_timeout_s``, is a clear error, never a fallback.

Threat model: the aggregator sees ciphertexts, the public key and sealed traffic; any coalition
of fewer than t parties, with or without the aggregator, holds fewer than t key shares and
cannot decrypt any ciphertext, a single party's update included. With the distributed key
generation the modulus is computed by BGW, so the factors stay hidden from up to
floor((m-1)/2) colluders: t is therefore capped at (m+1)//2 (the dealer fallback lifts the cap
but the dealer saw the key).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from confide._checks import require
from confide.crypto import EncryptedVector, EncryptionKey, sum_encrypted
from confide.crypto.ints import int_to_bytes
from confide.crypto.threshold import (
    CheatingPartyError,
    PartialDecryption,
    ThresholdKey,
    ThresholdPublicKey,
    check_threshold,
    deal_threshold_keys,
    decrypt_packed_threshold,
    generate_threshold_key,
    partial_decrypt,
    verify_partial,
)
from confide.errors import InvalidParameterError, MessageTimeoutError, ProtocolError, WireFormatError
from confide.protect.base import SETUP_ROUND, RoundContext
from confide.protect.keys import GroupCipher, PeerKeys, decode_fields, encode_fields
from confide.protect.masking import distribute_group_secrets
from confide.protect.paillier import PaillierProtection, refusal, refused_by
from confide.protect.verify import VerificationError
from confide.v1 import runtime_pb2 as pb

__all__ = ["ThresholdProtection"]

log = logging.getLogger("confide.protect.threshold")


class _RelayChannel:
    """The key generation's :class:`~confide.crypto.threshold.Channel` over the relay, sealed pairwise."""

    def __init__(self, exchange, keys: PeerKeys, participants: list[str], timeout: float) -> None:
        self.exchange = exchange
        self.keys = keys
        self.names = participants
        self.index = participants.index(exchange.party_id) + 1
        self.parties = len(participants)
        self.timeout = timeout

    def send(self, to: int, tag: str, payload: bytes) -> None:
        peer = self.names[to - 1]
        self.exchange.send(SETUP_ROUND, tag, self.keys.seal_to(peer, tag, payload), [peer])

    def broadcast(self, tag: str, payload: bytes) -> None:
        for to in range(1, self.parties + 1):
            if to != self.index:
                self.send(to, tag, payload)

    def recv(self, sender: int, tag: str) -> bytes:
        peer = self.names[sender - 1]
        return self.keys.open_from(peer, tag, self.exchange.recv(SETUP_ROUND, tag, peer, timeout=self.timeout))

    def release(self, prefix: str) -> None:
        self.exchange.release(SETUP_ROUND, prefix)


class ThresholdProtection(PaillierProtection):
    """Threshold Paillier: packed like ``paillier``, decrypted by t of m key shares with proofs."""

    mode = "threshold"
    kind = pb.AGGREGATION_KIND_PAILLIER_PRODUCT
    routing = pb.RESULT_ROUTING_ALL
    aggregator_sees = "nothing: Paillier ciphertexts and the public key; the secret key exists only as shares"
    #: A key share lives only in its party's process: no peer can hand it back.
    rejoinable = False
    reencodable = False  # finish_round decrypts against the very ciphertexts this party sent
    verify_arithmetic = None  # each slice is combined by one party from partial decryptions: not wired yet

    def __init__(self, exchange, params, fetch=None):
        super().__init__(exchange, params, fetch=None)
        # Each combiner sees only its slices' partial decryptions; the tags are not wired through them yet.
        self.verify_arithmetic = None
        self.verify_unavailable = (
            "the parties' tags do not run in mode threshold: each combined slice is compared with the product of "
            "the participants' own ciphertexts by its t decryptors before they decrypt it (a wrong one fails the "
            "round, naming the node that served it, and they tell the other parties, who refuse it too); beyond "
            "that the sums are trusted: the other parties take the combiner's shared sums"
        )
        self._threshold_key: ThresholdKey | None = None
        self._public: EncryptionKey | None = None
        self._names: list[str] = []
        self.keygen_seconds = float("nan")
        self.partial_seconds = 0.0
        #: Our encrypted slices of the open attempt, keyed (round, attempt, index), for the decryptors.
        self._sent: dict[tuple[int, int, int], bytes] = {}
        self._sent_ready = threading.Condition()

    def setup(self, participants: list[str]) -> None:
        """Group key from the leader, then the threshold key: distributed, or dealt by the leader."""
        m = len(participants)
        t = self.params.threshold or max(2, (m + 1) // 2)
        dealer = self.params.keygen == "dealer"
        check_threshold(m, t, dealer=dealer)
        secrets = distribute_group_secrets(self.exchange, self.keys, participants, {}, self.params.setup_timeout_s)
        self._group = GroupCipher(secrets["group_key"], self.exchange.job_id)
        self._names = list(participants)
        started = time.perf_counter()
        if dealer:
            self._threshold_key = self._dealt(participants, t)
        else:
            channel = _RelayChannel(self.exchange, self.keys, participants, self.params.setup_timeout_s)
            self._threshold_key = generate_threshold_key(channel, bits=self.params.key_bits, threshold=t)
        self.keygen_seconds = time.perf_counter() - started
        self._public = self._threshold_key.public.encryption_key()
        self._public.precompute()
        log.info(
            "threshold key ready: %d of %d, %s key generation in %.1f s",
            t,
            m,
            "dealer" if dealer else "distributed",
            self.keygen_seconds,
        )

    def _dealt(self, participants: list[str], threshold: int) -> ThresholdKey:
        me, leader = self.exchange.party_id, participants[0]
        tag = "threshold/dealt"
        if me == leader:
            keys = deal_threshold_keys(len(participants), threshold, bits=self.params.key_bits)
            public = keys[0].public.to_bytes()
            for key, peer in zip(keys[1:], participants[1:], strict=True):
                message = encode_fields(public=public, share=int_to_bytes(key.share))
                self.exchange.send(SETUP_ROUND, tag, self.keys.seal_to(peer, tag, message), [peer])
            return keys[0]
        sealed = self.exchange.recv(SETUP_ROUND, tag, leader, timeout=self.params.setup_timeout_s)
        return _dealt_key(self.keys.open_from(leader, tag, sealed), participants.index(me) + 1)

    @property
    def encryption_key(self):
        """The public key derived from the jointly generated N."""
        require(self._public, "setup first")
        return self._public

    @property
    def threshold_key(self) -> ThresholdKey:
        """The key share of this party (never leaves the process)."""
        require(self._threshold_key, "setup first")
        return self._threshold_key

    def _encoding_key(self):
        """The public key of the jointly generated N (no party holds its secret)."""
        return self.encryption_key

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """Encrypt one slice as the paillier mode does, under the public key, and keep it for the decryptors."""
        data = super().encode(context, index, values)
        with self._sent_ready:
            self._sent[(context.round, context.attempt, index)] = data
            self._sent_ready.notify_all()
        return data

    def _own_slice(self, key: tuple[int, int, int]) -> bytes:
        """Our encrypted slice ``key`` (the pipeline may still be encoding it)."""
        with self._sent_ready:
            if not self._sent_ready.wait_for(lambda: key in self._sent, timeout=self.params.setup_timeout_s):
                raise ProtocolError(
                    f"slice {key[2]} of round {key[0]} was not encoded within {self.params.setup_timeout_s:g} s"
                )
            return self._sent[key]

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """Partial decryptions to each slice's combiner; combine ours; share and receive the sums."""
        key = self.threshold_key
        t = key.public.threshold
        members = context.participants
        m, me = len(members), context.position
        if m < t:
            raise ProtocolError(
                f"threshold decryption needs {t} of the {len(self._names)} key holders; only {m} took part in "
                f"round {context.round} ({', '.join(members)})"
            )
        for name in members:
            if name not in self._names:
                raise ProtocolError(f"{name!r} holds no share of this job's threshold key")
        # Every slice goes, sealed under the group key, to its t decryptors, who multiply the
        # participants' slices themselves: the aggregator cannot have one party's slice decrypted
        # by passing it off as the product (its own product is checked against theirs).
        slices_tag = context.tag("slices")
        key_of = {i: (context.round, context.attempt, i) for i in range(context.num_slices)}
        for i in range(context.num_slices):
            decryptors = [members[(i + k) % m] for k in range(t) if (i + k) % m != me]
            if decryptors:
                self.share(context.round, f"{slices_tag}/{i}", self._own_slice(key_of[i]), decryptors)
        vectors: dict[int, EncryptedVector] = {}

        def refuse(i: int, why: str) -> VerificationError:
            # Told to every peer first, where it may be waiting for this party (its partial decryptions, its
            # decoded sums): those that are not this slice's decryptors refuse the round too.
            notice = refusal(i, why)
            for channel in ("partials", "shares.0"):
                self.share(context.round, context.tag(channel), notice, context.peers)
            return VerificationError(f"round {context.round}: {why}", slices=[i], round_number=context.round)

        def vector(i: int) -> EncryptedVector:
            if i not in vectors:
                parts = [EncryptedVector.from_bytes(self._own_slice(key_of[i]), self.encryption_key)]
                for peer in context.peers:
                    try:
                        data = self.collect(
                            context.round, f"{slices_tag}/{i}", peer, timeout=self.params.share_timeout_s
                        )
                    except MessageTimeoutError:
                        raise ProtocolError(
                            f"threshold decryption of round {context.round}: {peer!r} sent no copy of its slice {i} "
                            f"within {self.params.share_timeout_s:g} s"
                        ) from None
                    parts.append(EncryptedVector.from_bytes(data, self.encryption_key))
                product = sum_encrypted(parts)
                try:
                    combined = EncryptedVector.from_bytes(result(i).payload, self.encryption_key)
                except (WireFormatError, InvalidParameterError) as error:
                    raise refuse(
                        i, f"combined slice {i} is not a ciphertext block ({error}); the round is refused"
                    ) from None
                if combined.num_ciphertexts != product.num_ciphertexts or any(
                    combined.ciphertext(k) != product.ciphertext(k) for k in range(product.num_ciphertexts)
                ):
                    raise refuse(
                        i,
                        f"combined slice {i} is not the product of the participants' slices (an update dropped, "
                        "replayed or altered); nothing was decrypted and the round is refused",
                    )
                vectors[i] = product
            return vectors[i]

        n = key.public.n
        outgoing: dict[int, dict[int, bytes]] = {}
        mine: dict[int, list[PartialDecryption]] = {}
        for i in range(context.num_slices):
            if (me - i) % m >= t:
                continue
            start = time.perf_counter()
            partial = partial_decrypt(key, vector(i))
            self.partial_seconds += time.perf_counter() - start
            combiner = i % m
            if combiner == me:
                mine.setdefault(i, []).append(partial)
            else:
                outgoing.setdefault(combiner, {})[i] = partial.to_bytes(n)
        tag = context.tag("partials")
        for combiner, parts in outgoing.items():
            self.share(context.round, tag, _pack_blobs(parts), [members[combiner]])
        for k in range(1, t):
            position = (me + k) % m
            if position == me:
                continue
            peer = members[position]
            expected = [i for i in range(me, context.num_slices, m) if (position - i) % m < t]
            if not expected:
                continue
            try:
                data = self.collect(context.round, tag, peer, timeout=self.params.share_timeout_s)
                refused = refused_by(context, peer, data)
                if refused is not None:
                    raise refused
                blobs = _unpack_blobs(data)
            except MessageTimeoutError:
                raise ProtocolError(
                    f"threshold decryption of round {context.round}: {peer!r} sent no partial decryption within "
                    f"{self.params.share_timeout_s:g} s; {t} of the key holders are needed"
                ) from None
            if sorted(blobs) != expected:
                raise CheatingPartyError(peer, f"sent partial decryptions of slices {sorted(blobs)[:5]}, not its own")
            for i, blob in blobs.items():
                partial = PartialDecryption.from_bytes(blob, n)
                index = self._names.index(peer) + 1
                if partial.index != index:
                    raise CheatingPartyError(peer, f"signed its partial decryption as key holder {partial.index}")
                start = time.perf_counter()
                try:
                    verify_partial(key.public, vector(i), partial)
                except CheatingPartyError as error:
                    raise CheatingPartyError(peer, error.detail) from None
                self.crypto_seconds += time.perf_counter() - start
                mine[i].append(partial)
        decoded = {}
        for i, partials in mine.items():
            start = time.perf_counter()
            decoded[i] = decrypt_packed_threshold(key.public, vector(i), partials).astype(np.float32)
            self.crypto_seconds += time.perf_counter() - start

        with self._sent_ready:
            for stale in [k for k in self._sent if k[:2] <= (context.round, context.attempt)]:
                del self._sent[stale]

        def silent(peer: str, expected: list[int]) -> dict[int, np.ndarray]:
            raise ProtocolError(
                f"threshold decryption of round {context.round}: combiner {peer!r} shared no decoded sums within "
                f"{self.params.share_timeout_s:g} s"
            )

        return self._assemble(context, [decoded], silent)

    def report(self) -> dict:
        """Mode, threshold, how the key was made, and what it costs."""
        key = self._threshold_key
        out = {
            **super().report(),
            "secret_key_holders": (
                f"nobody: {key.public.parties} shares, any {key.public.threshold} decrypt"
                if key
                else "nobody (set-up not run)"
            ),
            "decryption": "threshold: t partial decryptions per slice, each with a proof checked by the combiner",
            "keygen": "dealer (the leader saw the whole key)" if self.params.keygen == "dealer" else "distributed",
            "keygen_seconds": self.keygen_seconds,
        }
        if key:
            out["threshold"] = key.public.threshold
            out["parties"] = key.public.parties
            out["colluders_tolerated"] = key.public.threshold - 1
        return out


def _dealt_key(message: bytes, index: int) -> ThresholdKey:
    """Key holder ``index``'s share as the dealer sent it (fields ``public`` and ``share``, both bytes)."""
    fields = decode_fields(message, "public", "share")
    for name in ("public", "share"):
        if not isinstance(fields[name], bytes):
            raise ProtocolError(f"dealt threshold key: field {name!r} must be bytes, got {type(fields[name]).__name__}")
    return ThresholdKey(ThresholdPublicKey.from_bytes(fields["public"]), index, int.from_bytes(fields["share"], "big"))


def _pack_blobs(blobs: dict[int, bytes]) -> bytes:
    return encode_fields(**{str(i): blob for i, blob in blobs.items()})


def _unpack_blobs(data: bytes) -> dict[int, bytes]:
    fields = decode_fields(data)
    out = {}
    for name, blob in fields.items():
        if not (name.isascii() and name.isdigit()) or not isinstance(blob, bytes):
            raise ProtocolError("partial decryption message must map slice indices to bytes")
        out[int(name)] = blob
    return out
