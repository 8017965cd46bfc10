"""Threshold Paillier: distributed key generation, t-of-m decryption, proofs that name a cheater.

Key generation runs at 512 bits over an in-memory channel (every party in its own thread) so the
protocol's algebra is checked quickly; tests/integration/test_modes.py runs it at 2048 bits
between processes. The native engine needs 2048-bit keys, so the packed path uses the dealer.
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import gmpy2
import numpy as np
import pytest

from confide.crypto import BatchCryptCodec, encrypt_packed, sum_encrypted
from confide.crypto import threshold as th
from confide.crypto.threshold import keygen as th_keygen
from confide.errors import InvalidParameterError, ProtocolError

BITS = 512


def generate(parties: int, threshold: int, bits: int = BITS):
    hub = th.LocalChannels(parties, timeout=300)
    keys, errors = {}, []

    def run(i):
        try:
            keys[i] = th.generate_threshold_key(hub.channel(i), bits=bits, threshold=threshold, batch=256)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(1, parties + 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    return [keys[i] for i in range(1, parties + 1)], hub


@pytest.fixture(scope="module")
def three():
    return generate(3, 2)


@pytest.fixture(scope="module")
def five():
    return generate(5, 3)


def test_spent_modulus_batches_are_released_as_the_generation_goes(three):
    # Every party frees batch k-1 once all peers' batch k arrived, and the rest after the modulus:
    # over the relay that bounds what the relay and each process hold (the CI once filled the
    # relay's 2 GiB cap with about 170 unreleased batches of a long generation).
    _, hub = three
    assert not [key for key in hub._boxes if key[2].startswith("dkg/modulus/")]
    assert [key for key in hub._boxes if key[2].startswith("dkg/secret/")], "later steps are not released"


def test_at_most_two_batches_are_held_while_many_run():
    # Without the sieve, at 128 bits and two candidates a batch, a modulus takes ~250 batches on
    # average; a lucky draw can find one within a few (about 2% of runs), which exercises nothing,
    # so such a run is drawn again (three lucky runs in a row: about 1 in 100,000).
    for _ in range(3):
        out, batches, held = _find_modulus_counting_held_batches()
        assert len(out) == 3
        if batches >= 5:
            break
    assert batches >= 5, "two candidates a batch: several batches are needed"
    assert max(held) <= 3  # this batch, the last, and a fast peer's next


def _find_modulus_counting_held_batches() -> tuple[dict, int, list[int]]:
    """Three parties find a 128-bit modulus unsieved; (results, batches run, batches held at each send)."""
    hub = th.LocalChannels(3, timeout=120)
    held: list[int] = []

    class Counting(th_keygen.Channel):
        def __init__(self, inner):
            self.inner, self.index, self.parties = inner, inner.index, inner.parties

        def send(self, to, tag, payload):
            self.inner.send(to, tag, payload)
            with hub._lock:
                held.append(len({k[2].split("/")[2] for k in hub._boxes if k[2].startswith("dkg/modulus/")}))

        def broadcast(self, tag, payload):
            for to in range(1, self.parties + 1):
                if to != self.index:
                    self.send(to, tag, payload)

        def recv(self, sender, tag):
            return self.inner.recv(sender, tag)

        def release(self, prefix):
            self.inner.release(prefix)

    out = {}
    threads = [
        threading.Thread(
            target=lambda i=i: out.update({i: th_keygen._find_modulus(Counting(hub.channel(i)), 128, 2, sieve=False)})
        )
        for i in (1, 2, 3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    batches = max(int(k[2].split("/")[2]) for k in hub._boxes if k[2].startswith("dkg/modulus/"))
    return out, batches, held


@pytest.mark.parametrize("parties", [3, 4, 5])
def test_sieved_candidates_are_3_mod_4_of_the_full_size_and_free_of_the_sieves_primes(parties):
    # Distributed sieving: the parties' additive shares of p sum to a number with no prime factor
    # of M (the primes above the party count), 3 mod 4, with its top two bits set. Three, four and
    # five parties: one, one and two resharing exchanges before the additive shares.
    half, count = BITS // 2, 200
    primes = th_keygen._sieve_primes(half, parties)
    modulus = math.prod(primes)
    assert all(modulus % r for r in range(2, parties + 1)) and modulus % int(gmpy2.next_prime(parties)) == 0
    hub = th.LocalChannels(parties, timeout=120)
    out = {}
    threads = [
        threading.Thread(
            target=lambda i=i: out.update({i: th_keygen._candidate_shares(hub.channel(i), "t", half, count, primes)})
        )
        for i in range(1, parties + 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(out) == parties
    for which in (0, 1):
        candidates = [sum(out[i][which][k] for i in out) for k in range(count)]
        assert all(math.gcd(c, modulus) == 1 for c in candidates)
        assert all(c % 4 == 3 and c >> (half - 2) == 0b11 for c in candidates)
        assert len(set(candidates)) == count
        # no party's own share is the candidate
        assert not any(out[1][which][k] == candidates[k] for k in range(count))
    plain = [th_keygen._candidate_shares(hub.channel(i), "u", half, count, ())[0] for i in out]
    unsieved = [sum(shares) for shares in zip(*plain, strict=True)]
    # The sieve is what removed them: unsieved, a candidate is coprime to M with probability
    # f = prod(1 - 1/p) (0.36 for 3 parties, 0.45 for 5); five standard deviations above f * count
    # (a chance of about 3e-7) is still far below the sieved count, all of them.
    f = math.prod(1 - 1 / p for p in primes)
    bound = count * f + 5 * math.sqrt(count * f * (1 - f))
    assert sum(math.gcd(c, modulus) == 1 for c in unsieved) < bound < count


def test_a_party_sending_short_sieve_residues_is_named():
    hub = th.LocalChannels(3, timeout=5)  # party 2 itself then waits for the exchange the others quit
    primes = th_keygen._sieve_primes(BITS // 2, 3)

    class Short(th_keygen.Channel):
        def __init__(self, inner):
            self.inner, self.index, self.parties = inner, inner.index, inner.parties

        def send(self, to, tag, payload):
            self.inner.send(to, tag, payload[:-2] if tag.endswith("/sieve/0") else payload)

        def recv(self, sender, tag):
            return self.inner.recv(sender, tag)

    errors = {}

    def run(i):
        channel = Short(hub.channel(i)) if i == 2 else hub.channel(i)
        try:
            th_keygen._candidate_shares(channel, "t", BITS // 2, 8, primes)
        except ProtocolError as error:
            errors[i] = error

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    named = {i: e for i, e in errors.items() if isinstance(e, th.CheatingPartyError)}
    assert set(named) == {1, 3}
    assert all(e.party == 2 and "sieve residues" in str(e) for e in named.values())


def test_the_sieve_cuts_the_expected_candidates_tenfold_at_2048_bits():
    assert th_keygen.expected_candidates(2048, 3, sieve=False) == pytest.approx(125_948, rel=0.01)
    assert th_keygen.expected_candidates(2048, 3) < 10_500
    assert th_keygen.expected_candidates(2048, 10) < 22_000


def test_every_party_ends_with_the_same_public_key_and_its_own_share(three):
    keys, _ = three
    public = keys[0].public
    assert all(k.public == public for k in keys)
    assert public.n.bit_length() == BITS
    assert len({k.share for k in keys}) == 3
    assert public.threshold == 2 and public.parties == 3 and not public.dealer
    assert "share=<redacted>" in repr(keys[0])
    with pytest.raises(TypeError, match="cannot be pickled"):
        __import__("pickle").dumps(keys[0])


@pytest.mark.parametrize("fixture", ["three", "five"])
@pytest.mark.slow
def test_any_t_parties_decrypt(fixture, request):
    keys, _ = request.getfixturevalue(fixture)
    public = keys[0].public
    values = [0, 1, 42, public.n - 1, 2**200 + 7]
    ciphertexts = th.encrypt_integers(public, values)
    partials = [th.partial_decrypt(k, ciphertexts) for k in keys]
    for partial in partials:
        th.verify_partial(public, ciphertexts, partial)
    t = public.threshold
    import itertools

    for subset in itertools.combinations(partials, t):
        assert th.combine_partials(public, list(subset)) == values


def test_the_joint_modulus_is_a_product_of_two_primes_nobody_was_given():
    # Step 1 alone, with each party's additive shares returned so the test (and only the test)
    # can add them up: p and q are primes of half the size, 3 mod 4, and N = pq has exactly k bits.
    hub = th.LocalChannels(3, timeout=300)
    out = {}

    def run(i):
        out[i] = th_keygen._find_modulus(hub.channel(i), BITS, 256)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert len(out) == 3
    moduli = {out[i][0] for i in out}
    assert len(moduli) == 1
    n = moduli.pop()
    p = sum(out[i][1] for i in out)
    q = sum(out[i][2] for i in out)
    assert p * q == n and n.bit_length() == BITS
    assert gmpy2.is_prime(p) and gmpy2.is_prime(q)
    assert p % 4 == 3 and q % 4 == 3
    for i in out:  # no party's own shares are a factor
        assert math.gcd(out[i][1], n) == 1 and math.gcd(out[i][2], n) == 1


def test_fewer_than_t_parties_plus_the_aggregator_cannot_decrypt(five):
    # t-1 = 2 colluders hold their shares, their partial decryptions and every ciphertext
    # the aggregator saw; combining what they have with any coefficients fails.
    keys, _ = five
    public = keys[0].public
    secret = 123456789
    ciphertexts = th.encrypt_integers(public, [secret])
    colluders = keys[:2]
    partials = [th.partial_decrypt(k, ciphertexts) for k in colluders]
    with pytest.raises(ProtocolError, match="needs 3 partial decryptions"):
        th.combine_partials(public, partials)
    n, n2 = public.n, public.n_squared
    scale = pow(4 * public.delta**2 * public.theta % n, -1, n)
    # Every Lagrange-style combination of the two partials over small integer weights misses.
    for a in range(-6, 7):
        for b in range(-6, 7):
            value = gmpy2.powmod(partials[0].values[0], a, n2) * gmpy2.powmod(partials[1].values[0], b, n2) % n2
            assert (int(value) - 1) // n * scale % n != secret
    # Two shares together do not form a multiple of phi(N) usable as a decryption exponent.
    exponent = 2 * public.delta * (colluders[0].share + colluders[1].share)
    value = int(gmpy2.powmod(ciphertexts[0], exponent, n2))
    assert (value - 1) % n != 0 or (value - 1) // n * scale % n != secret


@pytest.mark.slow
def test_no_party_view_holds_the_factors(three):
    # Each party's view: its own shares plus every payload it received. None of the numbers in
    # it shares a factor with N (a factor of N, or a multiple of one, would reveal p or q).
    keys, hub = three
    n = keys[0].public.n
    for index in range(1, 4):
        for payload in hub.received[index]:
            # Read the payload as integers of the widths a multiple of a factor fits in: the factors
            # have BITS/2 bits (32 bytes), the modulus 64 and the sharing field 65. Narrower reads
            # (1 and 8 bytes were here) cannot share a factor with N and took 53 s of the test's 64.
            for width in (BITS // 16, BITS // 8, BITS // 8 + 1, BITS // 8 + 2):
                for offset in range(0, max(1, len(payload) - width + 1), width):
                    value = int.from_bytes(payload[offset : offset + width], "big")
                    if value > 1:
                        assert math.gcd(value, n) in (1, n)
        assert math.gcd(keys[index - 1].share, n) == 1
    # And no single share decrypts.
    ciphertext = th.encrypt_integers(keys[0].public, [5])[0]
    for key in keys:
        value = int(gmpy2.powmod(ciphertext, key.share, keys[0].public.n_squared))
        assert (value - 1) % n != 0 or (value - 1) // n != 5


def test_a_wrong_partial_decryption_is_detected_and_named(three):
    keys, _ = three
    public = keys[0].public
    ciphertexts = th.encrypt_integers(public, [3, 4, 5])
    honest = th.partial_decrypt(keys[1], ciphertexts)
    forged_values = list(honest.values)
    forged_values[2] = forged_values[2] * 2 % public.n_squared
    forged = replace(honest, values=tuple(forged_values))
    with pytest.raises(th.CheatingPartyError, match="party 2") as caught:
        th.verify_partial(public, ciphertexts, forged)
    assert caught.value.party == 2
    # A share that is not the party's own fails too, even with a self-consistent proof.
    impostor = th.ThresholdKey(public, 2, keys[0].share)
    with pytest.raises(th.CheatingPartyError, match="party 2"):
        th.verify_partial(public, ciphertexts, th.partial_decrypt(impostor, ciphertexts))
    # The error survives pickling (it crosses Ray and process boundaries).
    import pickle

    again = pickle.loads(pickle.dumps(caught.value))
    assert again.party == 2 and "party 2" in str(again)


def test_partial_decryption_round_trips_and_rejects_bad_bytes(three):
    keys, _ = three
    public = keys[0].public
    ciphertexts = th.encrypt_integers(public, [9])
    partial = th.partial_decrypt(keys[0], ciphertexts)
    assert th.PartialDecryption.from_bytes(partial.to_bytes(public.n), public.n) == partial
    with pytest.raises(ProtocolError):
        th.PartialDecryption.from_bytes(partial.to_bytes(public.n)[:-3], public.n)
    with pytest.raises(ProtocolError, match="outside"):
        th.PartialDecryption.from_bytes(
            partial.to_bytes(public.n)[:6] + b"\x00" * 128 + partial.to_bytes(public.n)[134:], public.n
        )
    assert th.ThresholdPublicKey.from_bytes(public.to_bytes()) == public


@pytest.mark.parametrize(
    ("parties", "threshold", "message"),
    [
        (3, 4, "must not exceed"),
        (3, 1, "at least 2"),
        (5, 4, r"at most \(parties \+ 1\) // 2 = 3"),
        (1, 2, "parties must be at least 2"),
    ],
)
def test_impossible_thresholds_are_clear_errors(parties, threshold, message):
    with pytest.raises(InvalidParameterError, match=message):
        th.check_threshold(parties, threshold)


def test_dealer_fallback_lifts_the_majority_cap_and_says_so():
    keys = th.deal_threshold_keys(4, 4, bits=BITS)
    public = keys[0].public
    assert public.dealer
    ciphertexts = th.encrypt_integers(public, [77])
    partials = [th.partial_decrypt(k, ciphertexts) for k in keys]
    for partial in partials:
        th.verify_partial(public, ciphertexts, partial)
    assert th.combine_partials(public, partials) == [77]
    with pytest.raises(ProtocolError, match="needs 4"):
        th.combine_partials(public, partials[:3])


def test_packed_vectors_decrypt_on_the_native_engine():
    keys = th.deal_threshold_keys(3, 2, bits=2048)
    public = keys[0].public
    key = public.encryption_key()
    rng = np.random.default_rng(3)
    updates = [rng.normal(0, 0.1, 1000) for _ in range(3)]
    codec = BatchCryptCodec(bits=16, max_parties=3, alpha=0.5)
    total = sum_encrypted([encrypt_packed(u, codec, key) for u in updates])
    partials = [th.partial_decrypt(k, total) for k in keys[1:]]
    for partial in partials:
        th.verify_partial(public, total, partial)
    values = th.decrypt_packed_threshold(public, total, partials)
    assert np.allclose(values, np.clip(updates, -0.5, 0.5).sum(axis=0), atol=3 * 3 * 0.5 / 2**14)
    with pytest.raises(ProtocolError, match="needs 2"):
        th.decrypt_packed_threshold(public, total, partials[:1])


def test_partial_decryption_on_the_selected_engine_equals_the_native_one(monkeypatch):
    """c^(2 Delta d_j) on the GPU engine (its kernels' CPU build stands in) equals the native power."""
    from confide.crypto import gpu

    keys = th.deal_threshold_keys(3, 2, bits=2048)
    public = keys[0].public
    codec = BatchCryptCodec(bits=16, max_parties=3, alpha=0.5)
    total = encrypt_packed(np.linspace(-0.4, 0.4, 250), codec, public.encryption_key())  # 3 ciphertexts
    native = th.partial_decrypt(keys[1], total)
    gpu.reset_engine()
    monkeypatch.setitem(gpu._STATE, "choice", gpu.EngineChoice("gpu:cpu-reference", gpu.CpuBackend, "test"))
    monkeypatch.setattr(gpu, "GPU_MIN_PLAINTEXTS", 2)
    try:
        on_engine = th.partial_decrypt(keys[1], total)
        assert gpu.engine_report()["gpu_batches"] == 1
    finally:
        gpu.reset_engine()
    assert on_engine.values == native.values
    th.verify_partial(public, total, on_engine)
