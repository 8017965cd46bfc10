"""ECDH private set intersection on ristretto255, to align the records of vertical-FL parties.

Semi-honest DH-PSI (algorithms.md §5.4) between one guest and one or more hosts, over a
:class:`~confide.vertical.channel.Channel`. Per host, under tags ``psi/<session>/...``:

1. ``hello``, both ways: protocol name, role, id type (``str``, ``int`` or ``bytes``) and set
   size, or an ``abort`` reason if this party's ids are unusable (the reason never contains an
   id). Different id types stop both parties with an :class:`InvalidParameterError`.
2. ``guest_points``: the guest's a·H(x), in a secret random order (one message to every host;
   or an ``abort`` reason when a host's hello was refused).
3. ``host_points``: the host's b·H(y), in a secret random order.
4. ``host_tags``: tag(b·(a·H(x))) in the order of step 2 (16 bytes each, not the 32-byte points).
5. The guest computes tag(a·(b·H(y))), matches (its ids common with this host), intersects
   across hosts, and sends ``result``: for each common record, in the guest's original id
   order, the host's position in its step-3 order (or an ``abort`` when the intersection is
   empty). The host maps positions back through its own permutation.

Every party returns the indices into its own ``ids`` of the common records, row k of every
party being the same record. H is the ristretto255 hash of
``u64be(len(dst)) ‖ dst ‖ u64be(len(id)) ‖ id`` with ``dst = "confide-psi-v1|<session>|<type>"``,
so the int 1 and the string "1" never match; a tag is SHA-256("confide-psi-tag" ‖ point)[:16]
(crates/confide-psi).

What each party learns: the guest learns |Y| of each host and, per host, which of its ids that
host shares (with several hosts that is more than the final intersection); a host learns |X|,
which of its own ids are in the final intersection and their order in the guest's id list.
Nothing else travels: no raw id, no unblinded H(id), no key. Security rests on DDH in
ristretto255 with H a random oracle, against semi-honest parties; authenticated channels are
the transport's job (mutual TLS on the relay).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from confide._checks import check_int
from confide._native import PsiKey
from confide.errors import ConfideError, InvalidParameterError, ProtocolError

__all__ = ["MAX_IDS", "PROTOCOL", "BadIds", "canonical_ids", "domain_tag", "flat_ids", "intersect", "refuse"]

PROTOCOL = "confide-psi-ecdh-ristretto255-v1"
#: Most ids one party may bring to one intersection.
MAX_IDS = 10_000_000
POINT_BYTES = 32
TAG_BYTES = 16
_SESSION = re.compile(r"[A-Za-z0-9._:@+=-]{1,200}")
_ROLES = ("guest", "host")


class BadIds(InvalidParameterError):
    """A party's own ids are unusable; ``public`` is the reason a peer may be told (never an id)."""

    def __init__(self, message: str, public: str) -> None:
        super().__init__(message)
        self.public = public


def domain_tag(session: str, id_type: str) -> bytes:
    """The hash-to-group domain-separation tag of a session and an id type."""
    return f"confide-psi-v1|{session}|{id_type}".encode()


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def canonical_ids(ids: Any) -> tuple[str, list[bytes]]:
    """The id type (``"str"``, ``"int"`` or ``"bytes"``) and each id as bytes.

    str → UTF-8, int → decimal ASCII (``-12``), bytes as they are. All ids must have one
    type, be distinct, and number 1 to :data:`MAX_IDS`; errors name ``ids`` and the position.
    """
    if isinstance(ids, (str, bytes, bytearray)) or not hasattr(ids, "__len__") or not hasattr(ids, "__getitem__"):
        raise BadIds(f"ids must be a sequence (list, tuple or 1-D array) of ids, got {type(ids).__name__}", "bad ids")
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise BadIds(f"ids must be one-dimensional, got shape {ids.shape}", "bad ids")
        if ids.dtype.kind not in "iuUO":
            raise BadIds(f"ids: a numpy array of ids must hold integers or str, got dtype {ids.dtype}", "bad ids")
        ids = ids.tolist()
    n = len(ids)
    if n == 0:
        raise BadIds("ids: at least one id is required, got none", "no ids")
    if n > MAX_IDS:
        raise BadIds(f"ids: at most {MAX_IDS:,} ids per party, got {n:,}", "too many ids")
    first = ids[0]
    if isinstance(first, str):
        kind, allowed = "str", (str,)
    elif isinstance(first, (bytes, bytearray)):
        kind, allowed = "bytes", (bytes, bytearray)
    elif isinstance(first, (int, np.integer)) and not isinstance(first, (bool, np.bool_)):
        kind, allowed = "int", (int, np.integer)
    else:
        raise BadIds(f"ids[0]: ids must be str, int or bytes, got {type(first).__name__}", "bad id type")
    types = set(map(type, ids))
    if any(not issubclass(t, allowed) or issubclass(t, (bool, np.bool_)) for t in types):
        for index, value in enumerate(ids):
            if not isinstance(value, allowed) or isinstance(value, (bool, np.bool_)):
                raise BadIds(
                    f"ids: all ids must have one type; ids[0] is {kind} but ids[{index}] is {type(value).__name__}",
                    "mixed id types",
                )
    try:
        if kind == "str":
            encoded = [value.encode("utf-8") for value in ids]
        elif kind == "int":
            encoded = [str(int(value)).encode("ascii") for value in ids]
        else:
            encoded = [bytes(value) for value in ids]
    except UnicodeEncodeError:
        index = next(i for i, value in enumerate(ids) if not _utf8(value))
        raise BadIds(f"ids[{index}]: not encodable as UTF-8 (lone surrogate)", "id not encodable") from None
    if len(set(encoded)) != n:
        seen: dict[bytes, int] = {}
        for index, value in enumerate(encoded):
            if value in seen:
                raise BadIds(
                    f"ids: duplicate id {_show(ids[index])} at index {index} (first at index {seen[value]}); "
                    "ids must be distinct",
                    "duplicate ids",
                )
            seen[value] = index
    return kind, encoded


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def flat_ids(encoded: list[bytes]) -> tuple[bytes, np.ndarray]:
    """Encoded ids as one byte string and its uint64 offsets (N + 1), as the native calls take them."""
    offsets = np.zeros(len(encoded) + 1, dtype=np.uint64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.uint64, count=len(encoded)), out=offsets[1:])
    return b"".join(encoded), offsets


def _permutation(n: int) -> np.ndarray:
    """A uniformly random permutation from the OS CSPRNG (sort by 64-bit random keys)."""
    keys = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64)
    return np.argsort(keys, kind="stable").astype(np.int64)


def _permute(points: bytes, perm: np.ndarray, width: int) -> bytes:
    return np.frombuffer(points, dtype=np.uint8).reshape(-1, width)[perm].tobytes()


def _get(message: dict, field: str, kind: type, sender: str, tag: str) -> Any:
    value = message.get(field)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"message {tag!r} from {sender}: field {field!r} is missing or not {kind.__name__}")
    return value


def _check_abort(message: dict, sender: str, role: str, tag: str) -> None:
    reason = message.get("abort")
    if reason is None:
        return
    if not isinstance(reason, str):
        raise ProtocolError(f"message {tag!r} from {sender}: field 'abort' must be a string")
    raise ProtocolError(f"PSI aborted by the {role} {sender!r}: {reason[:200]}")


class _Clock:
    """Seconds per phase and time spent waiting on peers."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._mark
        self._mark = now


def intersect(
    channel,
    ids: Sequence[str] | Sequence[int] | Sequence[bytes] | np.ndarray,
    *,
    role: str,
    guest: str,
    hosts: Sequence[str],
    session: str,
    threads: int = 0,
    stats: dict | None = None,
    engine=None,
) -> np.ndarray:
    """Align records with the other parties; returns int64 indices into ``ids``.

    Every party calls this with the same ``guest``, ``hosts`` and ``session`` and its own ``ids``
    (str, int or bytes, one type for all parties). Row k of every party's result is the same
    record; rows follow the guest's id order. ``stats``, when a dict, receives the set sizes,
    the group-arithmetic engine (``"ifma-8-lane"`` or ``"dalek"``; both give the same bytes),
    seconds per phase and bytes sent and received.

    ``engine`` (a :class:`~confide.compute.LocalCompute`): where the group arithmetic runs, the
    ids and points cut into chunks, about two per worker. ``ids`` may also be a partitioned
    dataset's :class:`~confide.vertical.columns.PartitionedColumns` on that engine: its holders
    hash and blind their own ids, and no id enters this process. The workers get this party's own ids,
    the peer's blinded points (what the wire carries anyway) and this intersection's scalar
    (see :class:`_WorkerBlinder`); the matching stays here. The result is the same either way.

    Raises :class:`InvalidParameterError` for bad arguments or ids, for id types that differ
    between parties (on both sides) and for an empty intersection (on every party);
    :class:`ProtocolError` when a peer aborts or sends a malformed message.
    """
    if role not in _ROLES:
        raise InvalidParameterError(f"role must be 'guest' or 'host', got {role!r}")
    if not isinstance(guest, str) or not guest:
        raise InvalidParameterError(f"guest must be a party name, got {guest!r}")
    if isinstance(hosts, str) or not all(isinstance(h, str) and h for h in hosts) or not hosts:
        raise InvalidParameterError(f"hosts must be a non-empty list of party names, got {hosts!r}")
    hosts = list(hosts)
    if len(set(hosts)) != len(hosts) or guest in hosts:
        raise InvalidParameterError(f"hosts must be distinct and must not include the guest {guest!r}, got {hosts!r}")
    if not isinstance(session, str) or not _SESSION.fullmatch(session):
        raise InvalidParameterError(f"session must be 1-200 characters of [A-Za-z0-9._:@+=-], got {session!r}")
    threads = check_int("threads", threads, 0, 256)
    if stats is not None and not isinstance(stats, dict):
        raise InvalidParameterError(f"stats must be a dict or None, got {type(stats).__name__}")
    party = channel.party
    if role == "guest" and party != guest:
        raise InvalidParameterError(f"role: channel party {party!r} is not the guest {guest!r}")
    if role == "host" and party not in hosts:
        raise InvalidParameterError(f"role: channel party {party!r} is not one of the hosts {hosts!r}")

    clock = _Clock()
    sent, received = channel.bytes_sent, channel.bytes_received
    report: dict[str, Any] = {"role": role, "party": party, "session": session, "engine": PsiKey.engine()}
    report["blinding"] = "party process" if engine is None else f"compute workers ({engine.name})"
    remote = hasattr(ids, "psi_points")  # ids held by partitions (confide.vertical.columns)
    if remote and engine is None:
        raise InvalidParameterError("ids: ids held by partitions need the engine that holds them (engine)")
    workers = _WorkerBlinder(engine) if engine is not None else None
    try:
        if remote:
            # the holders hash and blind where the ids live: only the points come here
            kind, points = ids.psi_points(workers.scalar, session)
            encoded = _Blinded(points, session, kind)
        else:
            kind, encoded = canonical_ids(ids)
        problem = None
    except BadIds as error:
        kind, encoded, problem = None, [], error
    except ConfideError as error:
        if not remote:
            raise
        # a holder failed (its file, its worker): the peers are told, as for unusable ids
        kind, encoded, problem = None, [], BadIds(f"ids: the partitions failed: {error}", "its partitions failed")
    clock.lap("prepare")
    run = _guest if role == "guest" else _host
    try:
        blinder = (lambda: _LocalBlinder(threads)) if workers is None else (lambda: workers)
        return run(channel, kind, encoded, problem, guest, hosts, session, threads, clock, report, blinder)
    finally:
        if stats is not None:
            report["seconds"] = dict(clock.seconds, total=sum(clock.seconds.values()))
            report["bytes_sent"] = channel.bytes_sent - sent
            report["bytes_received"] = channel.bytes_received - received
            stats.update(report)


class _LocalBlinder:
    """The intersection's secret scalar, in this process (a fresh native key)."""

    def __init__(self, threads: int) -> None:
        self.key, self.threads = PsiKey.generate(), threads

    def hash_and_blind(self, dst: bytes, encoded: list[bytes]) -> bytes:
        data, offsets = flat_ids(encoded)
        return self.key.hash_and_blind(dst, data, offsets, self.threads)

    def blind(self, points: bytes) -> bytes:
        return self.key.blind(points, self.threads)


#: The order of the ristretto255 group.
_ORDER = 2**252 + 27742317777372353535851937790883648493


class _WorkerBlinder:
    """The intersection's scalar, with the group arithmetic on the party's compute workers.

    The scalar is the one secret the party process hands its workers, and only when asked to
    (``--compute`` on a vertical job). It is drawn fresh for this intersection and used for
    nothing else, and it protects only this party's own ids from the peer (with it, the peer
    could test guesses against the points it received), ids that the workers already see in
    the clear. It reveals nothing of any other party's data, unlike the keys
    :func:`~confide.compute.check_shippable` refuses, and it travels as a task argument of 32
    bytes, inside the task's own message, not through Ray's object store (which can spill to
    disk).
    """

    def __init__(self, engine) -> None:
        import secrets

        self.engine = engine
        self.scalar = (secrets.randbelow(_ORDER - 1) + 1).to_bytes(32, "little")

    def _ranges(self, count: int) -> list[tuple[int, int]]:
        return self.engine.ranges(count, min_chunk=4096)

    def hash_and_blind(self, dst: bytes, encoded: list[bytes]) -> bytes:
        from confide.compute.tasks import psi_hash_and_blind

        if isinstance(encoded, _Blinded):  # already done by the partitions' holders with this scalar
            if dst != domain_tag(encoded.session, encoded.kind):
                raise ProtocolError("PSI: the partitions blinded their ids under another session or id type")
            return encoded.points

        items = [(self.scalar, dst, *flat_ids(encoded[a:b])) for a, b in self._ranges(len(encoded))]
        return b"".join(self.engine.map(psi_hash_and_blind, items))

    def blind(self, points: bytes) -> bytes:
        from confide.compute.tasks import psi_blind

        chunks = self._ranges(len(points) // POINT_BYTES)
        items = [(self.scalar, points[a * POINT_BYTES : b * POINT_BYTES]) for a, b in chunks]
        return b"".join(self.engine.map(psi_blind, items))


class _Blinded:
    """Points k·H(id) the holders of a partitioned dataset computed, standing in for the ids."""

    def __init__(self, points: bytes, session: str, kind: str) -> None:
        self.points, self.session, self.kind = points, session, kind

    def __len__(self) -> int:
        return len(self.points) // POINT_BYTES


def refuse(channel, *, role: str, guest: str, hosts: Sequence[str], session: str, reason: str) -> None:
    """Tell the peers this party cannot take part (its data failed before PSI): they stop at once.

    Sends the hello a party with unusable ids sends (``abort``: ``reason``, which must name no
    record), so the others raise a :class:`ProtocolError` naming this party instead of waiting
    for a hello that never comes.
    """
    peers = [guest] if role == "host" else list(hosts)
    channel.send(peers, f"psi/{session}/hello", {"protocol": PROTOCOL, "role": role, "abort": reason})


def _hello(kind: str | None, size: int, role: str, problem: BadIds | None) -> dict:
    message: dict[str, Any] = {"protocol": PROTOCOL, "role": role, "id_type": kind or "", "size": size}
    if problem is not None:
        message["abort"] = f"its ids are unusable ({problem.public})"
    return message


def _check_hello(message: dict, sender: str, expected_role: str, tag: str) -> tuple[str, int]:
    _check_abort(message, sender, expected_role, tag)
    if message.get("protocol") != PROTOCOL:
        raise ProtocolError(f"{expected_role} {sender!r} speaks {message.get('protocol')!r}, expected {PROTOCOL!r}")
    if message.get("role") != expected_role:
        raise ProtocolError(
            f"message {tag!r} from {sender}: role is {message.get('role')!r}, expected {expected_role!r}"
        )
    kind = _get(message, "id_type", str, sender, tag)
    size = _get(message, "size", int, sender, tag)
    if not 1 <= size <= MAX_IDS:
        raise ProtocolError(f"message {tag!r} from {sender}: size {size} is out of range 1..{MAX_IDS}")
    return kind, size


def _type_mismatch(mine: str, party: str, theirs: str, peer_role: str, peer: str) -> InvalidParameterError:
    return InvalidParameterError(
        f"ids: id types differ: {party!r} has {mine} ids but the {peer_role} {peer!r} has {theirs} ids; "
        "every party must pass ids of one type (str, int or bytes), or the same record would never match"
    )


def _empty(guest_size: int, sizes: dict[str, int]) -> InvalidParameterError:
    hosts = ", ".join(f"host {h!r} has {n:,}" for h, n in sizes.items())
    return InvalidParameterError(
        f"ids: the private set intersection is empty: guest has {guest_size:,} ids, {hosts}; "
        "check that all parties use the same id column and format"
    )


def _points(message: dict, field: str, count: int, width: int, sender: str, tag: str) -> bytes:
    data = _get(message, field, bytes, sender, tag)
    if len(data) != count * width:
        raise ProtocolError(f"message {tag!r} from {sender}: {field} has {len(data)} bytes, expected {count} x {width}")
    return data


def _guest(channel, kind, encoded, problem, guest, hosts, session, threads, clock, report, blinder) -> np.ndarray:
    prefix = f"psi/{session}"
    n = len(encoded)
    channel.send(hosts, f"{prefix}/hello", _hello(kind, n, "guest", problem))
    if problem is not None:
        raise problem
    sizes: dict[str, int] = {}
    failure: Exception | None = None
    for host in hosts:
        message = channel.recv(host, f"{prefix}/hello")
        try:
            theirs, sizes[host] = _check_hello(message, host, "host", f"{prefix}/hello")
            if theirs != kind:
                raise _type_mismatch(kind, guest, theirs, "host", host)
        except (ProtocolError, InvalidParameterError) as error:
            failure = failure or error
    clock.lap("wait")
    report.update(size=n, id_type=kind, peer_sizes=dict(sizes))
    if failure is not None:
        channel.send(hosts, f"{prefix}/guest_points", {"abort": "the guest refused a host's hello"})
        raise failure

    key = blinder()
    perm = _permutation(n)
    blinded = _permute(key.hash_and_blind(domain_tag(session, kind), encoded), perm, POINT_BYTES)
    clock.lap("hash_and_blind")
    channel.send(hosts, f"{prefix}/guest_points", {"points": blinded})
    del blinded
    clock.lap("send")

    common = np.ones(n, dtype=bool)
    positions: dict[str, np.ndarray] = {}
    shared: dict[str, int] = {}
    for host in hosts:
        tag = f"{prefix}/host_points"
        theirs = _points(channel.recv(host, tag), "points", sizes[host], POINT_BYTES, host, tag)
        clock.lap("wait")
        mine = PsiKey.tags(key.blind(theirs), threads)
        del theirs
        clock.lap("blind")
        tag = f"{prefix}/host_tags"
        returned = _points(channel.recv(host, tag), "tags", n, TAG_BYTES, host, tag)
        clock.lap("wait")
        shuffled, position = PsiKey.match_tags(returned, mine, threads)
        where = np.full(n, -1, dtype=np.int64)
        where[perm[shuffled]] = position
        common &= where >= 0
        positions[host] = where
        shared[host] = len(position)
        clock.lap("match")
    del key
    result = np.flatnonzero(common).astype(np.int64)
    report.update(intersection=len(result), shared_with_host=shared)
    if len(result) == 0:
        for host in hosts:
            channel.send(host, f"{prefix}/result", {"abort": "empty"})
        raise _empty(n, sizes)
    for host in hosts:
        channel.send(host, f"{prefix}/result", {"positions": positions[host][result]})
    clock.lap("send")
    return result


def _host(channel, kind, encoded, problem, guest, hosts, session, threads, clock, report, blinder) -> np.ndarray:
    prefix = f"psi/{session}"
    party = channel.party
    n = len(encoded)
    channel.send(guest, f"{prefix}/hello", _hello(kind, n, "host", problem))
    if problem is not None:
        raise problem
    message = channel.recv(guest, f"{prefix}/hello")
    clock.lap("wait")
    theirs, guest_size = _check_hello(message, guest, "guest", f"{prefix}/hello")
    report.update(size=n, id_type=kind, peer_sizes={guest: guest_size})
    if theirs != kind:
        raise _type_mismatch(kind, party, theirs, "guest", guest)

    key = blinder()
    perm = _permutation(n)
    blinded = _permute(key.hash_and_blind(domain_tag(session, kind), encoded), perm, POINT_BYTES)
    clock.lap("hash_and_blind")
    channel.send(guest, f"{prefix}/host_points", {"points": blinded})
    del blinded
    clock.lap("send")

    tag = f"{prefix}/guest_points"
    message = channel.recv(guest, tag)
    clock.lap("wait")
    _check_abort(message, guest, "guest", tag)
    theirs_points = _points(message, "points", guest_size, POINT_BYTES, guest, tag)
    tags = PsiKey.tags(key.blind(theirs_points), threads)
    del theirs_points, key
    clock.lap("blind")
    channel.send(guest, f"{prefix}/host_tags", {"tags": tags})
    del tags
    clock.lap("send")

    tag = f"{prefix}/result"
    message = channel.recv(guest, tag)
    clock.lap("wait")
    if message.get("abort") == "empty":
        report["intersection"] = 0
        raise _empty(guest_size, {party: n})
    _check_abort(message, guest, "guest", tag)
    positions = message.get("positions")
    if not (isinstance(positions, np.ndarray) and positions.dtype == np.int64 and positions.ndim == 1):
        raise ProtocolError(f"message {tag!r} from {guest}: positions must be a 1-D int64 array")
    if len(positions) == 0 or len(positions) > min(n, guest_size):
        raise ProtocolError(f"message {tag!r} from {guest}: {len(positions)} positions for {n} and {guest_size} ids")
    if positions.min() < 0 or positions.max() >= n:
        raise ProtocolError(f"message {tag!r} from {guest}: a position is outside 0..{n - 1}")
    if len(np.unique(positions)) != len(positions):
        raise ProtocolError(f"message {tag!r} from {guest}: positions repeat")
    result = perm[positions]
    report["intersection"] = len(result)
    clock.lap("finish")
    return result
