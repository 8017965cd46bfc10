"""Bounded updates under protection: each party proves every value of its update within the job's bound.

``protection.prove_bound: true`` (modes secagg, groupmask, lattice: their updates travel as the
integers of a fixed point, so a proof can speak of exactly what is summed; paillier and
threshold: the BatchCrypt codes a party packs, re-derived from its seeded rounding,
``PaillierProtection.bound_codes``, with the code sums behind the decrypted shares as the sum). The aggregator cannot
read an update, so it cannot see one that is out of range; a party could send a value far past
``mask_bound`` (in the lattice mode, one that carries out of its lane into the next value) and
own the sum. Here it cannot:

1. The bound. The fixed point of the round writes value ``x`` as ``q = rint(x * 2^f)``. The
   proven bound is ``P = 2^(bits - 1)``, the largest power of two not above ``mask_bound * 2^f``
   (so at least half of ``mask_bound``, and ``mask_bound`` itself when it is a power of two); an
   honest party clips its contribution to ``(P - 1) / 2^f`` (the report counts what was clipped).
2. Commit and prove (while the slices upload, on a thread that sends the proofs to the peers as
   soon as they are made): Pedersen commitments
   ``V_k = (q_k + P) * 2^(32 - bits) * B + gamma_k * B~`` and aggregated Bulletproofs that every
   ``(q_k + P) * 2^(32 - bits)`` lies in ``[0, 2^32)``: ``crates/confide-codec/src/bound.rs``.
   The blindings cancel over the parties (``gamma_k`` is a sum of pair-keyed PRF values, added
   towards later names and subtracted towards earlier ones), so the commitments hide each value
   and their sum is a commitment to the sum with no blinding at all.
3. After the sum (every party, with the tags of :mod:`confide.protect.verify`): each party checks
   every peer's commitments and proofs (sent while the sum was made). A proof that fails names its party:
   the round is run again without it (:class:`BoundViolationError`, reported as ``bound_excluded``).
   Then ``sum_i V_ik`` must equal ``2^(32 - bits) * (S_k + m * P) * B`` for the decoded sum
   ``S_k``: a party whose protected words are not the values it proved (an overflowing lane, a
   word past the bound) fails it, and the sum is refused before anyone applies it
   (:class:`BoundSumError`; it cannot say which party: the job stops). A round recovered without
   a party (``on_dropout: recover``) leaves the survivors' blindings with it uncancelled: the
   survivors swap, sealed, their blinding keys of the attempt with it, and the sum check adds
   what those keys give (:meth:`BoundProver._residual`).

4. With ``protection.l2_bound`` (fixed point ``beta = floor(l2_bound * 2^f)``): each party also
   proves ``sum_k q_k^2 <= beta^2`` on the same commitments (``crates/confide-codec/src/norm.rs``:
   a committed square per value with a Sigma-protocol proof that it is the square of the committed
   ``q_k``, and a range proof that ``beta^2`` minus their sum is not negative). An honest party
   scales its update into the ball first (leaving ``sqrt(n)/2`` units for the rounding; the
   report's ``bound_l2_scaled``). A norm proof that fails names its party, as a range proof does.

What the proofs reveal: nothing of a value but that it is in range, and of the update but that its
norm is within the bound (Bulletproofs and the Sigma protocol are zero knowledge; the commitments
are hiding while one peer of a party is honest). Cost on this machine kind: the range proofs take
about 2 ms a value to prove and 0.2 ms to check, and each party checks every peer: a model of a
few thousand values a round, not millions; the norm proof adds about 0.05 ms a value to prove and
0.03 ms to check (docs/crypto.md, "Bounded updates"; ``bound.confide.*`` in
``benchmarks/results/robust.json``).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Sequence

import numpy as np

from confide import _native
from confide.errors import ProtocolError, RoundAbortedError
from confide.protect.base import gathered
from confide.protect.keys import round_key

__all__ = ["BOUNDED_MODES", "L2_MODES", "BoundProver", "BoundSumError", "BoundViolationError", "proven_bits"]

#: Modes whose updates are integers a party can prove ranges of: the masking modes' fixed point, and
#: the Paillier modes' BatchCrypt codes (seeded, so a party re-derives exactly what it packed).
BOUNDED_MODES = ("secagg", "groupmask", "lattice", "paillier", "threshold")
#: Of those, the modes with one fixed point for every value, where an L2 bound has a meaning.
L2_MODES = ("secagg", "groupmask", "lattice")
_DOMAIN = b"confide-bound-v1"


class BoundViolationError(RoundAbortedError):
    """Parties whose proofs do not verify: the round runs again without them."""


class BoundSumError(ProtocolError):
    """The decoded sum is not the sum of the values the parties proved within the bound."""


def proven_bits(scale: float, bound: float) -> int:
    """``bits`` of the proven range ``[-2^(bits-1), 2^(bits-1))``: ``2^(bits-1) <= bound * scale``."""
    limit = int(bound * scale)
    if limit < 2:
        raise ProtocolError(f"protection.mask_bound {bound:g} is below two units of the fixed point (2^-{scale:g})")
    return min(32, limit.bit_length())


class BoundProver:
    """One party's side of the bound proofs of a round attempt (see the module documentation)."""

    def __init__(self, protection, *, timeout_s: float = 30.0, l2_bound: float | None = None) -> None:
        self.protection = protection
        self.l2_bound = l2_bound
        self.l2_units: int | None = None
        self.exchange = protection.exchange
        self.timeout_s = timeout_s
        self._context = None
        self._thread: threading.Thread | None = None
        self._message: bytes | Exception = b""
        self._sums: dict[int, np.ndarray] = {}
        self._pairs: dict[str, bytes] = {}
        self.bits = 0
        self.ring_bits = 32
        self.limit = 0.0
        self.prove_seconds = 0.0

    def begin(self, context, vector: np.ndarray) -> None:
        """Clip ``vector`` (in place) to the proven bound and start proving its fixed-point image."""
        codes = getattr(self.protection, "bound_codes", None)
        if codes is not None:  # paillier, threshold: the BatchCrypt codes (the codec clips)
            words, self.bits, self.limit = codes(context, vector)
            self.ring_bits, self.l2_units = 32, None
        else:
            words = self._fixed_point_words(context, vector)
        l2 = self.l2_units
        if l2 is not None and _native.bound_squared_norm(words, self.ring_bits, self.bits) > l2**2:
            raise ProtocolError("bound proofs: the scaled update's fixed-point norm is still past protection.l2_bound")
        me = self.exchange.party_id
        pair = self.protection.keys.pair_key
        self._pairs = {
            peer: round_key(pair(peer, b"bound"), b"bound-blinding", context.round, context.attempt)[:16]
            for peer in context.peers
        }
        keys, adds = list(self._pairs.values()), [me < peer for peer in self._pairs]
        self._context, self._sums, self._message = context, {}, b""
        statement, peers, tag = self._statement(context, me), list(context.peers), f"bound/{context.attempt}"

        def prove() -> None:
            began = time.perf_counter()
            try:
                self._message = _native.bound_prove(statement, words, self.ring_bits, self.bits, keys, adds, l2)
                self.prove_seconds = time.perf_counter() - began
                # out as soon as it is ready: the peers check it while the sum is still being made
                self.exchange.send(context.round, tag, self._message, peers)
            except Exception as error:  # noqa: BLE001 - re-raised in settle, on the round's thread
                self._message = error

        self._thread = threading.Thread(target=prove, name="confide-bound-prove", daemon=True)
        self._thread.start()

    def _fixed_point_words(self, context, vector: np.ndarray) -> np.ndarray:
        """The masking modes' words: scale into the L2 ball (if any), clip, encode as the mode does."""
        scale, bound, self.ring_bits = self.protection.verify_fixed
        self.bits = proven_bits(scale, bound)
        self.limit = (2 ** (self.bits - 1) - 1) / scale
        self.l2_units = self._l2_units(scale, vector.size)
        if self.l2_units is not None:
            context.stats["bound_l2_scaled"] = _scale_into(vector, (self.l2_units - (vector.size**0.5) / 2) / scale)
        clipped = int(np.count_nonzero(np.abs(vector) > self.limit))
        np.clip(vector, -self.limit, self.limit, out=vector)
        context.stats["bound_clipped"] = clipped
        return np.concatenate(
            [
                np.asarray(self.protection.verify_image(context, i, vector[slice(*context.bounds(i))]), dtype=np.uint32)
                for i in range(context.num_slices)
            ]
        )

    def _l2_units(self, scale: float, count: int) -> int | None:
        """The L2 bound in fixed-point units (what every party proves), or None without one."""
        if self.l2_bound is None:
            return None
        units = min(int(self.l2_bound * scale), 2**63 - 1)
        if units - count**0.5 / 2 < 1:
            raise ProtocolError(
                f"protection.l2_bound {self.l2_bound:g} is too small for {count} values at the fixed point 2^-"
                f"{np.log2(scale):.0f}: rounding alone may add sqrt({count})/2 units to the norm; raise it"
            )
        return units

    def observe(self, index: int, total: np.ndarray) -> None:
        """The decoded sum of slice ``index`` (fixed-point words), for the sum check."""
        if self._context is not None:
            self._sums[index] = np.array(total, dtype=np.uint32)

    def _statement(self, context, party: str) -> bytes:
        """What a party's proofs are bound to: job, round, attempt, party."""
        job, name = self.exchange.job_id.encode(), party.encode()
        return b"".join(
            [_DOMAIN, struct.pack("<I", len(job)), job, struct.pack("<II", context.round, context.attempt), name]
        )

    def _residual(
        self, context, peers: Sequence[str], included: Sequence[str], left_out: Sequence[str]
    ) -> tuple[tuple[list[bytes], list[bool]], float]:
        """The blinding keys that did not cancel: those of every survivor with the parties left out.

        A recovered round (``on_dropout: recover``) sums the survivors' words only, so the pair
        blindings between a survivor and a party left out remain in the survivors' commitments.
        Each survivor sends the others, sealed, its keys of this attempt with the parties left out
        (per attempt: they open nothing of another round; the survivors' blindings among
        themselves still hide each commitment). Returns ((keys, adds), seconds waited).
        """
        me, tag = self.exchange.party_id, f"bound-cut/{context.attempt}"
        self.protection.share(context.round, tag, b"".join(self._pairs[w] for w in left_out), list(peers))
        keys = [self._pairs[w] for w in left_out]
        adds = [me < w for w in left_out]
        messages, waited = gathered(
            peers,
            lambda peer: self.protection.collect(context.round, tag, peer, timeout=self.timeout_s),
            included,
            lambda peer: (
                f"round {context.round} attempt {context.attempt}: {peer!r} sent no blinding keys for the "
                f"parties left out ({', '.join(left_out)}) within {self.timeout_s:g} s; the sum cannot be checked "
                "without them"
            ),
        )
        for peer, data in messages.items():
            keys += _cut_keys(data, len(left_out), peer)
            adds += [peer < w for w in left_out]
        return (keys, adds), waited

    def settle(self, included: Sequence[str]) -> dict:
        """Check the ``included`` parties' proofs, then the sum; returns the round's figures.

        ``included``: the parties whose words are in the sum (the participants, less any a
        recovered round left out).
        """
        context, thread = self._context, self._thread
        if context is None or thread is None:
            raise ProtocolError("bound proofs: begin was not called for this attempt")
        thread.join()
        if isinstance(self._message, Exception):
            raise self._message
        mine = self._message
        me = self.exchange.party_id
        peers = [p for p in included if p != me]
        tag = f"bound/{context.attempt}"
        began = time.perf_counter()
        count = context.vector_length
        l2 = self.l2_units
        commitments = [_native.bound_verify(self._statement(context, me), mine, count, self.bits, False, l2)[0]]
        failed: dict[str, str] = {}
        messages, waited = gathered(
            peers,
            lambda peer: self.exchange.recv(context.round, tag, peer, timeout=self.timeout_s),
            included,
            lambda peer: (
                f"round {context.round} attempt {context.attempt}: {peer!r} sent no bound proofs within "
                f"{self.timeout_s:g} s after the sum; the sum cannot be checked without them"
            ),
        )
        for peer, data in messages.items():
            points, why = _native.bound_verify(self._statement(context, peer), data, count, self.bits, True, l2)
            if why:
                failed[peer] = why
            commitments.append(points)
        if failed:
            named = "; ".join(f"{peer!r}: {_why(why)}" for peer, why in sorted(failed.items()))
            raise BoundViolationError(
                f"round {context.round} attempt {context.attempt}: updates not proven within the bound "
                f"+-{self.limit:.6g} ({named}); the round runs again without them",
                sorted(failed),
                [p for p in included if p not in failed],
            )
        missing = [i for i in range(context.num_slices) if i not in self._sums]
        if missing:
            raise ProtocolError(f"bound proofs: combined slices {missing[:5]} were never decoded")
        sums = np.concatenate([self._sums[i] for i in range(context.num_slices)])
        left_out = sorted(p for p in context.participants if p not in included)
        residual, asked = self._residual(context, peers, included, left_out) if left_out else (([], []), 0.0)
        waited += asked
        wrong = _native.bound_check_sum(commitments, sums, self.ring_bits, self.bits, *residual)
        if wrong:
            raise BoundSumError(
                f"round {context.round} attempt {context.attempt}: the decoded sum at {len(wrong)} positions (first "
                f"{wrong[:5]}) is not the sum of the values the parties proved within +-{self.limit:.6g}: a party "
                "sent protected words other than the values it proved (a value past the bound, or out of its lane); "
                "the sum is refused"
            )
        checked = time.perf_counter() - began - waited
        self._context, self._sums = None, {}
        return {
            "bound_bits": self.bits,
            "bound_linf": self.limit,
            **({} if l2 is None else {"bound_l2": self.l2_bound}),
            "bound_prove_s": round(self.prove_seconds, 6),
            "bound_check_s": round(checked, 6),
            "bound_wait_s": round(waited, 6),
            "bound_bytes": len(mine),
        }


def _cut_keys(payload: bytes, count: int, peer: str) -> list[bytes]:
    if len(payload) != 16 * count:
        raise ProtocolError(f"bound proofs: {peer!r} sent {len(payload)} bytes of blinding keys for {count} parties")
    return [payload[16 * i : 16 * (i + 1)] for i in range(count)]


def _scale_into(vector: np.ndarray, radius: float) -> bool:
    """Scale ``vector`` (in place) into the L2 ball of ``radius``; whether it had to be."""
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    if norm <= radius:
        return False
    vector *= radius / norm * (1 - 1e-9)
    return True


def _why(why: str) -> str:
    if why == "norm":
        return "the proof that its update's L2 norm is within the bound does not verify"
    if why.startswith("chunk "):
        first = int(why.split()[1]) * 64
        return f"the proof of values {first}..{first + 63} does not verify"
    return f"malformed proofs ({why})"


def describe(requested: bool, mode: str, l2_bound: float | None = None) -> dict:
    """The report's ``bound`` entry: whether every update was proven within the bound."""
    if not requested:
        return {"ran": False, "reason": "protection.prove_bound is off"}
    entry = {
        "ran": True,
        "proof": "Bulletproofs (dalek bulletproofs 5), 32-bit aggregated range proofs of 64 values, ristretto255",
        "checks": "every peer's proofs, then the decoded sum against the parties' commitments",
        "mode": mode,
    }
    if l2_bound is None:
        entry["l2"] = {"ran": False, "reason": "protection.l2_bound is not set"}
    else:
        entry["l2"] = {
            "ran": True,
            "bound": l2_bound,
            "proof": "committed squares (a Sigma protocol per value on the range proofs' commitments) and a "
            "128-bit range proof that the bound's square minus their sum is not negative",
        }
    return entry
