"""Fixed-point encoding and the mask algebra of secagg and groupmask, over an in-memory relay."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.crypto.fixedpoint import FixedPoint
from confide.errors import EncodingError
from confide.protect.base import ProtectionParams, RoundContext
from confide.protect.masking import GroupMask, SecAgg
from confide.v1 import runtime_pb2 as pb

from .harness import MemoryHub, run_parallel

# Agreement mode (mask_bound=None): the bound is the largest magnitude, nothing is clipped.
PARAMS = ProtectionParams(setup_timeout_s=10, mask_bound=None)


# ---------------------------------------------------------------------------------------------------------------------
# FixedPoint


def _sum_words(words: list[np.ndarray]) -> np.ndarray:
    total = np.zeros_like(words[0])
    for w in words:
        np.add(total, w, out=total)
    return total


@settings(max_examples=80, deadline=None)
@given(
    exponent=st.floats(-20, 24),
    mantissa=st.floats(1.0, 2.0),
    parties=st.integers(1, 64),
    data=st.data(),
)
def test_fixed_point_sum_round_trip(exponent, mantissa, parties, data):
    bound = mantissa * 2.0**exponent
    fixed = FixedPoint(bound, parties)
    assert 0 <= fixed.fraction_bits <= 40
    assert parties * fixed.bound * fixed.scale < 2**31
    units = st.one_of(st.sampled_from([-1.0, 1.0, 0.0]), st.floats(-1.0, 1.0))
    width = data.draw(st.integers(1, 8), label="width")
    values = [
        np.array(data.draw(st.lists(units, min_size=width, max_size=width), label=f"party {p}")) * bound
        for p in range(parties)
    ]
    words = [fixed.encode(v) for v in values]
    assert all(w.dtype == np.uint32 and w.shape == (width,) for w in words)
    decoded = fixed.decode(_sum_words(words))
    expected = np.sum(values, axis=0)
    tolerance = parties / 2.0 ** (fixed.fraction_bits + 1) + 1e-12 * parties * bound
    assert np.all(np.abs(decoded - expected) <= tolerance)


@settings(max_examples=40, deadline=None)
@given(bound=st.floats(1e-6, 1e6), parties=st.integers(1, 1000))
def test_fixed_point_uses_the_largest_safe_fraction(bound, parties):
    fixed = FixedPoint(bound, parties)
    effective = max(bound, 2.0**-20)
    assert parties * effective * 2.0**fixed.fraction_bits <= 2**31 - 1
    if fixed.fraction_bits < 40:
        assert parties * effective * 2.0 ** (fixed.fraction_bits + 1) > (2**31 - 1) * (1 - 1e-12)


def test_fixed_point_single_value_round_trip():
    fixed = FixedPoint(1.0, 1)
    values = np.array([-1.0, -0.5, 0.0, 1e-9, 0.25, 1.0])
    assert np.allclose(fixed.decode(fixed.encode(values)), values, atol=1 / 2**fixed.fraction_bits)


def test_fixed_point_zero_bound_is_allowed():
    fixed = FixedPoint(0.0, 3)
    assert fixed.fraction_bits == 40
    assert np.all(fixed.decode(_sum_words([fixed.encode(np.zeros(4))] * 3)) == 0)


@pytest.mark.parametrize("bound,parties", [(2.0**31, 1), (2.0**30, 2), (1e9, 3), (1e6, 10_000)])
def test_fixed_point_rejects_bound_times_parties_too_big(bound, parties):
    with pytest.raises(EncodingError, match="2\\^31"):
        FixedPoint(bound, parties)


@pytest.mark.parametrize("bound", [math.inf, math.nan, -1.0])
def test_fixed_point_rejects_bad_bound(bound):
    with pytest.raises(EncodingError, match="bound"):
        FixedPoint(bound, 2)


def test_fixed_point_sum_at_the_bound_does_not_wrap():
    bound = 1073741823.5 / 2**20  # B * 2^f = (2^31 - 1) / 2 for f = 20
    fixed = FixedPoint(bound, 2)
    values = np.array([bound])
    decoded = fixed.decode(_sum_words([fixed.encode(values), fixed.encode(values)]))
    assert abs(decoded[0] - 2 * bound) <= 2 / 2.0 ** (fixed.fraction_bits + 1)


# ---------------------------------------------------------------------------------------------------------------------
# The protocol over an in-memory relay


class Session:
    """m parties running one protection class through the in-memory relay."""

    def __init__(self, cls, identities, names, vector_length, slice_length, params=PARAMS):
        self.hub = MemoryHub()
        self.names = list(names)
        self.vector_length = vector_length
        self.slice_length = slice_length
        self.parties = {name: cls(self.hub.exchange(identities[name]), params) for name in self.names}
        run_parallel({name: (lambda p=p: p.setup(self.names)) for name, p in self.parties.items()})

    def context(self, name: str, attempt: int, round_number: int = 1) -> RoundContext:
        return RoundContext(
            round=round_number,
            attempt=attempt,
            participants=self.names,
            party_id=name,
            vector_length=self.vector_length,
            slice_length=self.slice_length,
        )

    def encode(self, vectors: dict[str, np.ndarray], attempt: int) -> dict[str, list[bytes]]:
        def work(name: str) -> list[bytes]:
            protection, context = self.parties[name], self.context(name, attempt)
            protection.begin_round(context, vectors[name])
            return [
                protection.encode(context, i, vectors[name][slice(*context.bounds(i))])
                for i in range(context.num_slices)
            ]

        return run_parallel({name: (lambda n=name: work(n)) for name in self.names})

    @staticmethod
    def combine(payloads: dict[str, list[bytes]]) -> list[np.ndarray]:
        slices = zip(*payloads.values(), strict=True)
        return [_sum_words([np.frombuffer(p, dtype="<u4") for p in per_party]) for per_party in slices]

    def finish(self, combined: list[np.ndarray], attempt: int) -> dict[str, np.ndarray]:
        def result(index: int) -> pb.Slice:
            words = combined[index]
            return pb.Slice(index=index, n_valid=words.size, payload=words.tobytes())

        def work(name: str) -> np.ndarray:
            return self.parties[name].finish_round(self.context(name, attempt), result)

        return run_parallel({name: (lambda n=name: work(n)) for name in self.names})


def make_vectors(names, length, seed=0, scale=1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0.0, scale, length) for name in names}


def fixed_for(vectors) -> FixedPoint:
    return FixedPoint(max(float(np.max(np.abs(v))) for v in vectors.values()), len(vectors))


def resolution(fixed: FixedPoint, parties: int) -> float:
    return parties / 2.0 ** (fixed.fraction_bits + 1) + 1e-9


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


@pytest.mark.parametrize("count", [3, 4])
def test_secagg_recovers_the_sum_and_hides_each_update(federation, count):
    names = list(federation)[:count]
    session = Session(SecAgg, federation, names, vector_length=5000, slice_length=1024)
    vectors = make_vectors(names, 5000, seed=count)
    payloads = session.encode(vectors, attempt=0)
    assert all(len(p) == 5 for p in payloads.values())
    assert [len(s) for s in payloads[names[0]]] == [4096] * 4 + [4 * 904]

    fixed = fixed_for(vectors)
    truth = np.sum(list(vectors.values()), axis=0)
    combined = session.combine(payloads)
    # the aggregator's view of the sum already decodes (secagg reveals the sum)...
    assert np.max(np.abs(fixed.decode(np.concatenate(combined)) - truth)) <= resolution(fixed, count)
    # ...and every party's finish_round returns it
    for name, aggregate in session.finish(combined, attempt=0).items():
        assert aggregate.shape == (5000,) and aggregate.dtype == np.float64
        assert np.max(np.abs(aggregate - truth)) <= resolution(fixed, count), name
    # a single masked update says nothing about the party's vector
    for name in names:
        alone = fixed.decode(np.frombuffer(b"".join(payloads[name]), dtype="<u4"))
        assert abs(correlation(alone, vectors[name])) < 0.2, name
        # uniform words decode to noise across the whole ring (+-m*B), not near the vector
        assert np.median(np.abs(alone - vectors[name])) > 0.5 * fixed.bound


def test_secagg_new_attempt_gives_new_masks(federation):
    names = list(federation)[:3]
    session = Session(SecAgg, federation, names, vector_length=3000, slice_length=1000)
    vectors = make_vectors(names, 3000, seed=1)
    first = session.encode(vectors, attempt=0)
    second = session.encode(vectors, attempt=1)
    fixed = fixed_for(vectors)
    truth = np.sum(list(vectors.values()), axis=0)
    for name in names:
        a = np.frombuffer(b"".join(first[name]), dtype="<u4")
        b = np.frombuffer(b"".join(second[name]), dtype="<u4")
        assert np.mean(a == b) < 0.01, name
    for result in session.finish(session.combine(second), attempt=1).values():
        assert np.max(np.abs(result - truth)) <= resolution(fixed, 3)


def test_secagg_same_attempt_is_deterministic(federation):
    names = list(federation)[:3]
    session = Session(SecAgg, federation, names, vector_length=100, slice_length=64)
    vectors = make_vectors(names, 100, seed=2)
    assert session.encode(vectors, attempt=0) == session.encode(vectors, attempt=0)


@pytest.mark.parametrize("cls", [SecAgg, GroupMask])
def test_bound_exchange_is_hidden_from_the_relay(federation, cls):
    names = list(federation)[:3]
    session = Session(cls, federation, names, vector_length=200, slice_length=64)
    vectors = make_vectors(names, 200, seed=3)
    session.encode(vectors, attempt=0)
    bound_messages = [s for s in session.hub.log if s.tag == "bound/0"]
    assert bound_messages
    for name, vector in vectors.items():
        local = struct.pack("<d", float(np.max(np.abs(vector))))
        assert not any(local in s.payload for s in bound_messages), name


@pytest.mark.parametrize("count", [3, 4])
def test_groupmask_hides_even_the_sum(federation, count):
    names = list(federation)[:count]
    session = Session(GroupMask, federation, names, vector_length=5000, slice_length=2048)
    vectors = make_vectors(names, 5000, seed=10 + count)
    payloads = session.encode(vectors, attempt=0)
    fixed = fixed_for(vectors)
    truth = np.sum(list(vectors.values()), axis=0)
    combined = session.combine(payloads)
    # what the aggregator computes is padded: no resemblance to the true sum
    raw = fixed.decode(np.concatenate(combined))
    assert abs(correlation(raw, truth)) < 0.2
    assert np.median(np.abs(raw - truth)) > 0.5 * fixed.bound
    for name in names:
        alone = fixed.decode(np.frombuffer(b"".join(payloads[name]), dtype="<u4"))
        assert abs(correlation(alone, vectors[name])) < 0.2, name
    # the parties remove the pad R and decode the sum
    for name, aggregate in session.finish(combined, attempt=0).items():
        assert np.max(np.abs(aggregate - truth)) <= resolution(fixed, count), name


def test_groupmask_new_attempt_gives_new_pads(federation):
    names = list(federation)[:3]
    session = Session(GroupMask, federation, names, vector_length=3000, slice_length=1000)
    vectors = make_vectors(names, 3000, seed=4)
    first = session.encode(vectors, attempt=0)
    second = session.encode(vectors, attempt=1)
    for name in names:
        a = np.frombuffer(b"".join(first[name]), dtype="<u4")
        b = np.frombuffer(b"".join(second[name]), dtype="<u4")
        assert np.mean(a == b) < 0.01, name
    sum_first = np.concatenate(session.combine(first))
    sum_second = np.concatenate(session.combine(second))
    assert np.mean(sum_first == sum_second) < 0.01
    fixed = fixed_for(vectors)
    truth = np.sum(list(vectors.values()), axis=0)
    for result in session.finish(session.combine(second), attempt=1).values():
        assert np.max(np.abs(result - truth)) <= resolution(fixed, 3)


def test_groupmask_group_key_never_crosses_the_relay_in_the_clear(federation):
    names = list(federation)[:3]
    session = Session(GroupMask, federation, names, vector_length=10, slice_length=10)
    group_key = session.parties[names[0]]._group_key
    assert len(group_key) == 32
    assert all(p._group_key == group_key for p in session.parties.values())
    assert not any(group_key in s.payload for s in session.hub.log)


def test_masking_aggregate_of_tiny_and_zero_vectors(federation):
    names = list(federation)[:3]
    session = Session(SecAgg, federation, names, vector_length=7, slice_length=3)
    vectors = {name: np.zeros(7) for name in names}
    vectors[names[1]][3] = 1e-7
    payloads = session.encode(vectors, attempt=0)
    truth = np.sum(list(vectors.values()), axis=0)
    for aggregate in session.finish(session.combine(payloads), attempt=0).values():
        assert np.allclose(aggregate, truth, atol=1e-9)


@pytest.mark.parametrize("cls", [SecAgg, GroupMask])
def test_public_mask_bound_needs_no_message_and_counts_what_it_clips(federation, cls):
    names = list(federation)[:3]
    params = ProtectionParams(setup_timeout_s=10, mask_bound=2.0)
    session = Session(cls, federation, names, vector_length=3000, slice_length=1024, params=params)
    vectors = make_vectors(names, 3000, seed=5, scale=0.3)
    vectors[names[0]][:7] = 50.0  # beyond the bound: clipped, and counted
    sent_before = len(session.hub.log)
    contexts = {}

    def encode(name):
        protection, context = session.parties[name], session.context(name, 0)
        protection.begin_round(context, vectors[name])
        contexts[name] = context
        return [protection.encode(context, i, vectors[name][slice(*context.bounds(i))]) for i in range(3)]

    payloads = run_parallel({name: (lambda n=name: encode(n)) for name in names})
    assert len(session.hub.log) == sent_before, "a public bound needs no message before the slices"
    assert contexts[names[0]].stats["clipped"] == 7
    assert contexts[names[1]].stats["clipped"] == 0
    combined = session.combine(payloads)
    clipped = {n: np.clip(v, -2.0, 2.0) for n, v in vectors.items()}
    truth = np.sum(list(clipped.values()), axis=0)
    fixed = FixedPoint(2.0, 3)
    for aggregate in session.finish(combined, attempt=0).values():
        assert np.max(np.abs(aggregate - truth)) <= resolution(fixed, 3)
