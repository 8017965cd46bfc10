"""SecAgg dropout recovery: Shamir shares, the SecAgg+ graph, and dropouts at every protocol step.

The aggregator is simulated as the real one behaves: it sums the words of the parties that
uploaded (mod 2^32) and, for a party that sent nothing, excludes it (zero words in its place) and
says so. Each test drops a party at one step and checks that the survivors get the sum of
exactly the parties whose words are in it, and what a coalition smaller than t learns.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.crypto import shamir
from confide.crypto.fixedpoint import FixedPoint
from confide.errors import ProtocolError, RoundAbortedError
from confide.protect.base import ProtectionParams, RoundContext
from confide.protect.keys import decode_fields
from confide.protect.masking import SecAgg
from confide.protect.recovery import default_degree, default_threshold, neighbour_graph
from confide.transport.certs import Identity, init_federation
from confide.v1 import runtime_pb2 as pb

from .harness import MemoryHub, run_parallel

NAMES8 = [f"site-{i}" for i in range(8)]


@pytest.fixture(scope="module")
def eight(tmp_path_factory) -> dict[str, Identity]:
    root = tmp_path_factory.mktemp("eight")
    init_federation(root, parties=NAMES8)
    return {name: Identity.load(root, name) for name in NAMES8}


# ---------------------------------------------------------------------------------------------------------------------
# Shamir


@settings(max_examples=40, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), n=st.integers(1, 12), data=st.data())
def test_any_t_shares_rebuild_the_secret(secret, n, data):
    t = data.draw(st.integers(1, n), label="t")
    holders = data.draw(st.lists(st.integers(1, 2**32 - 1), min_size=n, max_size=n, unique=True), label="holders")
    shares = shamir.split(secret, holders, t)
    chosen = data.draw(st.permutations(holders), label="order")[:t]
    assert shamir.reconstruct({x: shares[x] for x in chosen}, t) == secret


def test_fewer_than_t_shares_fit_every_secret():
    # t - 1 shares plus any claimed secret define a degree t-1 polynomial: the shares carry no information.
    secret, t = bytes(range(32)), 3
    shares = shamir.split(secret, [1, 2, 3, 4], t)
    with pytest.raises(ProtocolError, match="2 shares arrived, 3 are needed"):
        shamir.reconstruct({1: shares[1], 2: shares[2]}, t)
    for other in (bytes(32), b"\xff" * 32):
        # Interpolate through (0, other), (1, s1), (2, s2) and read the value at 3: a consistent fourth share.
        points = [
            (0, int.from_bytes(other, "big")),
            (1, int.from_bytes(shares[1], "big")),
            (2, int.from_bytes(shares[2], "big")),
        ]
        p = shamir.PRIME
        at3 = 0
        for i, (xi, yi) in enumerate(points):
            term = yi
            for j, (xj, _) in enumerate(points):
                if i != j:
                    term = term * (3 - xj) * pow(xi - xj, -1, p) % p
            at3 = (at3 + term) % p
        forged = {1: shares[1], 2: shares[2], 3: at3.to_bytes(shamir.SHARE_BYTES, "big")}
        assert shamir.reconstruct(forged, t) == other


def test_bad_shares_are_refused_by_name():
    with pytest.raises(ProtocolError, match="holder 1 has 3 bytes"):
        shamir.reconstruct({1: b"abc"}, 1, "b")
    with pytest.raises(ValueError, match="threshold must be in"):
        shamir.split(bytes(32), [1, 2], 3)
    with pytest.raises(ValueError, match="distinct"):
        shamir.split(bytes(32), [1, 1], 1)


# ---------------------------------------------------------------------------------------------------------------------
# The neighbour graph


@pytest.mark.parametrize("m", [2, 3, 16, 17, 40, 200])
def test_graph_is_symmetric_and_as_dense_as_asked(m):
    names = [f"p{i}" for i in range(m)]
    graph = neighbour_graph("job", names, 3, 0, None)
    for p, near in graph.items():
        assert p not in near
        assert all(p in graph[q] for q in near)
    degrees = {len(v) for v in graph.values()}
    assert degrees == {default_degree(m)}
    if m <= 16:
        assert degrees == {m - 1}
    assert neighbour_graph("job", names, 3, 0, None) == graph  # every party computes the same one
    if m > 16:
        assert neighbour_graph("job", names, 3, 1, None) != graph  # a new attempt, a new graph


# ---------------------------------------------------------------------------------------------------------------------
# The protocol with dropouts


class Round:
    """m parties of secagg with recovery over the in-memory relay, and a simulated aggregator."""

    def __init__(self, identities, names, *, neighbours=None, length=3000, slice_length=1000, timeout=3.0):
        self.hub = MemoryHub()
        self.names = list(names)
        self.length, self.slice_length = length, slice_length
        self.params = ProtectionParams(
            setup_timeout_s=10, mask_bound=4.0, recover=True, neighbours=neighbours, recovery_timeout_s=timeout
        )
        self.parties = {n: SecAgg(self.hub.exchange(identities[n]), self.params) for n in self.names}
        run_parallel({n: (lambda p=p: p.setup(self.names)) for n, p in self.parties.items()})
        rng = np.random.default_rng(len(names))
        self.vectors = {n: rng.uniform(-1, 1, length) for n in self.names}
        self.contexts: dict[str, RoundContext] = {}

    def context(self, name: str) -> RoundContext:
        return self.contexts.setdefault(
            name,
            RoundContext(
                round=1,
                attempt=0,
                participants=self.names,
                party_id=name,
                vector_length=self.length,
                slice_length=self.slice_length,
            ),
        )

    def upload(self, names) -> dict[str, list[np.ndarray]]:
        """begin_round (shares sent) then encode every slice, for ``names``."""

        def work(name):
            protection, context = self.parties[name], self.context(name)
            protection.begin_round(context, self.vectors[name])
            return [
                np.frombuffer(protection.encode(context, i, self.vectors[name][slice(*context.bounds(i))]), "<u4")
                for i in range(context.num_slices)
            ]

        return run_parallel({n: (lambda n=n: work(n)) for n in names})

    def share_only(self, names) -> None:
        """begin_round only: shares sent, nothing uploaded (a party that dies before its first slice)."""
        run_parallel({n: (lambda n=n: self.parties[n].begin_round(self.context(n), self.vectors[n])) for n in names})

    def finish(self, uploads, excluded, finishers, *, told=None):
        combined = [sum(parts, np.zeros(len(parts[0]), np.uint32)) for parts in zip(*uploads.values(), strict=True)]

        def work(name):
            context = self.context(name)
            context.excluded = lambda: list((told or {}).get(name, excluded))

            def result(index):
                return pb.Slice(index=index, n_valid=combined[index].size, payload=combined[index].tobytes())

            return self.parties[name].finish_round(context, result)

        return run_parallel({n: (lambda n=n: work(n)) for n in finishers}, timeout=60)

    def truth(self, names) -> np.ndarray:
        return np.sum([np.clip(self.vectors[n], -4, 4) for n in names], axis=0)

    def tolerance(self) -> float:
        fixed = FixedPoint(4.0, len(self.names))
        return len(self.names) / 2.0 ** (fixed.fraction_bits + 1) + 1e-9

    def opened(self, recipient: str, tag_prefix: str) -> dict[str, dict]:
        """What ``recipient`` received under tags starting with ``tag_prefix``, opened with its keys."""
        out = {}
        for (_round, tag, sender, to), payload in self.hub.boxes.items():
            if to == recipient and tag.startswith(tag_prefix):
                plain = self.parties[recipient].keys.open_from(sender, tag, payload)
                out[sender] = decode_fields(plain)
        return out


def test_no_dropout_sums_and_the_aggregator_sees_only_masked_words(federation):
    names = list(federation)
    session = Round(federation, names)
    uploads = session.upload(names)
    results = session.finish(uploads, [], names)
    truth = session.truth(names)
    for name, aggregate in results.items():
        assert np.max(np.abs(aggregate - truth)) <= session.tolerance(), name
    # Unlike plain secagg, the aggregator's sum is itself masked (self masks): it decodes to noise.
    combined = np.concatenate([sum(p, np.zeros(len(p[0]), np.uint32)) for p in zip(*uploads.values(), strict=True)])
    seen = FixedPoint(4.0, len(names)).decode(combined)
    assert np.median(np.abs(seen - truth)) > 1.0
    assert session.context(names[0]).stats["neighbours"] == len(names) - 1


def test_dropout_before_sharing_is_excluded_without_retry(federation):
    names = list(federation)
    session = Round(federation, names)
    uploads = session.upload(names[:3])  # the fourth party never started the round
    results = session.finish(uploads, [names[3]], names[:3])
    for aggregate in results.values():
        assert np.max(np.abs(aggregate - session.truth(names[:3]))) <= session.tolerance()
    assert session.context(names[0]).stats["excluded"] == [names[3]]


def test_dropout_after_sharing_before_upload(federation):
    names = list(federation)
    session = Round(federation, names)
    session.share_only([names[1]])  # its shares went out, then it died before its first slice
    uploads = session.upload([n for n in names if n != names[1]])
    survivors = [n for n in names if n != names[1]]
    results = session.finish(uploads, [names[1]], survivors)
    for aggregate in results.values():
        assert np.max(np.abs(aggregate - session.truth(survivors))) <= session.tolerance()


def test_dropout_after_upload_rebuilds_its_self_mask_from_shares(federation):
    names = list(federation)
    session = Round(federation, names, timeout=2.0)
    uploads = session.upload(names)  # everyone's words are in the sum...
    results = session.finish(uploads, [], names[1:])  # ...then the first party died before unmasking
    for name, aggregate in results.items():
        assert np.max(np.abs(aggregate - session.truth(names))) <= session.tolerance(), name
        assert session.context(name).stats["rebuilt_from_shares"] == 1


def test_dropout_midway_through_unmasking(federation):
    names = list(federation)
    session = Round(federation, names, timeout=2.0)
    uploads = session.upload(names[:3])
    # The third party confirms the view, then dies before revealing anything.
    session.parties[names[2]].exchange.drop = lambda round_number, tag: tag.startswith("secagg/reveal")
    results = run_parallel(
        {
            "finish": lambda: session.finish(uploads, [names[3]], names[:2]),
            "dying": lambda: _swallow(lambda: session.finish(uploads, [names[3]], [names[2]]), timeout=10),
        }
    )["finish"]
    for aggregate in results.values():
        assert np.max(np.abs(aggregate - session.truth(names[:3]))) <= session.tolerance()


def _swallow(fn, timeout):
    try:
        fn()
    except AssertionError:
        pass  # the dying party's own finish is not under test


@pytest.mark.parametrize("step", ["before-sharing", "after-sharing", "after-upload"])
def test_sparse_graph_survives_a_dropout_at_each_step(eight, step):
    names = NAMES8
    session = Round(eight, names, neighbours=4, timeout=2.0)
    graph = neighbour_graph("job-1", names, 1, 0, 4)
    assert all(len(v) == 4 for v in graph.values())
    victim = names[5]
    others = [n for n in names if n != victim]
    if step == "before-sharing":
        uploads, excluded, contributors = session.upload(others), [victim], others
    elif step == "after-sharing":
        session.share_only([victim])
        uploads, excluded, contributors = session.upload(others), [victim], others
    else:
        uploads, excluded, contributors = session.upload(names), [], names
    results = session.finish(uploads, excluded, others)
    for name, aggregate in results.items():
        assert np.max(np.abs(aggregate - session.truth(contributors))) <= session.tolerance(), name
        # Only neighbours mask with each other: 4 pairwise keystreams per party, not 7.
        assert len(session.parties[name]._round_keys) == 4


def test_views_that_differ_reveal_nothing(federation):
    names = list(federation)
    session = Round(federation, names, timeout=2.0)
    uploads = session.upload(names[:3])
    told = {names[0]: [names[3]], names[1]: [names[3]], names[2]: []}  # a lying aggregator
    with pytest.raises(AssertionError, match="different views"):
        session.finish(uploads, [names[3]], names[:3], told=told)
    assert not [s for s in session.hub.log if s.tag.startswith("secagg/reveal")]


def test_too_few_survivors_to_confirm_an_exclusion_retry_and_reveal_nothing(federation):
    # Three parties tolerate one colluder (t = 2): all three must confirm an exclusion, so two survivors cannot.
    names = list(federation)[:3]
    session = Round(federation, names, timeout=1.0)
    uploads = session.upload(names[:2])
    with pytest.raises(AssertionError, match="RoundAbortedError: round attempt not recoverable"):
        session.finish(uploads, [names[2]], names[:2])
    assert not [s for s in session.hub.log if s.tag.startswith(("secagg/reveal", "secagg/view"))]


def test_a_lying_aggregator_and_a_colluder_cannot_open_one_party(federation):
    """The aggregator tells alpha nobody was excluded and the others that alpha was; charlie colludes.

    charlie confirms each story to the parties told it. alpha cannot gather enough confirmations
    (3 of 4) and reveals nothing; the others reveal their pair keys with alpha, but no share of
    alpha's self mask leaves an honest party, so alpha's words stay masked.
    """
    names = list(federation)  # alpha, bravo, charlie, delta
    alpha, bravo, charlie, delta = names
    session = Round(federation, names, timeout=1.5)
    uploads = session.upload(names)
    colluder = session.parties[charlie]
    view_tag = "secagg/view/0"
    colluder.share(1, view_tag, b'{"excluded": []}', [alpha])
    colluder.share(1, view_tag, b'{"excluded": ["alpha"]}', [bravo, delta])

    outcomes: dict[str, BaseException | None] = {}

    def run(name, told):
        context = session.context(name)
        context.excluded = lambda: told
        combined = [sum(parts, np.zeros(len(parts[0]), np.uint32)) for parts in zip(*uploads.values(), strict=True)]

        def result(index):
            return pb.Slice(index=index, n_valid=combined[index].size, payload=combined[index].tobytes())

        try:
            session.parties[name].finish_round(context, result)
            outcomes[name] = None
        except BaseException as error:  # noqa: BLE001 - recorded for the assertions
            outcomes[name] = error

    threads = {
        alpha: lambda: run(alpha, []),
        bravo: lambda: run(bravo, [alpha]),
        delta: lambda: run(delta, [alpha]),
    }
    # The relay is the aggregator: it holds back bravo's and delta's views from alpha.
    _suppress_views_to(session, alpha, from_parties=(bravo, delta))
    run_parallel(threads, timeout=60)
    assert isinstance(outcomes[alpha], RoundAbortedError), outcomes[alpha]
    assert not [x for x in session.hub.log if x.sender == alpha and x.tag.startswith("secagg/reveal")]
    # What charlie holds of alpha's self mask: its own share, and none from bravo or delta.
    revealed = session.opened(charlie, "secagg/reveal")
    assert all("b/alpha" not in fields for fields in revealed.values())
    assert shamir_threshold(session) == 2  # one share (charlie's own) is below t


def shamir_threshold(session) -> int:
    return default_threshold(len(session.names) - 1)


def _suppress_views_to(session, recipient, from_parties):
    for sender in from_parties:
        exchange = session.parties[sender].exchange
        exchange.drop = None
        original_send = exchange.send

        def send(round_number, tag, payload, recipients, original_send=original_send):
            if tag.startswith("secagg/view") and recipient in recipients:
                recipients = [r for r in recipients if r != recipient]
                if not recipients:
                    return
            original_send(round_number, tag, payload, recipients)

        exchange.send = send


def test_an_excluded_party_refuses_to_unmask(federation):
    names = list(federation)
    session = Round(federation, names, timeout=1.0)
    uploads = session.upload(names[:3])
    session.share_only([names[3]])  # slow, not dead: it started the round and was given up on
    with pytest.raises(AssertionError, match="was excluded"):
        session.finish(uploads, [names[3]], [names[3]])


@pytest.mark.parametrize("excluded", [False, True])
def test_fewer_than_t_colluders_learn_nothing_beyond_the_sum(eight, excluded):
    """Everything t - 1 colluding parties receive leaves each honest party's words masked.

    Their view: their own keys, the shares sent to them, and every reveal. A party's upload is
    open to them only if they hold its self mask *and* every one of its pair keys (or can rebuild
    them from t shares); the test checks that no honest party is in that state, except that an
    excluded one's self mask is never revealed.
    """
    names = NAMES8
    session = Round(eight, names, neighbours=4, timeout=2.0)
    victim_dropped = names[6] if excluded else None
    contributors = [n for n in names if n != victim_dropped]
    if victim_dropped:
        session.share_only([victim_dropped])  # slow, not dead: its shares are out, its words never arrived
    uploads = session.upload(contributors)
    session.finish(uploads, [victim_dropped] if excluded else [], contributors)
    graph = neighbour_graph("job-1", names, 1, 0, 4)
    t = default_threshold(4)
    for coalition in itertools.combinations(names, t - 1):
        learned: dict[str, set[str]] = {n: set() for n in names}  # secrets of each party the coalition holds
        held: dict[tuple[str, str], int] = {}  # (owner, secret) -> shares of it the coalition holds
        for member in coalition:
            for sender, fields in session.opened(member, "secagg/shares").items():
                for name in fields:
                    held[(sender, name)] = held.get((sender, name), 0) + 1
            for sender, fields in session.opened(member, "secagg/reveal").items():
                for name in fields:
                    parts = name.split("/")
                    if parts[0] == "self":  # the sender's own secret: self/b, self/k/<w>
                        learned[sender].add("/".join(parts[1:]))
                    else:  # a share of another's secret (counted as learned: an over-estimate)
                        learned[parts[1]].add("/".join([parts[0], *parts[2:]]))
        for (owner, secret), count in held.items():
            if count >= t:
                learned[owner].add(secret)
        for target in contributors:
            if target in coalition:
                continue
            # Pair keys the coalition knows from its own side.
            known = {f"k/{c}" for c in coalition if c in graph[target]} | learned[target]
            needed = {"b"} | {f"k/{v}" for v in graph[target]}
            assert not needed <= known, (coalition, target, sorted(known))
        if excluded:
            assert "b" not in learned[victim_dropped]


@settings(max_examples=6, deadline=None)
@given(victim=st.integers(0, 7), step=st.sampled_from(["before-sharing", "after-sharing"]), seed=st.integers(0, 999))
def test_verified_sums_hold_after_any_dropout_recovery_excludes(eight, victim, step, seed):
    """The survivors' sum after an exclusion verifies against the survivors' tags (confide.protect.verify).

    Random victim, step and updates; the pads of the tags are drawn over the included parties only.
    """
    from confide.protect.verify import Verifier

    names = NAMES8
    session = Round(eight, names, neighbours=4, timeout=2.0)
    session.vectors = {n: np.random.default_rng(seed + i).uniform(-2, 2, session.length) for i, n in enumerate(names)}
    for protection in session.parties.values():
        protection.verifier = Verifier(protection, timeout_s=10)
    dropped = names[victim]
    others = [n for n in names if n != dropped]
    if step == "after-sharing":
        session.share_only([dropped])
    uploads = session.upload(others)
    combined = [sum(parts, np.zeros(len(parts[0]), np.uint32)) for parts in zip(*uploads.values(), strict=True)]

    def work(name):
        protection, context = session.parties[name], session.context(name)
        context.excluded = lambda: [dropped]
        protection.verifier.begin(context, session.vectors[name])
        aggregate = protection.finish_round(
            context, lambda i: pb.Slice(index=i, n_valid=combined[i].size, payload=combined[i].tobytes())
        )
        return aggregate, protection.verifier.settle(others)

    for name, (aggregate, stats) in run_parallel({n: (lambda n=n: work(n)) for n in others}, timeout=60).items():
        assert np.max(np.abs(aggregate - session.truth(others))) <= session.tolerance(), name
        assert stats["verified_slices"] == session.context(name).num_slices
