"""paillier mode over the in-memory relay: key distribution, round-robin decryption, fallback."""

from __future__ import annotations

import base64
import math
import threading
import time

import numpy as np
import pytest

from confide.crypto import DecryptionKey, EncryptedVector, EncryptionKey, sum_encrypted
from confide.protect import paillier as paillier_module
from confide.protect.base import ProtectionParams, RoundContext, pack_parts
from confide.protect.paillier import PaillierProtection
from confide.v1 import runtime_pb2 as pb

from .harness import MemoryHub, fast_decryption_key, run_parallel

NAMES = ["alpha", "bravo", "charlie"]
LENGTH = 40_000
SLICE = 16_384
BITS = 16
# How long a party waits for a peer's decrypted share before taking the peer as gone: long enough
# that a live peer on a loaded 2-core host is never mistaken for a gone one (0.5 s was not).
SHARE_TIMEOUT_S = 3.0


class _BoundedKeyGeneration(DecryptionKey):
    """The leader's key generation without the heavy tail of the native generator (see the xfail below)."""

    __slots__ = ()

    @classmethod
    def generate(cls, bits: int = 2048) -> DecryptionKey:
        return fast_decryption_key(bits)


@pytest.fixture(autouse=True)
def bounded_key_generation(monkeypatch):
    monkeypatch.setattr(paillier_module, "DecryptionKey", _BoundedKeyGeneration)


class PaillierSession:
    """Three parties with PaillierProtection; the test plays the aggregator."""

    def __init__(
        self,
        federation,
        share_timeout_s: float = 10.0,
        with_fetch: bool = True,
        slice_length: int = SLICE,
        pipeline: bool = False,
    ):
        self.slice_length = slice_length
        #: Called as on_result(name, index) before combined slice ``index`` is handed to ``name``.
        self.on_result = lambda name, index: None
        self.hub = MemoryHub()
        self.params = ProtectionParams(key_bits=2048, bits=BITS, setup_timeout_s=10, share_timeout_s=share_timeout_s)
        self.exchanges = {name: self.hub.exchange(federation[name]) for name in NAMES}
        self.combined: dict[int, list[bytes]] = {}
        self.result_calls: list[tuple[str, int]] = []
        self.fetch_calls: list[tuple[str, list[int]]] = []
        self._lock = threading.Lock()
        self.parties = {
            name: PaillierProtection(
                self.exchanges[name], self.params, fetch=self._fetch_for(name) if with_fetch else None
            )
            for name in NAMES
        }
        for protection in self.parties.values():
            protection.pipeline = pipeline
        run_parallel({name: (lambda p=p: p.setup(NAMES)) for name, p in self.parties.items()})

    def context(self, name: str, attempt: int) -> RoundContext:
        return RoundContext(
            round=1,
            attempt=attempt,
            participants=NAMES,
            party_id=name,
            vector_length=LENGTH,
            slice_length=self.slice_length,
        )

    def _slice(self, attempt: int, index: int) -> pb.Slice:
        start = index * self.slice_length
        n_valid = min(self.slice_length, LENGTH - start)
        return pb.Slice(index=index, n_valid=n_valid, payload=self.combined[attempt][index])

    def _fetch_for(self, name: str):
        def fetch(context: RoundContext, indices: list[int]) -> list[pb.Slice]:
            with self._lock:
                self.fetch_calls.append((name, list(indices)))
            return [self._slice(context.attempt, i) for i in indices]

        return fetch

    def run(self, vectors: dict[str, np.ndarray], attempt: int = 0) -> dict[str, np.ndarray]:
        def encode(name: str) -> list[bytes]:
            protection, context = self.parties[name], self.context(name, attempt)
            protection.begin_round(context, vectors[name])
            return [
                protection.encode(context, i, vectors[name][slice(*context.bounds(i))])
                for i in range(context.num_slices)
            ]

        payloads = run_parallel({name: (lambda n=name: encode(n)) for name in NAMES})
        key = EncryptionKey.from_bytes(self.parties["alpha"].header_key())  # what the aggregator holds
        self.combined[attempt] = [
            sum_encrypted([EncryptedVector.from_bytes(payloads[name][i], key) for name in NAMES]).to_bytes()
            for i in range(len(payloads["alpha"]))
        ]

        def finish(name: str) -> np.ndarray:
            context = self.context(name, attempt)

            def result(index: int) -> pb.Slice:
                with self._lock:
                    self.result_calls.append((name, index))
                self.on_result(name, index)
                return self._slice(attempt, index)

            return self.parties[name].finish_round(context, result)

        return run_parallel({name: (lambda n=name: finish(n)) for name in NAMES})


def make_vectors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0.0, 0.01, LENGTH) for name in NAMES}


def check_aggregate(session: PaillierSession, vectors, results) -> None:
    alphas = {p.last_alpha for p in session.parties.values()}
    assert len(alphas) == 1, "parties disagree on the clipping threshold"
    alpha = alphas.pop()
    assert np.isfinite(alpha) and alpha > 0
    m = len(NAMES)
    reference = np.sum([np.clip(v, -alpha, alpha) for v in vectors.values()], axis=0)
    bound = 3 * alpha * m / 2 ** (BITS - 1) + 1e-7 * np.max(np.abs(reference))
    first = results[NAMES[0]]
    assert first.shape == (LENGTH,) and first.dtype == np.float64
    for name in NAMES:
        assert np.array_equal(results[name], first), f"{name} got another aggregate"
    assert np.max(np.abs(first - reference)) <= bound
    # dACIQ clips nothing at this spread for 16 bits, so the result is the plain sum within the bound
    truth = np.sum(list(vectors.values()), axis=0)
    if alpha >= max(np.max(np.abs(v)) for v in vectors.values()):
        assert np.max(np.abs(first - truth)) <= bound


@pytest.fixture
def session(federation):
    return PaillierSession(federation)


def test_setup_gives_everyone_the_same_key(session):
    keys = [p.encryption_key for p in session.parties.values()]
    assert all(k == keys[0] for k in keys)
    assert keys[0].bits == 2048
    assert {p.header_key() for p in session.parties.values()} == {keys[0].to_bytes()}
    assert EncryptionKey.from_bytes(session.parties["charlie"].header_key()) == keys[0]
    primes = {p._key.primes() for p in session.parties.values()}
    assert len(primes) == 1


def test_leader_secret_key_never_crosses_the_relay_in_the_clear(session):
    leader = session.parties[NAMES[0]]
    p, q = leader._key.primes()
    secret = leader._key.export_secret()
    needles = [secret, base64.b64encode(secret)]
    for prime in (p, q):
        raw = prime.to_bytes((prime.bit_length() + 7) // 8, "big")
        needles += [raw, raw[::-1], raw[:64], base64.b64encode(raw), hex(prime)[2:].encode(), str(prime).encode()]
    assert session.hub.log, "setup sent nothing?"
    for sent in session.hub.log:
        for needle in needles:
            assert needle not in sent.payload, f"secret material in {sent.tag!r} from {sent.sender}"
    group_messages = [s for s in session.hub.log if s.tag == "keys/group"]
    assert sorted(r for s in group_messages for r in s.recipients) == ["bravo", "charlie"]
    assert all(s.sender == "alpha" and len(s.recipients) == 1 for s in group_messages)


def test_round_robin_decryption_gives_every_party_the_aggregate(session):
    vectors = make_vectors(1)
    results = session.run(vectors)
    check_aggregate(session, vectors, results)
    num_slices = -(-LENGTH // SLICE)
    assert num_slices == 3
    # combined slice i went only to participant i mod 3, once
    assert sorted(session.result_calls) == sorted((NAMES[i % 3], i) for i in range(num_slices))
    assert session.fetch_calls == []
    assert all(p.local_fallbacks == 0 for p in session.parties.values())
    # shares travel under the group key: no float32 slice of the aggregate in the clear
    shares = [s for s in session.hub.log if s.tag == "shares.0/0"]
    assert {s.sender for s in shares} == set(NAMES)
    chunk = results["alpha"][:8].astype("<f4").tobytes()
    assert not any(chunk in s.payload for s in shares)
    report = session.parties["alpha"].report()
    assert report["mode"] == "paillier" and report["last_alpha"] == session.parties["alpha"].last_alpha


def test_new_attempt_reencrypts_and_still_aggregates(session):
    vectors = make_vectors(2)
    check_aggregate(session, vectors, session.run(vectors, attempt=0))
    check_aggregate(session, vectors, session.run(vectors, attempt=1))
    assert session.combined[0][0] != session.combined[1][0]


def test_missing_share_falls_back_to_local_decryption(federation):
    session = PaillierSession(federation, share_timeout_s=SHARE_TIMEOUT_S)
    session.exchanges["charlie"].drop = lambda round_number, tag: tag.startswith("shares")
    vectors = make_vectors(3)
    results = session.run(vectors)
    check_aggregate(session, vectors, results)
    assert session.parties["alpha"].local_fallbacks == 1
    assert session.parties["bravo"].local_fallbacks == 1
    assert session.parties["charlie"].local_fallbacks == 0
    assert sorted(session.fetch_calls) == [("alpha", [2]), ("bravo", [2])]
    assert sorted(session.result_calls) == [("alpha", 0), ("bravo", 1), ("charlie", 2)]


def test_with_the_pipeline_each_piece_is_shared_while_the_next_is_decrypted(federation):
    # 10 slices: alpha decrypts 0, 3, 6, 9 (4 pieces), bravo and charlie 3 each.
    session = PaillierSession(federation, slice_length=4096, pipeline=True)
    first_piece_sent = threading.Event()
    real_share = session.parties["alpha"].share

    def share(round_number, tag, payload, peers):
        real_share(round_number, tag, payload, peers)
        if tag == "shares.0/0":
            first_piece_sent.set()

    session.parties["alpha"].share = share
    overlapped: list[bool] = []
    # Without the overlap, alpha would share nothing before its last slice is decrypted.
    session.on_result = lambda name, index: (
        overlapped.append(first_piece_sent.wait(5.0)) if (name, index) == ("alpha", 9) else None
    )
    vectors = make_vectors(8)
    check_aggregate(session, vectors, session.run(vectors))
    assert overlapped == [True]
    tags = {(s.sender, s.tag) for s in session.hub.log if s.tag.startswith("shares")}
    assert tags == {("alpha", f"shares.{k}/0") for k in range(4)} | {
        (name, f"shares.{k}/0") for name in ("bravo", "charlie") for k in range(3)
    }
    assert session.fetch_calls == [] and all(p.local_fallbacks == 0 for p in session.parties.values())


def test_a_peer_gone_after_its_first_piece_has_the_rest_decrypted_locally(federation):
    session = PaillierSession(federation, share_timeout_s=SHARE_TIMEOUT_S, slice_length=4096, pipeline=True)
    session.exchanges["charlie"].drop = lambda round_number, tag: tag.startswith("shares") and tag != "shares.0/0"
    vectors = make_vectors(9)
    check_aggregate(session, vectors, session.run(vectors))
    # charlie's first piece (slice 2) arrived; slices 5 and 8 are fetched and decrypted, once per peer
    assert sorted(session.fetch_calls) == [("alpha", [5, 8]), ("bravo", [5, 8])]
    assert [session.parties[n].local_fallbacks for n in NAMES] == [1, 1, 0]


def test_share_pieces_cut_every_part_the_same_way_on_every_party():
    assert paillier_module.share_pieces([0, 3, 6, 9], 8) == [[0], [3], [6], [9]]
    assert paillier_module.share_pieces(list(range(10)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert paillier_module.share_pieces([4], 1) == [[4]]
    assert paillier_module.share_pieces([], 8) == [[]]
    for length in range(1, 40):
        for pieces in range(1, 10):
            cut = paillier_module.share_pieces(list(range(length)), pieces)
            assert [i for piece in cut for i in piece] == list(range(length))
            assert len(cut) == min(pieces, length) and all(cut)


def test_missing_share_without_fetch_is_a_protocol_error(federation):
    session = PaillierSession(federation, share_timeout_s=SHARE_TIMEOUT_S, with_fetch=False)
    session.exchanges["charlie"].drop = lambda round_number, tag: tag.startswith("shares")
    with pytest.raises(AssertionError, match="ProtocolError.*charlie"):
        session.run(make_vectors(4))


def test_share_holding_foreign_slices_is_refused(federation):
    session = PaillierSession(federation)
    vectors = make_vectors(5)
    real_share = session.parties["charlie"].share

    def wrong_share(round_number, tag, payload, peers):
        if tag.startswith("shares"):
            payload = pack_parts({0: np.zeros(SLICE, np.float32)})  # claims alpha's slice
        real_share(round_number, tag, payload, peers)

    session.parties["charlie"].share = wrong_share
    with pytest.raises(AssertionError, match="ProtocolError"):
        session.run(vectors)


@pytest.mark.exclusive  # 20 keys within 60 s: a bound on wall-clock time
def test_native_key_generation_meets_its_documented_bounds_without_a_heavy_tail():
    result: list = []

    def generate():
        for _ in range(20):
            result.append(DecryptionKey.generate(2048))

    worker = threading.Thread(target=generate, daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(60)
    assert len(result) == 20, f"only {len(result)} of 20 keys after {time.monotonic() - start:.0f} s"
    for key in result:
        p, q = key.primes()
        assert p.bit_length() == q.bit_length() == 1024
        assert p % 4 == q % 4 == 3
        assert abs(p - q) > 2 ** (1024 - 100), "documented |p - q| > 2^(k/2-100) (FIPS 186-4)"
        assert math.gcd(p - 1, q - 1) == 2
