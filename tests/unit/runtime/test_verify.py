"""Verifiable aggregation over an in-memory relay: honest sums pass, every lie of the aggregator fails.

The aggregator here is the test: it combines the parties' slices (a uint32 ring sum for the
masking modes, a float32 sum in a random order for plain) and then lies in one of the ways
confide.protect.verify is meant to catch.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide import _native
from confide.protect.base import ProtectionParams, RoundContext
from confide.protect.masking import GroupMask, SecAgg
from confide.protect.plain import Plain, widened
from confide.protect.verify import PRIME, VECTORS, VerificationError, Verifier, describe, integer_tags
from confide.spec import VERIFIED_MODES
from confide.v1 import runtime_pb2 as pb

from .harness import MemoryHub, run_parallel

PARAMS = ProtectionParams(setup_timeout_s=10, mask_bound=4.0, share_timeout_s=5.0)
MODES = {"plain": Plain, "secagg": SecAgg, "groupmask": GroupMask}


class Round:
    """m parties of one mode, each with a verifier, and an aggregator the test controls."""

    def __init__(self, mode, identities, names, length, slice_length, params=PARAMS):
        self.hub = MemoryHub()
        self.mode = mode
        self.names = list(names)
        self.length, self.slice_length = length, slice_length
        cls = MODES[mode]
        self.parties = {name: cls(self.hub.exchange(identities[name]), params) for name in self.names}
        for protection in self.parties.values():
            protection.verifier = Verifier(protection, timeout_s=params.share_timeout_s)
        run_parallel({name: (lambda p=p: p.setup(self.names)) for name, p in self.parties.items()})

    def context(self, name, round_number, attempt=0):
        return RoundContext(
            round=round_number,
            attempt=attempt,
            participants=self.names,
            party_id=name,
            vector_length=self.length,
            slice_length=self.slice_length,
            dtype="float32",
        )

    def encode(self, vectors, round_number):
        def work(name):
            protection, context = self.parties[name], self.context(name, round_number)
            protection.begin_round(context, vectors[name])
            return [
                protection.encode(context, i, vectors[name][slice(*context.bounds(i))])
                for i in range(context.num_slices)
            ]

        return run_parallel({name: (lambda n=name: work(n)) for name in self.names})

    def combine(self, payloads, order_seed=0, without=()):
        """The honest aggregator's combined slices (bytes), folding the parties in a shuffled order."""
        rng = np.random.default_rng(order_seed)
        names = [n for n in self.names if n not in without]
        out = []
        for index in range(len(payloads[self.names[0]])):
            order = rng.permutation(len(names))
            if self.mode == "plain":
                total = np.zeros(len(payloads[names[0]][index]) // 4, dtype=np.float32)
                for k in order:
                    total += np.frombuffer(payloads[names[k]][index], dtype="<f4")
            else:
                total = np.zeros(len(payloads[names[0]][index]) // 4, dtype=np.uint32)
                for k in order:
                    total += np.frombuffer(payloads[names[k]][index], dtype="<u4")
            out.append(total.tobytes())
        return out

    def finish(self, vectors, round_number, served):
        """Every party decodes what ``served(name, index)`` delivers, then settles; returns outcomes."""

        def work(name):
            protection, context = self.parties[name], self.context(name, round_number)
            protection.verifier.begin(context, vectors[name])

            def result(index):
                payload = served(name, index)
                return pb.Slice(index=index, n_valid=len(payload) // 4, payload=payload)

            aggregate = protection.finish_round(context, result)
            try:
                stats = protection.verifier.settle(self.names, lambda i: f"node-{i % 2}")
            except VerificationError as error:
                return error
            return aggregate, stats

        outcomes = {}

        def keep(name):
            outcomes[name] = work(name)

        run_parallel({name: (lambda n=name: keep(n)) for name in self.names})
        return outcomes


def vectors_for(names, length, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return {name: (rng.normal(0.0, scale, length)).astype(np.float32) for name in names}


def honest(outcomes):
    return {name: o for name, o in outcomes.items() if not isinstance(o, VerificationError)}


# -- the tags themselves ----------------------------------------------------------------------


def test_integer_tags_are_inner_products_mod_p_with_the_public_challenge():
    digest = bytes(range(32))
    words = np.random.default_rng(1).integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32)
    for bits in (32, 19):
        residues = words & np.uint32((1 << bits) - 1) if bits < 32 else words
        signed = [int(w) - (1 << bits) if int(w) >= 1 << (bits - 1) else int(w) for w in residues]
        for k, tag in enumerate(integer_tags(residues, bits, digest)):
            r = _native.verify_challenge_words(digest[:16], k, words.size).astype(np.int64) & 0x7FFFFFFF
            assert tag == sum(int(a) * b for a, b in zip(r, signed, strict=True)) % PRIME


def test_float_checks_follow_the_challenge():
    values = np.linspace(-3, 3, 2001, dtype=np.float32)
    sums = 3 * values
    digest, sum_tags, tags, weights = _native.verify_check_float(b"prefix", b"payload", sums, values, VECTORS)
    assert digest == hashlib.sha256(b"prefixpayload").digest()
    for k in range(VECTORS):
        r = _native.verify_challenge_words(digest[:16], k, values.size).astype(np.float64) * 2.0**-31 - 1.0
        assert tags[k] == pytest.approx(float(np.dot(r, values)), rel=1e-12, abs=1e-9)
        assert sum_tags[k] == pytest.approx(float(np.dot(r, sums)), rel=1e-12, abs=1e-9)
        assert weights[k] == pytest.approx(float(np.dot(np.abs(r), np.abs(values))), rel=1e-12)


def test_bad_tag_key_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="key"):
        _native.verify_integer_tags(np.zeros(4, dtype=np.uint32), 32, b"short", 2)
    with pytest.raises(ValueError, match="bits"):
        _native.verify_integer_tags(np.zeros(4, dtype=np.uint32), 40, bytes(16), 2)


def test_every_verified_mode_has_an_arithmetic():
    from confide.protect import MODES as ALL

    for name, cls in ALL.items():
        assert (cls.verify_arithmetic is not None) == (name in VERIFIED_MODES), name


# -- honest rounds never fail -------------------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(
    mode=st.sampled_from(sorted(MODES)),
    parties=st.integers(2, 4),
    length=st.integers(1, 3000),
    slices=st.integers(1, 4),
    scale=st.sampled_from([1e-4, 0.1, 1.0, 3.9]),
    seed=st.integers(0, 2**16),
)
def test_honest_rounds_always_verify(federation, mode, parties, length, slices, scale, seed):
    names = list(federation)[:parties]
    session = Round(mode, federation, names, length, max(1, -(-length // slices)))
    vectors = vectors_for(names, length, seed, scale)
    combined = session.combine(session.encode(vectors, 1), order_seed=seed)
    outcomes = session.finish(vectors, 1, lambda name, index: combined[index])
    assert len(honest(outcomes)) == parties, {n: str(o) for n, o in outcomes.items() if n not in honest(outcomes)}
    for aggregate, stats in outcomes.values():
        assert stats["verified_slices"] == session.context(names[0], 1).num_slices
        bound = np.inf if mode == "plain" else PARAMS.mask_bound  # the masking modes clip to it
        truth = np.sum([np.clip(v, -bound, bound) for v in vectors.values()], axis=0)
        assert np.allclose(aggregate, truth, atol=1e-3 * parties)


def test_honest_round_verifies_after_a_narrow_wire(federation):
    names = list(federation)[:3]
    for wire in ("float16", "bfloat16", "int8"):
        session = Round("plain", federation, names, 2000, 700, ProtectionParams(wire=wire, share_timeout_s=5.0))
        vectors = vectors_for(names, 2000, seed=4)
        payloads = session.encode(vectors, 1)
        # The aggregator widens each slice to float32, then sums (as the data plane does).
        combined = []
        for index in range(3):
            start, stop = session.context(names[0], 1).bounds(index)
            total = np.zeros(stop - start, dtype=np.float32)
            for name in names:
                total += widened(vectors[name][start:stop], wire)
            combined.append(total.tobytes())
        assert payloads  # encoded in the wire format; the sums above are what the data plane returns
        outcomes = session.finish(vectors, 1, lambda name, index, combined=combined: combined[index])
        assert len(honest(outcomes)) == 3, wire


# -- every lie fails, at every party ----------------------------------------------------------


def _lies(session, vectors, payloads, combined, earlier):
    names = session.names

    def altered(name, index):
        if index != 1:
            return combined[index]
        if session.mode == "plain":
            # Float sums are checked to float32 rounding (m * 2^-24 of the slice's weighted L1 norm):
            # a change of 0.01 in one value is far above it.
            values = np.frombuffer(combined[index], dtype="<f4").copy()
            values[2] += np.float32(0.01)
            return values.tobytes()
        words = bytearray(combined[index])
        words[8] ^= 0x01  # the least bit of one value: integer sums are checked exactly
        return bytes(words)

    dropped = session.combine(payloads, without=[names[-1]])
    swapped = [combined[1], combined[0], *combined[2:]]
    return {
        "altered": altered,
        "dropped": lambda name, index: dropped[index],
        "replayed": lambda name, index: earlier[index],
        "swapped": lambda name, index: swapped[index],
        "equivocated": lambda name, index: altered(name, index) if name == names[0] else combined[index],
    }


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_lie_of_the_aggregator_is_caught_by_every_party(federation, mode):
    names = list(federation)[:3]
    session = Round(mode, federation, names, 1500, 512)
    vectors = vectors_for(names, 1500, seed=7)
    earlier_vectors = vectors_for(names, 1500, seed=8)
    earlier = session.combine(session.encode(earlier_vectors, 1))
    payloads = session.encode(vectors, 2)
    combined = session.combine(payloads)
    for lie, served in _lies(session, vectors, payloads, combined, earlier).items():
        outcomes = session.finish(vectors, 2, served)
        caught = {name: o for name, o in outcomes.items() if isinstance(o, VerificationError)}
        assert set(caught) == set(names), f"{lie}: only {sorted(caught)} caught it"
        for error in caught.values():
            assert "node-" in str(error), (lie, str(error))
            assert "refused" in str(error)


def test_a_peer_that_sends_no_tags_aborts_the_attempt_without_it(federation):
    from confide.errors import RoundAbortedError

    names = list(federation)[:3]
    session = Round("secagg", federation, names, 600, 300, ProtectionParams(setup_timeout_s=10, share_timeout_s=0.5))
    vectors = vectors_for(names, 600, seed=3)
    combined = session.combine(session.encode(vectors, 1))
    silent = names[2]
    session.parties[silent].exchange.drop = lambda round_number, tag: tag.startswith("verify/")
    protection = session.parties[names[0]]
    context = session.context(names[0], 1)

    def everyone():
        def work(name):
            p = session.parties[name]
            p.verifier.begin(session.context(name, 1), vectors[name])
            p.finish_round(session.context(name, 1), lambda i: pb.Slice(index=i, n_valid=300, payload=combined[i]))
            try:
                p.verifier.settle(names)
            except RoundAbortedError as aborted:
                return aborted
            return None

        return run_parallel({n: (lambda n=n: work(n)) for n in names})

    outcomes = everyone()
    assert outcomes[names[0]].dropped == [silent] and outcomes[names[1]].dropped == [silent]
    assert context.num_slices == 2 and protection.verifier is not None


def test_report_says_what_ran_and_what_did_not(federation):
    names = list(federation)[:2]
    session = Round("secagg", federation, names, 10, 10)
    ran = describe(session.parties[names[0]], "auto")
    assert ran["ran"] is True and ran["arithmetic"] == "integer"
    protection = session.parties[names[0]]
    protection.verifier = None
    assert describe(protection, "off")["ran"] is False and "trusted" in describe(protection, "off")["reason"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_native_per_slice_check_equals_the_reference_path(federation, dtype):
    # The fixed-point modes' fast path encodes the party's values natively: it must give the same
    # commitment and tags as hashing in Python and tagging the mode's own encoding.
    names = list(federation)[:2]
    session = Round("secagg", federation, names, 3000, 3000)
    protection = session.parties[names[0]]
    context = session.context(names[0], 1)
    values = np.random.default_rng(5).normal(0, 2.0, 3000).astype(dtype)  # some past the bound of 4
    protection.begin_round(context, values)
    words = protection.verify_image(context, 0, values)
    total = (words * np.uint32(3)).astype(np.uint32)
    payload = b"the delivered slice"
    verifier = protection.verifier
    verifier.begin(context, values)
    verifier.observe(0, payload, total)
    verifier.checked()  # the check runs on the verifier's worker
    entry = verifier._slices[0]
    digest = verifier.commitment(context, 0, payload)
    assert entry.digest == digest
    assert entry.sums == integer_tags(total, 32, digest)
    assert entry.tags == integer_tags(words, 32, digest)


def test_a_malformed_tag_message_is_refused_saying_what_was_expected():
    from confide.protect.verify import pack_tags, unpack_tags

    good = pack_tags([(bytes(16), [1, 2])], 2)
    assert unpack_tags(good, 1, 2) == [(bytes(16), (1, 2))]
    for data, words in [
        (good[:-1], "43 bytes, expected 44 for 1 slices of 2 fields"),
        (b"XXXX" + good[4:], "not b'CVT1'"),
        (good[:4] + struct.pack("<II", 1, 3) + good[12:], "declares 1 slices of 3 fields, expected 1 of 2"),
    ]:
        with pytest.raises(VerificationError, match=words.replace("(", r"\(").replace(")", r"\)")) as error:
            unpack_tags(data, 1, 2)
        assert error.value.kind == "message"
