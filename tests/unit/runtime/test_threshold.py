"""threshold mode over the in-memory relay: t-of-m decryption per slice, a cheater named, a silent party.

The key is dealt here (keygen: dealer) to keep the round tests quick; the distributed key
generation runs between processes in tests/integration/test_modes.py and at small sizes in
tests/unit/crypto/test_threshold.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from confide.crypto import EncryptedVector, EncryptionKey, sum_encrypted
from confide.crypto import threshold as th
from confide.errors import ConfideError, ProtocolError
from confide.protect import make_protection
from confide.protect import threshold as threshold_module
from confide.protect.base import ProtectionParams, RoundContext
from confide.protect.verify import VerificationError
from confide.v1 import runtime_pb2 as pb

from .harness import PARTIES, MemoryHub, run_parallel

LENGTH = 20_000
SLICE = 4_096
BITS = 16


class ThresholdSession:
    """m parties with ThresholdProtection; the test plays the aggregator."""

    def __init__(self, federation, names, threshold, share_timeout_s=10.0):
        self.names = names
        self.hub = MemoryHub()
        self.params = ProtectionParams(
            key_bits=2048,
            bits=BITS,
            setup_timeout_s=30,
            share_timeout_s=share_timeout_s,
            threshold=threshold,
            keygen="dealer",
        )
        self.parties = {
            name: make_protection("threshold", self.hub.exchange(federation[name]), self.params) for name in names
        }
        run_parallel({name: (lambda p=p: p.setup(names)) for name, p in self.parties.items()}, timeout=120)
        self.round = 0

    def run(self, vectors, members=None, skip_finish=(), substitute=None, only_slice=None, outcomes=False):
        members = members or self.names
        self.round += 1  # the hub keeps every message: a fresh round per run
        round_number = self.round

        def context(name):
            return RoundContext(
                round=round_number,
                attempt=0,
                participants=members,
                party_id=name,
                vector_length=LENGTH,
                slice_length=SLICE,
            )

        def encode(name):
            protection, ctx = self.parties[name], context(name)
            protection.begin_round(ctx, vectors[name])
            return [protection.encode(ctx, i, vectors[name][slice(*ctx.bounds(i))]) for i in range(ctx.num_slices)]

        payloads = run_parallel({name: (lambda n=name: encode(n)) for name in members})
        key = EncryptionKey.from_bytes(self.parties[members[0]].header_key())
        combined = [
            sum_encrypted([EncryptedVector.from_bytes(payloads[name][i], key) for name in members]).to_bytes()
            for i in range(len(payloads[members[0]]))
        ]
        if substitute is not None:  # a malicious aggregator passes one party's slices off as the sum
            combined = [
                payloads[substitute][i] if only_slice in (None, i) else block for i, block in enumerate(combined)
            ]

        def finish(name):
            ctx = context(name)
            try:
                return self.parties[name].finish_round(ctx, lambda i: pb.Slice(index=i, payload=combined[i]))
            except Exception as error:  # noqa: BLE001 - each party's outcome, for the test
                if not outcomes:
                    raise
                return error

        return run_parallel({n: (lambda n=n: finish(n)) for n in members if n not in skip_finish}, timeout=120)


def vectors_for(names, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0.0, 0.01, LENGTH) for name in names}


@pytest.fixture(scope="module")
def session(federation):
    return ThresholdSession(federation, PARTIES[:3], threshold=2)


@pytest.mark.slow
def test_every_party_gets_the_sum_and_reports_what_ran(session):
    vectors = vectors_for(session.names)
    results = session.run(vectors)
    truth = np.sum(list(vectors.values()), axis=0)
    alpha = session.parties[session.names[0]].last_alpha
    bound = 3 * alpha * 3 / 2 ** (BITS - 1) + 1e-6
    first = results[session.names[0]]
    for name in session.names:
        assert np.array_equal(results[name], first)
    assert np.max(np.abs(first - np.sum([np.clip(v, -alpha, alpha) for v in vectors.values()], axis=0))) <= bound
    assert np.max(np.abs(first - truth)) < 0.01
    report = session.parties[session.names[0]].report()
    assert report["mode"] == "threshold"
    assert report["threshold"] == 2 and report["parties"] == 3 and report["colluders_tolerated"] == 1
    assert report["keygen"].startswith("dealer")
    assert "nobody" in report["secret_key_holders"]


@pytest.mark.slow
def test_each_party_partially_decrypts_only_its_t_of_m_share_of_slices(session, monkeypatch):
    calls = []
    real = threshold_module.partial_decrypt

    def counting(key, vector, **kwargs):
        calls.append(key.index)
        return real(key, vector, **kwargs)

    monkeypatch.setattr(threshold_module, "partial_decrypt", counting)
    session.run(vectors_for(session.names, seed=1))
    slices = -(-LENGTH // SLICE)
    assert len(calls) == 2 * slices  # t partial decryptions per slice, no more
    assert sorted(set(calls)) == [1, 2, 3]


@pytest.mark.slow
def test_a_party_sending_a_wrong_partial_decryption_is_named(session, monkeypatch):
    real = threshold_module.partial_decrypt

    def lying(key, vector, **kwargs):
        partial = real(key, vector, **kwargs)
        if key.index == 2:  # bravo
            n2 = key.public.n_squared
            partial = replace(partial, values=(partial.values[0] * 3 % n2, *partial.values[1:]))
        return partial

    monkeypatch.setattr(threshold_module, "partial_decrypt", lying)
    # bravo combines its own (lying) partial without a proof check and may fail first, on its own
    # sums: that failure is its own business. The honest parties must name it, whatever the threads'
    # order (CI once saw bravo's EncodingError reported first).
    bravo = session.parties["bravo"]
    bravo_finish = bravo.finish_round

    def cheater_finish(context, result):
        try:
            return bravo_finish(context, result)
        except ConfideError:
            return None

    monkeypatch.setattr(bravo, "finish_round", cheater_finish)
    with pytest.raises(AssertionError) as caught:
        session.run(vectors_for(session.names, seed=2))
    error = caught.value.__cause__
    assert isinstance(error, th.CheatingPartyError)
    assert error.party == "bravo"
    assert "proof fails" in str(error)


def test_a_decryptor_missing_at_decryption_is_a_clear_error(federation):
    session = ThresholdSession(federation, PARTIES[:3], threshold=2, share_timeout_s=3.0)
    with pytest.raises(AssertionError) as caught:
        session.run(vectors_for(session.names, seed=3), skip_finish=("charlie",))
    error = caught.value.__cause__
    assert isinstance(error, ProtocolError)
    # charlie died after sending its slices to the aggregator: the others name it, whichever of its
    # messages (its copy of a slice, its partial decryptions, its decoded sums) they were waiting for.
    assert "'charlie' sent no" in str(error) or "combiner 'charlie'" in str(error)


def test_a_round_with_fewer_than_t_participants_is_refused(federation):
    session = ThresholdSession(federation, PARTIES[:4], threshold=3)
    members = PARTIES[:2]
    with pytest.raises(AssertionError) as caught:
        session.run(vectors_for(members, seed=4), members=members)
    assert "needs 3 of the 4 key holders; only 2 took part" in str(caught.value.__cause__)


@pytest.mark.slow
def test_a_round_of_survivors_still_decrypts_with_t_of_them(federation):
    session = ThresholdSession(federation, PARTIES[:4], threshold=2)
    members = [PARTIES[0], PARTIES[2], PARTIES[3]]  # bravo dropped out
    vectors = vectors_for(members, seed=5)
    results = session.run(vectors, members=members)
    truth = np.sum(list(vectors.values()), axis=0)
    assert np.max(np.abs(results[members[0]] - truth)) < 0.01


def test_an_aggregator_passing_one_partys_slice_off_as_the_sum_gets_nothing_decrypted(session, monkeypatch):
    decrypted = []
    real = threshold_module.partial_decrypt

    def watching(key, vector, **kwargs):
        decrypted.append(key.index)
        return real(key, vector, **kwargs)

    monkeypatch.setattr(threshold_module, "partial_decrypt", watching)
    with pytest.raises(AssertionError) as caught:
        session.run(vectors_for(session.names, seed=6), substitute="alpha")
    assert "is not the product of the participants' slices" in str(caught.value.__cause__)
    assert decrypted == []


def test_a_refused_slice_is_refused_by_every_party_not_only_its_decryptors(session):
    """Slice 1 (of 5) is substituted: its decryptors (bravo, charlie; t = 2 of 3) refuse it and tell
    the others; alpha, not among them, refuses the round at once on that notice, naming the slice."""
    outcomes = session.run(vectors_for(session.names, seed=7), substitute="alpha", only_slice=1, outcomes=True)
    for name in ("bravo", "charlie"):
        assert isinstance(outcomes[name], VerificationError), (name, outcomes[name])
        assert "combined slice 1 is not the product" in str(outcomes[name]) and outcomes[name].slices == [1]
    refused = outcomes["alpha"]
    assert isinstance(refused, VerificationError), refused
    assert "a decryptor of combined slice 1, refused it" in str(refused) and refused.slices == [1]
