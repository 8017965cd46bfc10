"""``lattice``: updates encrypted under fresh RLWE keys; only the parties rebuild the sum of the keys.

Per round attempt (docs/crypto.md, "Lattice aggregation"; :mod:`confide.crypto.lattice`):

1. every participant draws a fresh ternary key ``s_i``, and sends each other participant its
   t-of-m Shamir share of it, sealed pairwise (X25519 pair keys, as ``secagg``): the aggregator
   relays shares it cannot read;
2. each slice of the update, in the masking modes' fixed point (narrowed to ``bits`` bits so the
   summed error fits), is encrypted word for word: ``b = a*s_i + e + Delta*m (mod 2^32)``, block by
   block under public polynomials expanded from the attempt's seed. Four bytes a value, summed by
   the data plane's masked-word kernel (wrapping addition is the ring's addition), so the
   aggregator's work and the bytes on the wire are those of ``secagg``;
3. once the summed slices arrive, each participant adds the key shares it received (its share of
   ``sum s_i``), sends that summed share, sealed, to the ``t - 1`` participants before it (mod
   ``m``), and rebuilds ``sum s_i`` from its own and the ``t - 1`` it receives; with it, each
   slice of the sum decrypts to the sum of the updates.

The aggregator sees ciphertexts under keys no party holds alone; a single update stays hidden
from any coalition of the aggregator and fewer than ``t`` parties (``t`` of them could rebuild one
party's round key from the shares it sent them). Every attempt has fresh keys and a fresh seed:
a retry after a dropout never reveals two key sums of one attempt.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

import numpy as np

from confide import _native
from confide.errors import ProtocolError
from confide.protect.base import RoundContext
from confide.protect.masking import SecAgg
from confide.v1 import runtime_pb2 as pb

__all__ = ["LatticeProtection"]

#: Ring dimension: 128-bit security with a ternary secret at log q = 32 (docs/crypto.md).
RING_DIMENSION = 4096
#: The error's centred binomial parameter (confide-lattice: eta 21, standard deviation 3.24).
ETA = 21


def message_bits(parties: int) -> int:
    """The widest message ring whose sum of ``parties`` errors still decrypts (``m * eta < 2^(31 - bits)``)."""
    return 31 - (parties * ETA).bit_length()


def default_threshold(parties: int) -> int:
    """Summed key shares that rebuild the key sum: a majority, at least 2 (all of 2)."""
    return max(2, (parties + 1) // 2)


class LatticeProtection(SecAgg):
    """RLWE encryption under fresh per-round keys; the key sum rebuilt by the parties, t of m."""

    mode = "lattice"
    aggregator_sees = (
        "nothing: words encrypted under fresh RLWE keys (mod 2^32); only the parties rebuild the sum of the keys"
    )
    # A slice encrypted twice under one key and public polynomial would hand out two error draws.
    reencodable = False

    def __init__(self, exchange, params) -> None:
        super().__init__(exchange, params)
        self._ring = _native.LatticeRing(RING_DIMENSION, 16)
        self._key: _native.LatticeKey | None = None
        self._seed = b""
        self._bits = 0
        self._threshold = 0
        self._own_share: np.ndarray | None = None
        self._ran: dict = {}

    def _ring_bits(self, parties: int) -> int:
        bits = message_bits(parties)
        if bits < 8:
            raise ProtocolError(f"{parties} parties leave {bits}-bit messages for the lattice mode, fewer than 8")
        return bits

    def begin_round(self, context: RoundContext, vector: np.ndarray) -> None:
        """Fix the bound and the message bits, draw this attempt's key and send its shares, sealed."""
        m = len(context.participants)
        super(SecAgg, self).begin_round(context, vector)  # the bound and the fixed point (not secagg's masks)
        self._bits = self._fixed.bits
        self._threshold = min(self.params.threshold or default_threshold(m), m)
        self._seed = hashlib.sha256(
            b"confide-lattice-seed-v1\x00"
            + self.exchange.job_id.encode()
            + struct.pack("<II", context.round, context.attempt)
            + "\x00".join(context.participants).encode()
        ).digest()
        self._key = self._ring.new_key()
        shares = self._key.shares(self._threshold, m)
        for position, peer in enumerate(context.participants):
            if peer == context.party_id:
                self._own_share = shares[position]
            else:
                self.share(context.round, context.tag("lattice-key"), shares[position].tobytes(), [peer])
        context.stats["message_bits"] = self._bits
        self._ran = {
            "ring": f"Z_2^32[X]/(X^{RING_DIMENSION} + 1)",
            "ntt_prime": f"{self._ring.modulus} (exact products mod 2^32)",
            "secret": "ternary, fresh per party and attempt",
            "error": f"centred binomial, eta {ETA}",
            "message_bits": self._bits,
            "threshold": self._threshold,
            "parties": m,
        }

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """Fixed-point words of the slice, encrypted one word a value."""
        words = self._encode_words(values)
        return self._ring.encrypt_q32(self._seed, index, self._key, words, self._bits).astype("<u4").tobytes()

    def _key_sum(self, context: RoundContext) -> _native.LatticeKeySum:
        """Sum the received key shares, swap the summed shares with the peers, rebuild ``sum s_i``."""
        length = RING_DIMENSION
        summed = np.array(self._own_share, dtype=np.uint64)
        for peer in context.peers:
            share = np.frombuffer(self.collect(context.round, context.tag("lattice-key"), peer), dtype="<u8")
            if share.size != length:
                raise ProtocolError(f"key share from {peer!r} holds {share.size} coefficients, expected {length}")
            _native.LatticeRing.fold(summed, share.astype(np.uint64))
        # Each party needs t - 1 summed shares besides its own: party p sends its own to the t - 1
        # parties before it (mod m) and receives from the t - 1 after it, so each goes out t - 1 times.
        m, p = len(context.participants), context.position
        ahead = [context.participants[(p + k) % m] for k in range(1, self._threshold)]
        behind = [context.participants[(p - k) % m] for k in range(1, self._threshold)]
        self.share(context.round, context.tag("lattice-sum"), summed.tobytes(), behind)
        points, shares = [p + 1], [summed]
        for peer in ahead:
            data = np.frombuffer(self.collect(context.round, context.tag("lattice-sum"), peer), dtype="<u8")
            if data.size != length:
                raise ProtocolError(f"summed key share from {peer!r} holds {data.size} coefficients, expected {length}")
            points.append(context.participants.index(peer) + 1)
            shares.append(data.astype(np.uint64))
        return _native.LatticeKeySum.reconstruct(points, shares, len(context.participants))

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """Decrypt every summed slice with the key sum, then decode the fixed point."""
        out = context.output()
        first = result(0)  # the aggregator has summed: only now do the summed shares go out
        keys = self._key_sum(context)
        for index in range(context.num_slices):
            piece = first if index == 0 else result(index)
            start, stop = context.bounds(index)
            words = np.frombuffer(piece.payload, dtype="<u4")
            if words.size != stop - start:
                raise ProtocolError(f"summed slice {index} holds {words.size} words, expected {stop - start}")
            messages = self._ring.decrypt_q32(self._seed, index, keys, words.astype(np.uint32), self._bits)
            out[start:stop] = self._decode_words(messages)
        self._key = None
        return out

    def report(self) -> dict:
        """What ran: ring, moduli, message bits, threshold, parties."""
        return {"mode": self.mode, "aggregator_sees": self.aggregator_sees, **self._ran}
