"""``paillier``: BatchCrypt-packed Paillier aggregation; the aggregator learns nothing.

Set-up: the leader (first participant) generates the key pair and seals the secret key and a
group key to each party under its X25519 pair key (see :mod:`confide.protect.keys`), so the
aggregator and the relay only ever hold the public key.

Per round attempt: every party shares the max and min of each layer of its (weighted) update
under the group key; dACIQ picks each layer's clipping threshold alpha_l from them (algorithms.md
§2.6; BatchCrypt clips layer by layer). With one layer the codec clips at alpha directly; with
several, each value is divided by its layer's alpha_l, encoded with alpha = 1 and the decoded sum
multiplied back (quantization is linear, so this is the same as a codec per layer, in one pass
over the slices). Every slice is clipped, quantized to r bits with stochastic rounding, packed
with ceil(log2 m) carry bits and encrypted (CRT path: each party holds the secret key). The
aggregator multiplies ciphertexts.
Combined slice i goes to participant (i mod m) only; it decrypts and decodes it and shares the
float32 sums with the others under the group key, so each party decrypts ~1/m of the aggregate.
If a part does not arrive within ``share_timeout_s`` (its decryptor dropped out after the
round completed), the party fetches those combined slices from the aggregator and decrypts them
itself.

With the transport pipeline on, a party's part goes out in up to ``SHARE_PIECES`` pieces, each
sent (on a sender thread) while the next is decrypted: decryption, 7x the cost of encryption,
then overlaps the relay instead of preceding it. On the 100 Mbit/s, 20 ms link of
``benchmarks/wan_bench.py`` the decrypt-then-share tail was about a quarter of a paillier round.
Without the pipeline the part is one message, sent once everything is decrypted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from confide import _native
from confide._checks import require
from confide.crypto import BatchCryptCodec, DecryptionKey, EncryptedVector, daciq_threshold, decrypt_packed
from confide.crypto import encrypt_packed as _encrypt_packed
from confide.crypto.gpu import engine_report as gpu_engine_report
from confide.errors import (
    EncodingError,
    InvalidParameterError,
    MessageTimeoutError,
    ProtocolError,
    WireFormatError,
)
from confide.protect.base import Protection, RoundContext, awaited, pack_parts, unpack_parts
from confide.protect.keys import GroupCipher, PeerKeys
from confide.protect.masking import GroupShared, distribute_group_secrets
from confide.protect.verify import VerificationError
from confide.v1 import runtime_pb2 as pb

__all__ = ["MAX_VERIFIED_BITS", "SHARE_PIECES", "PaillierProtection", "share_pieces"]

#: Pieces a party's decrypted part is sent in when the pipeline is on (each one relay message).
SHARE_PIECES = 8
#: Widest quantization whose code sums the float32 shares carry exactly (the parties verify up to it).
MAX_VERIFIED_BITS = 23


def share_pieces(indices: list[int], pieces: int) -> list[list[int]]:
    """``indices`` cut into ``min(pieces, len(indices))`` consecutive runs (the same on every party)."""
    count = max(1, min(pieces, len(indices)))
    return [indices[k * len(indices) // count : (k + 1) * len(indices) // count] for k in range(count)]


log = logging.getLogger("confide.protect.paillier")


class PaillierProtection(GroupShared, Protection):
    """BatchCrypt + Paillier with decryption split among the parties."""

    mode = "paillier"
    kind = pb.AGGREGATION_KIND_PAILLIER_PRODUCT
    routing = pb.RESULT_ROUTING_ROUND_ROBIN
    aggregator_sees = "nothing: Paillier ciphertexts and the public key (no party's key material)"
    verify_arithmetic = "integer"

    def __init__(self, exchange, params, fetch: Callable[[RoundContext, list[int]], list[pb.Slice]] | None = None):
        super().__init__(exchange, params)
        #: The parties check every slice's code sums (exact integers) against their tags; past 23 bits the
        #: float32 shares a decryptor sends cannot carry a code sum exactly.
        self.verify_arithmetic = "integer" if params.bits <= MAX_VERIFIED_BITS else None
        self.verify_unavailable = (
            ""
            if self.verify_arithmetic
            else f"protection.bits {params.bits} > {MAX_VERIFIED_BITS}: the decrypted shares (float32) cannot carry "
            "the code sums exactly; the aggregator's sums are trusted"
        )
        #: Seed of this attempt's stochastic rounding (secret): the party re-derives its codes from it.
        self._seed = 0
        #: Commitment hashes of the combined slices, by index, as their decryptors received them.
        self._digests: dict[int, bytes] = {}
        self.keys = PeerKeys(exchange.identity, exchange.job_id)
        self._fetch = fetch
        self._key: DecryptionKey | None = None
        self._group: GroupCipher | None = None
        self._codec: BatchCryptCodec | None = None
        self.last_alpha = float("nan")
        #: Per-value alpha when the round has several layers (None: one layer, alpha in the codec).
        self._scale: np.ndarray | None = None
        self.crypto_seconds = 0.0
        self.local_fallbacks = 0

    def setup(self, participants: list[str]) -> None:
        """Leader generates the key pair; everyone ends up with it and the group key."""
        extra = {}
        if self.exchange.party_id == participants[0]:
            key = DecryptionKey.generate(self.params.key_bits)
            extra["secret_key"] = key.export_secret()
        self.adopt_secrets(
            distribute_group_secrets(self.exchange, self.keys, participants, extra, self.params.setup_timeout_s)
        )

    def adopt_secrets(self, secrets: dict[str, bytes]) -> None:
        """The shared Paillier key and the group key."""
        if "secret_key" not in secrets or not isinstance(secrets["secret_key"], bytes):
            raise ProtocolError("the key bundle from the leader lacks the Paillier secret key")
        self._key = DecryptionKey.import_secret(secrets["secret_key"])
        self._key.precompute()
        self._group = GroupCipher(secrets["group_key"], self.exchange.job_id)
        super().adopt_secrets(secrets)

    @property
    def encryption_key(self):
        """The shared public key."""
        require(self._key, "setup first")
        return self._key.encryption_key

    def header_key(self) -> bytes:
        """The public key, for the aggregator's ciphertext products."""
        return self.encryption_key.to_bytes()

    def begin_round(self, context: RoundContext, vector: np.ndarray) -> None:
        """Pick each layer's dACIQ threshold from every participant's max and min of it."""
        self._seed = int.from_bytes(os.urandom(8), "little")
        if context.clipping is not None:  # differential privacy's public threshold (RoundContext.clipping)
            self._scale = None
            self.last_alpha = float(context.clipping)
            self._codec = BatchCryptCodec(
                bits=self.params.bits, max_parties=len(context.participants), alpha=self.last_alpha
            )
            context.stats.update(alpha=self.last_alpha, bits=self.params.bits, key_bits=self.params.key_bits)
            return
        layers = context.layers or [(0, context.vector_length)]
        local = []
        for start, stop in layers:
            part = vector[start:stop]
            local += [float(part.max()), float(part.min())] if part.size else [0.0, 0.0]
        values = self.exchange_values(context.round, context.tag("range"), local, context.peers)
        table = np.array(list(values.values())).reshape(len(values), len(layers), 2)
        m = len(context.participants)
        alphas = []
        for index, (start, stop) in enumerate(layers):
            maxima, minima = table[:, index, 0], table[:, index, 1]
            if self.params.clipping == "daciq":
                alpha = daciq_threshold(maxima, minima, stop - start, bits=self.params.bits, parties=m)
            else:
                alpha = float(max(np.abs(maxima).max(), np.abs(minima).max()))
            alphas.append(max(alpha, 1e-12))
        if len(layers) == 1:
            self._scale = None
            codec_alpha = alphas[0]
        else:
            self._scale = np.empty(context.vector_length, dtype=np.float64)
            for (start, stop), alpha in zip(layers, alphas, strict=True):
                self._scale[start:stop] = alpha
            codec_alpha = 1.0
        self.last_alpha = float(max(alphas))
        self._codec = BatchCryptCodec(bits=self.params.bits, max_parties=m, alpha=codec_alpha)
        context.stats.update(alpha=self.last_alpha, bits=self.params.bits, key_bits=self.params.key_bits)
        if len(layers) > 1:
            context.stats.update(layer_alphas=[float(a) for a in alphas])

    def _encoding_key(self):
        """The key slices are encrypted under: the shared key here (CRT encryption)."""
        require(self._key, "begin_round first")
        return self._key

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """Clip, quantize, pack and encrypt one slice (all cores, or the GPU engine)."""
        require(self._codec, "begin_round first")
        key = self._encoding_key()
        start = time.perf_counter()
        if self._scale is not None:
            first, stop = context.bounds(index)
            values = np.asarray(values, dtype=np.float64) / self._scale[first:stop]
        codec = dataclasses.replace(self._codec, seed=self._slice_seed(index))
        data = _encrypt_packed(values, codec, key, threads=self.encode_threads).to_bytes()
        self.crypto_seconds += time.perf_counter() - start
        return data

    def _slice_seed(self, index: int) -> int:
        """The stochastic rounding seed of slice ``index`` in this attempt (each slice its own stream)."""
        return (self._seed + index * 0x9E3779B97F4A7C15) % 2**64

    def verify_image(self, context: RoundContext, index: int, values: np.ndarray) -> np.ndarray:
        """The BatchCrypt codes this party packed into slice ``index`` (two's complement uint32 words)."""
        require(self._codec, "begin_round first")
        codec = self._codec
        array = np.asarray(values, dtype=np.float64)
        if self._scale is not None:
            start, stop = context.bounds(index)
            array = array / self._scale[start:stop]
        return _native.batchcrypt_codes(
            np.ascontiguousarray(array),
            codec.bits,
            codec.max_parties,
            float(codec.alpha),
            self.encryption_key.bits,
            self._slice_seed(index),
            codec.quantizer,
        )

    def bound_codes(self, context: RoundContext, vector: np.ndarray) -> tuple[np.ndarray, int, float]:
        """What this party's bound proofs speak of: (its BatchCrypt codes, bits, the bound in values).

        An honest code is at most ``h = ceil(Q / m)`` in magnitude (``Q = 2^(bits - 1) - 1``: the
        codec scales a clipped value so that m of them sum within a lane); the proven range is
        ``[-P, P)`` with ``P`` the least power of two above ``h + 1`` (under twice the honest
        bound, and within the ``bits`` whose m-fold sums the lanes hold). The codes are the ones
        :meth:`verify_image` re-derives from the seeded rounding, exactly what ``encode`` packs.
        """
        require(self._codec, "begin_round first")
        codec = self._codec
        honest = -(-(2 ** (codec.bits - 1) - 1) // codec.max_parties)
        bits = min(codec.bits, (honest + 1).bit_length() + 1)
        words = np.concatenate(
            [
                np.asarray(self.verify_image(context, i, vector[slice(*context.bounds(i))]), dtype=np.uint32)
                for i in range(context.num_slices)
            ]
        )
        return words, bits, self.last_alpha * (2 ** (bits - 1) - 1) / honest

    @property
    def verify_bits(self) -> int:
        """Code sums are checked as residues mod 2^32 (they stay far below it)."""
        return 32

    def _code_sums(self, values: np.ndarray) -> np.ndarray:
        """The exact code sums behind decoded values (before any layer rescaling), as uint32 words."""
        codec = self._codec
        top = 2 ** (codec.bits - 1) - 1
        m = codec.max_parties
        scale = (top // m) / codec.alpha if codec.quantizer == "exact_bound" else top / (m * codec.alpha)
        return np.rint(np.asarray(values, dtype=np.float64) * scale).astype(np.int64).astype(np.uint32)

    def _decrypt(self, payload: bytes, context: RoundContext | None = None, index: int = -1) -> np.ndarray:
        """The decoded sums of one combined slice (float32).

        Verified, a slice that does not decrypt to a sum of codes (a block altered, a sum past the
        code range) is shared as zeros: every party's tag check then refuses it, naming the node
        that served it, instead of this party alone failing while the others wait for its share.
        """
        require(self._key, "setup first")
        start = time.perf_counter()
        try:
            vector = EncryptedVector.from_bytes(payload, self._key.encryption_key)
            values = decrypt_packed(vector, self._key).astype(np.float32)
        except (EncodingError, ProtocolError, InvalidParameterError, WireFormatError) as error:
            if self.verifier is None or context is None:
                raise
            log.warning("combined slice %d does not decrypt to a sum of codes (%s): it fails the check", index, error)
            start_value, stop = context.bounds(index)
            values = np.zeros(stop - start_value, dtype=np.float32)
        self.crypto_seconds += time.perf_counter() - start
        return values

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """Decrypt our 1/m of the slices, share them (piece by piece with the pipeline), receive the rest.

        Verified, this party hashes each slice it receives as it decrypts it and, once its part is
        decoded, sends the peers those commitment hashes: every party draws each slice's challenge
        from its decryptor's hash (:meth:`_observe_parts`, after every part is in).
        """
        m, me = len(context.participants), context.position
        pieces = SHARE_PIECES if self.pipeline else 1
        own = list(range(me, context.num_slices, m))
        self._digests = {}

        def decode(index: int) -> np.ndarray:
            payload = result(index).payload
            if self.verifier is not None:
                self._digests[index] = self.verifier.commitment(context, index, payload)
            return self._decrypt(payload, context, index)

        def decoded() -> Iterator[dict[int, np.ndarray]]:
            for piece in share_pieces(own, pieces):
                yield {i: decode(i) for i in piece}
            if self.verifier is not None:
                hashes = _pack_digests({i: self._digests[i] for i in own})
                self.share(context.round, context.tag("digests"), hashes, context.peers)

        return self._assemble(
            context, decoded(), lambda peer, expected: self._decrypt_locally(context, peer, expected), pieces
        )

    def _observe_parts(self, context: RoundContext, parts: dict[int, np.ndarray]) -> None:
        """Hand the verifier every slice's code sums and commitment hash (its decryptor's, or ours)."""
        m = len(context.participants)
        for position, peer in enumerate(context.participants):
            theirs = [i for i in range(position, context.num_slices, m) if i not in self._digests]
            if not theirs:
                continue
            data = awaited(
                lambda peer=peer: self.collect(
                    context.round, context.tag("digests"), peer, timeout=self.params.share_timeout_s
                ),
                peer,
                context.participants,
                f"round {context.round} attempt {context.attempt}: {peer!r} sent no commitment hashes of the "
                "slices it decrypted; they cannot be checked without them",
            )
            got = _unpack_digests(data)
            if not set(theirs) <= set(got):
                raise ProtocolError(
                    f"the commitment hashes from {peer!r} lack slices {sorted(set(theirs) - set(got))[:5]}"
                )
            self._digests.update({i: got[i] for i in theirs})
        for index in range(context.num_slices):
            self.verifier.observe_digest(index, self._digests[index], self._code_sums(parts[index]))

    def _assemble(
        self,
        context: RoundContext,
        decoded: Iterable[dict[int, np.ndarray]],
        missing: Callable[[str, list[int]], dict[int, np.ndarray]],
        pieces: int = 1,
    ) -> np.ndarray:
        """Share our decoded slices (i mod m) as ``decoded`` yields each piece, receive the others', rescale.

        Piece k of a part travels under its own tag. A peer whose piece does not come within
        ``share_timeout_s`` is taken as gone: ``missing`` decodes all of its remaining slices here.
        """
        m = len(context.participants)
        parts: dict[int, np.ndarray] = {}
        sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="confide-share")
        try:
            sent = []
            for k, piece in enumerate(decoded):
                parts.update(piece)
                if piece:
                    payload = pack_parts(piece)
                    tag = context.tag(f"shares.{k}")
                    sent.append(sender.submit(self.share, context.round, tag, payload, context.peers))
            for position, peer in enumerate(context.participants):
                expected = list(range(position, context.num_slices, m))
                if peer == context.party_id or not expected:
                    continue
                for k, wanted in enumerate(share_pieces(expected, pieces)):
                    gone = False
                    try:
                        data = self.collect(
                            context.round, context.tag(f"shares.{k}"), peer, timeout=self.params.share_timeout_s
                        )
                        refused = refused_by(context, peer, data)
                        if refused is not None:
                            raise refused
                        theirs = unpack_parts(data)
                    except MessageTimeoutError:
                        # Gone: the rest of its part is decoded here, without waiting for more pieces.
                        gone, wanted = True, [i for i in expected if i not in parts]
                        theirs = missing(peer, wanted)
                    if sorted(theirs) != wanted:
                        raise ProtocolError(
                            f"decrypted share of {peer!r} holds slices {sorted(theirs)[:5]}..., not its own"
                        )
                    parts.update(theirs)
                    if gone:
                        break
            for future in sent:
                future.result()
        finally:
            # A failed round (aborted, peer cheating) does not wait for the pieces still being sent.
            sender.shutdown(wait=False, cancel_futures=True)
        if self.verifier is not None:
            self._observe_parts(context, parts)
        if self.bounds is not None:
            for index in range(context.num_slices):
                self.bounds.observe(index, self._code_sums(parts[index]))
        out = context.output()
        for index in range(context.num_slices):
            start, stop = context.bounds(index)
            if parts[index].size != stop - start:
                raise ProtocolError(
                    f"decrypted slice {index} holds {parts[index].size} values, expected {stop - start}"
                )
            out[start:stop] = parts[index]
        if self._scale is not None:
            out *= self._scale
        return out

    def _decrypt_locally(self, context: RoundContext, peer: str, indices: list[int]) -> dict[int, np.ndarray]:
        if self._fetch is None:
            raise ProtocolError(f"no decrypted share from {peer!r} and no way to fetch its slices")
        log.warning(
            "no decrypted share from %s within %ss: decrypting its slices here", peer, self.params.share_timeout_s
        )
        self.local_fallbacks += 1
        fetched = self._fetch(context, indices)
        if self.verifier is not None:  # as the aggregator serves them to us: the hashes are ours
            self._digests.update({s.index: self.verifier.commitment(context, s.index, s.payload) for s in fetched})
        return {s.index: self._decrypt(s.payload, context, s.index) for s in fetched}

    def report(self) -> dict:
        """Mode, key size, quantization and the last clipping threshold."""
        return {
            **super().report(),
            "key_bits": self.params.key_bits,
            "quantization_bits": self.params.bits,
            "clipping": self.params.clipping,
            "last_alpha": self.last_alpha,
            "secret_key_holders": "participants only (sealed pairwise by the leader)",
            "decryption": "split: participant (slice mod m) decrypts, shares under the group key",
            # Which engine ran the Paillier arithmetic here (GPU or CPU, with any fallback).
            **gpu_engine_report(),
        }


def _pack_digests(digests: dict[int, bytes]) -> bytes:
    """(u32 index, 32-byte hash) per slice."""
    return b"".join(struct.pack("<I", index) + digest for index, digest in sorted(digests.items()))


def _unpack_digests(data: bytes) -> dict[int, bytes]:
    if len(data) % 36:
        raise ProtocolError(f"a commitment hash message holds {len(data)} bytes, not a multiple of 36")
    return {struct.unpack_from("<I", data, k)[0]: data[k + 4 : k + 36] for k in range(0, len(data), 36)}


#: What a decryptor that refused a combined slice sends on the share channel instead of its sums,
#: so that the parties that are not among that slice's decryptors refuse the round too, at once and
#: naming the node (threshold; a party can only stop a round this way, as it could by going silent).
_REFUSED = b"confide-refused-v1\0"


def refusal(index: int, reason: str) -> bytes:
    """The notice that combined slice ``index`` was refused, and why."""
    return _REFUSED + struct.pack("<I", index) + reason.encode()[:4000]


def refused_by(context: RoundContext, peer: str, data: bytes) -> VerificationError | None:
    """The refusal ``data`` carries (a :func:`refusal` notice from ``peer``), or None for decoded sums."""
    if not data.startswith(_REFUSED) or len(data) < len(_REFUSED) + 4:
        return None
    (index,) = struct.unpack_from("<I", data, len(_REFUSED))
    if index >= context.num_slices:
        raise ProtocolError(
            f"{peer!r} refused combined slice {index}, but round {context.round} has {context.num_slices} slices"
        )
    reason = data[len(_REFUSED) + 4 :].decode(errors="replace")
    return VerificationError(
        f"round {context.round}: {peer!r}, a decryptor of combined slice {index}, refused it: {reason}",
        slices=[index],
        round_number=context.round,
    )
