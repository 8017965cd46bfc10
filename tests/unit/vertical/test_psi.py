"""ECDH-PSI (confide.vertical.psi) between parties in threads over LocalChannel."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from confide._native import PsiKey
from confide.compute.inline import InlineCompute
from confide.errors import InvalidParameterError, ProtocolError, WireFormatError
from confide.vertical import psi
from confide.vertical.channel import LocalChannel
from confide.vertical.psi import canonical_ids, domain_tag, intersect

GUEST = "guest"


def run(ids: dict[str, object], hosts: list[str], *, session: str = "s1", timeout: float = 20.0, **options):
    """Runs every party in its own thread; returns (results, errors, channels, stats)."""
    parties = [GUEST, *hosts]
    channels = LocalChannel.group(parties, timeout_s=timeout)
    results: dict[str, np.ndarray] = {}
    errors: dict[str, BaseException] = {}
    stats: dict[str, dict] = {party: {} for party in parties}

    def work(party: str) -> None:
        try:
            results[party] = intersect(
                channels[party],
                ids[party],
                role="guest" if party == GUEST else "host",
                guest=GUEST,
                hosts=hosts,
                session=session,
                stats=stats[party],
                **options,
            )
        except BaseException as error:  # noqa: BLE001 - reported to the test
            errors[party] = error

    threads = [threading.Thread(target=work, args=(party,)) for party in parties]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 30)
        assert not thread.is_alive(), "a party hung"
    return results, errors, channels, stats


def overlapping(rng: random.Random, sizes: list[int], common: int, make=lambda i: f"user-{i:08d}@example.org"):
    """Id lists (one per size) sharing ``common`` ids, each shuffled, drawn from a larger pool."""
    pool = [make(i) for i in rng.sample(range(10 * sum(sizes) + common), sum(sizes) + common)]
    shared, rest = pool[:common], pool[common:]
    lists = []
    for size in sizes:
        mine = shared + [rest.pop() for _ in range(size - common)]
        rng.shuffle(mine)
        lists.append(mine)
    return lists


def check_aligned(ids: dict[str, list], results: dict[str, np.ndarray]) -> list:
    """Every party's rows are the same records, in the guest's order, and exactly the intersection."""
    expected = set(ids[GUEST])
    for party in ids:
        expected &= set(ids[party])
    rows = [ids[GUEST][i] for i in results[GUEST]]
    assert set(rows) == expected
    assert list(results[GUEST]) == sorted(results[GUEST]), "guest rows follow its own id order"
    for party, index in results.items():
        assert index.dtype == np.int64
        assert [ids[party][i] for i in index] == rows, party
    return rows


def test_one_host_matches_python_set_intersection():
    rng = random.Random(1)
    g, h = overlapping(rng, [700, 500], common=230)
    results, errors, _, stats = run({GUEST: g, "h1": h}, ["h1"])
    assert not errors
    assert len(check_aligned({GUEST: g, "h1": h}, results)) == 230
    assert stats[GUEST]["intersection"] == stats["h1"]["intersection"] == 230
    assert stats[GUEST]["peer_sizes"] == {"h1": 500} and stats["h1"]["peer_sizes"] == {GUEST: 700}
    assert stats[GUEST]["bytes_sent"] > 700 * 32 and stats["h1"]["bytes_sent"] > 500 * 32 + 700 * 16
    assert {"hash_and_blind", "blind", "total"} <= set(stats[GUEST]["seconds"])
    assert stats[GUEST]["engine"] == stats["h1"]["engine"] == PsiKey.engine()
    assert PsiKey.engine() in ("ifma-8-lane", "dalek")


def test_two_hosts_intersect_across_all_parties_in_one_order():
    rng = random.Random(2)
    universe = [f"patient/{i}" for i in range(3000)]
    g = rng.sample(universe, 1200)
    h1 = rng.sample(universe, 1500)
    h2 = rng.sample(universe, 900)
    ids = {GUEST: g, "h1": h1, "h2": h2}
    results, errors, _, stats = run(ids, ["h1", "h2"])
    assert not errors
    rows = check_aligned(ids, results)
    assert len(rows) == len(set(g) & set(h1) & set(h2)) > 0
    assert stats[GUEST]["shared_with_host"] == {"h1": len(set(g) & set(h1)), "h2": len(set(g) & set(h2))}
    # A host learns only the final intersection, not its pairwise one with the guest.
    assert stats["h1"]["intersection"] == len(rows)


class RecordingCompute(InlineCompute):
    """Inline, with three pretend workers, keeping every task it is given."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, tuple]] = []

    @property
    def workers(self) -> int:
        return 3

    def map(self, function, items):
        self.tasks.extend((function.__name__, item) for item in items)
        return super().map(function, items)


def test_blinding_on_compute_workers_gives_the_same_rows_and_ships_only_own_ids_and_the_scalar():
    rng = random.Random(5)
    g, h1, h2 = overlapping(rng, [9000, 5000, 4500], common=1200)
    ids = {GUEST: g, "h1": h1, "h2": h2}
    here, errors, _, _ = run(ids, ["h1", "h2"])
    assert not errors
    engines = {GUEST: RecordingCompute(), "h2": RecordingCompute()}
    parties = [GUEST, "h1", "h2"]
    channels = LocalChannel.group(parties, timeout_s=20)
    results, stats = {}, {p: {} for p in parties}

    def work(party):
        role = "guest" if party == GUEST else "host"
        results[party] = intersect(
            channels[party],
            ids[party],
            role=role,
            guest=GUEST,
            hosts=["h1", "h2"],
            session="s1",
            stats=stats[party],
            engine=engines.get(party),
        )

    threads = [threading.Thread(target=work, args=(p,)) for p in parties]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for party in parties:
        assert np.array_equal(results[party], here[party]), party
    assert stats[GUEST]["blinding"] == stats["h2"]["blinding"] == "compute workers (inline)"
    assert stats["h1"]["blinding"] == "party process"
    scalars = {}
    for party, engine in engines.items():
        names = [name for name, _ in engine.tasks]
        own = {v.encode() for v in ids[party]}
        hashed, blinded = 0, 0
        for name, item in engine.tasks:
            scalar = item[0]
            assert isinstance(scalar, bytes) and len(scalar) == 32 and 0 < int.from_bytes(scalar, "little") < psi._ORDER
            scalars.setdefault(party, scalar)
            assert scalar == scalars[party], "one scalar per intersection"
            if name == "psi_hash_and_blind":
                _, dst, data, offsets = item
                assert dst == domain_tag("s1", "str")
                chunk = [data[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
                assert set(chunk) <= own, "a worker gets this party's own ids only"
                hashed += len(chunk)
            else:
                assert name == "psi_blind" and len(item) == 2 and len(item[1]) % 32 == 0
                blinded += len(item[1]) // 32
        assert hashed == len(ids[party]) and names.count("psi_hash_and_blind") == -(-len(ids[party]) // 4096) > 1
        # the guest blinds each host's points, a host the guest's
        assert blinded == (len(h1) + len(h2) if party == GUEST else len(g))
    assert scalars[GUEST] != scalars["h2"]


@pytest.mark.parametrize("kind", ["int", "bytes", "numpy-int", "numpy-str"])
def test_int_bytes_and_numpy_ids(kind):
    rng = np.random.default_rng(3)
    g = rng.choice(10**12, 400, replace=False) - 5 * 10**11
    h = np.concatenate([g[:150], rng.choice(10**12, 300, replace=False) + 10**12])
    rng.shuffle(h)
    convert = {
        "int": lambda a: [int(v) for v in a],
        "bytes": lambda a: [int(v).to_bytes(8, "big", signed=True) for v in a],
        "numpy-int": lambda a: a,
        "numpy-str": lambda a: a.astype(str),
    }[kind]
    ids = {GUEST: convert(g), "h1": convert(h)}
    results, errors, _, _ = run(ids, ["h1"])
    assert not errors
    assert len(check_aligned({p: list(v) for p, v in ids.items()}, results)) == 150


def test_canonical_encoding_and_types():
    assert canonical_ids(["a", "é"]) == ("str", [b"a", "é".encode()])
    assert canonical_ids([1, -20, np.int64(7)]) == ("int", [b"1", b"-20", b"7"])
    assert canonical_ids([b"\x00", bytearray(b"x")]) == ("bytes", [b"\x00", b"x"])
    # The same bytes under different types hash to different points.
    offsets = np.array([0, 1], dtype=np.uint64)
    assert PsiKey.hash_to_group(domain_tag("s", "str"), b"1", offsets) != PsiKey.hash_to_group(
        domain_tag("s", "int"), b"1", offsets
    )


def test_str_and_int_ids_do_not_mix_across_parties():
    results, errors, _, _ = run({GUEST: [str(i) for i in range(50)], "h1": list(range(50))}, ["h1"])
    assert not results
    for party, mine, theirs in ((GUEST, "str", "int"), ("h1", "int", "str")):
        error = errors[party]
        assert isinstance(error, InvalidParameterError), party
        assert "id types differ" in str(error) and f"has {mine} ids" in str(error) and f"has {theirs} ids" in str(error)


def test_type_mismatch_with_one_of_two_hosts_stops_everyone():
    ids = {GUEST: ["a", "b"], "h1": ["a"], "h2": [b"a"]}
    results, errors, _, _ = run(ids, ["h1", "h2"])
    assert not results
    assert isinstance(errors[GUEST], InvalidParameterError) and "'h2'" in str(errors[GUEST])
    assert isinstance(errors["h2"], InvalidParameterError) and "id types differ" in str(errors["h2"])
    assert isinstance(errors["h1"], ProtocolError) and "aborted by the guest" in str(errors["h1"])


def test_empty_intersection_is_an_error_on_every_party():
    ids = {GUEST: [f"g{i}" for i in range(30)], "h1": [f"h{i}" for i in range(40)], "h2": ["g1", "x"]}
    results, errors, _, _ = run(ids, ["h1", "h2"])
    assert not results
    assert set(errors) == {GUEST, "h1", "h2"}
    for party, error in errors.items():
        assert isinstance(error, InvalidParameterError), party
        assert "intersection is empty" in str(error)
    assert "guest has 30 ids" in str(errors[GUEST]) and "'h1' has 40" in str(errors[GUEST])
    assert "guest has 30 ids" in str(errors["h1"]) and "'h1' has 40" in str(errors["h1"])
    assert "'h2' has 2" in str(errors["h2"])


def test_duplicates_are_refused_and_the_peer_is_told_without_the_id():
    ids = {GUEST: ["a", "b", "c"], "h1": ["x", "secret-dup", "y", "secret-dup"]}
    results, errors, channels, _ = run(ids, ["h1"])
    assert not results
    assert isinstance(errors["h1"], InvalidParameterError)
    assert "duplicate id 'secret-dup' at index 3 (first at index 1)" in str(errors["h1"])
    assert isinstance(errors[GUEST], ProtocolError) and "duplicate ids" in str(errors[GUEST])
    assert "secret-dup" not in str(errors[GUEST])
    assert b"secret-dup" not in b"".join(part for *_, part in channels[GUEST].transcript)
    # The guest's own duplicates stop the host too.
    results, errors, _, _ = run({GUEST: [1, 2, 1], "h1": [1, 2]}, ["h1"])
    assert "duplicate id 1 at index 2" in str(errors[GUEST])
    assert isinstance(errors["h1"], ProtocolError) and "aborted by the guest" in str(errors["h1"])


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([], "at least one id"),
        (["a", 1], "ids[0] is str but ids[1] is int"),
        ([1, True], "ids[0] is int but ids[1] is bool"),
        ([1.5], "must be str, int or bytes"),
        ("abc", "must be a sequence"),
        ({"a", "b"}, "must be a sequence"),
        (np.array([1.0, 2.0]), "dtype float64"),
        (["ok", "\ud800"], "ids[1]: not encodable"),
    ],
)
def test_bad_id_lists(ids, message):
    with pytest.raises(InvalidParameterError) as caught:
        canonical_ids(ids)
    assert message in str(caught.value)


def test_too_many_ids(monkeypatch):
    monkeypatch.setattr(psi, "MAX_IDS", 5)
    with pytest.raises(InvalidParameterError, match="at most 5 ids"):
        canonical_ids(list(range(6)))


def test_bad_arguments():
    channels = LocalChannel.group([GUEST, "h1"])
    common = {"guest": GUEST, "hosts": ["h1"], "session": "s"}
    bad = [
        ({"role": "arbiter"}, "role must be"),
        ({"role": "guest", "hosts": []}, "hosts must be"),
        ({"role": "guest", "hosts": [GUEST]}, "must not include the guest"),
        ({"role": "guest", "session": "a/b"}, "session must be"),
        ({"role": "guest", "threads": -1}, "threads must be"),
        ({"role": "host"}, "not one of the hosts"),
    ]
    for options, message in bad:
        with pytest.raises(InvalidParameterError, match=message):
            intersect(channels[GUEST], ["a"], **{**common, **options})
    with pytest.raises(InvalidParameterError, match="is not the guest"):
        intersect(channels["h1"], ["a"], role="guest", **common)


def test_a_malformed_point_from_the_guest_is_refused_by_index():
    channels = LocalChannel.group([GUEST, "h1"], timeout_s=10)
    errors: list[BaseException] = []

    def host() -> None:
        try:
            intersect(channels["h1"], ["a", "b"], role="host", guest=GUEST, hosts=["h1"], session="s")
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    thread = threading.Thread(target=host)
    thread.start()
    guest = channels[GUEST]
    guest.send("h1", "psi/s/hello", {"protocol": psi.PROTOCOL, "role": "guest", "id_type": "str", "size": 3})
    points = PsiKey.generate().hash_and_blind(b"d", b"xyz", np.array([0, 1, 2, 3], dtype=np.uint64))
    guest.send("h1", "psi/s/guest_points", {"points": points[:32] + b"\xff" * 32 + points[64:]})
    thread.join(20)
    assert len(errors) == 1 and isinstance(errors[0], WireFormatError)
    assert "element 1 is not a valid ristretto255 point" in str(errors[0])


def test_peers_see_no_raw_ids_and_no_unblinded_hashes():
    rng = random.Random(4)
    g, h1, h2 = overlapping(rng, [300, 250, 200], common=120, make=lambda i: f"ssn-{i:09d}-{i * 7919 % 10007:05d}")
    ids = {GUEST: g, "h1": h1, "h2": h2}
    results, errors, channels, _ = run(ids, ["h1", "h2"], session="privacy")
    assert not errors and len(check_aligned(ids, results)) == 120
    everything = sorted(set(g + h1 + h2))
    raw = [value.encode() for value in everything]
    _, encoded = canonical_ids(everything)
    data = b"".join(encoded)
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.uint64)
    hashed = PsiKey.hash_to_group(domain_tag("privacy", "str"), data, offsets)
    unblinded = [hashed[i : i + 32] for i in range(0, len(hashed), 32)]
    tags = PsiKey.tags(hashed)
    unblinded_tags = [tags[i : i + 16] for i in range(0, len(tags), 16)]

    def blobs(value):
        if isinstance(value, dict):
            for item in value.values():
                yield from blobs(item)
        elif isinstance(value, list):
            for item in value:
                yield from blobs(item)
        elif isinstance(value, bytes):
            yield value
        elif isinstance(value, np.ndarray):
            yield value.tobytes()
        elif isinstance(value, str):
            yield value.encode()

    for party in ids:
        received = channels[party].received_by(party)
        assert received, party
        blob = b"\x00".join(b for _, _, message in received for b in blobs(message))
        assert not any(value in blob for value in raw), party
        assert not any(point in blob for point in unblinded), party
        assert not any(t in blob for t in unblinded_tags), party
    # A host never hears from another host, and hears from the guest only.
    assert {sender for sender, _, _ in channels["h1"].received_by("h1")} == {GUEST}


def test_sessions_keep_runs_apart():
    ids = {GUEST: ["a", "b", "c"], "h1": ["b", "c", "d"]}
    channels = LocalChannel.group([GUEST, "h1"], timeout_s=10)
    for session in ("one", "two"):
        results: dict[str, np.ndarray] = {}

        def work(party: str, session=session, results=results) -> None:
            results[party] = intersect(
                channels[party],
                ids[party],
                role="guest" if party == GUEST else "host",
                guest=GUEST,
                hosts=["h1"],
                session=session,
            )

        threads = [threading.Thread(target=work, args=(p,)) for p in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert [ids[GUEST][i] for i in results[GUEST]] == ["b", "c"]
        assert [ids["h1"][i] for i in results["h1"]] == ["b", "c"]


def test_twenty_thousand_ids_a_side():
    # Timing lives in benchmarks/psi_bench.py (1,000,000 ids a side), not here.
    rng = random.Random(5)
    g, h = overlapping(rng, [20_000, 20_000], common=10_000)
    results, errors, _, stats = run({GUEST: g, "h1": h}, ["h1"], timeout=120)
    assert not errors
    assert len(results[GUEST]) == len(results["h1"]) == 10_000
    assert [g[i] for i in results[GUEST]] == [h[i] for i in results["h1"]]
    assert stats[GUEST]["intersection"] == 10_000
