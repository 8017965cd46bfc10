"""A party that comes back: who takes part in each round, and how a restarted party rejoins.

A horizontal party that crashed is dropped from the round it was in (the survivors retry it).
When its process is started again with ``--rejoin`` it reloads its own last checkpoint, makes
a fresh X25519 key and sends every peer a **rejoin request** at ``CONTROL_ROUND``: its key
announcement, signed with its certificate key, so no one (the relay included) can rejoin in
its name. The relay, seeing the request, aborts any open attempt its old process held up, so
nobody waits out a round timeout for a process that no longer exists.

At every round's start the **leader** (the first participant) looks for requests and decides
the round's membership:

1. It verifies each request's announcement and sends every other participant a
   ``membership`` message for the round: who joins, with their announcements (each receiver
   verifies them itself) and the request tags handled, so a later leader never admits a
   stale request.
2. It admits each joiner at ``CONTROL_ROUND`` (``admit/<incarnation>``): its own announcement
   in clear, then, sealed under the new pair key, the round number, the participants, the
   sample counts, the mode's group secrets (the shared Paillier key, the group key), every
   participant's announcement, and the round-start global model and strategy state, in
   sealed chunks at the round itself (a 100M-parameter model passes the relay in pieces
   under its message size and leaves with the round's messages).

The others read the decision after local training (the message has long arrived), so a round
costs no extra wait while everyone is present. A leader that dies between rounds is noticed
from its own rejoin request: its peers run the round without it, and the next leader admits it.

The joiner trains the round it was admitted to on the model it was given, exactly as the
others do, so every party ends with the same model; its report keeps the rounds before the
crash and names the rounds it missed. Threshold mode cannot rejoin (a key share dies with its
process) and says so; a job under differential privacy rejoins with its own ledger, which
counts the rounds it took part in.
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from confide.errors import ConfideError, JobFailedError, MessageTimeoutError, ProtocolError
from confide.protect.keys import decode_fields, encode_fields
from confide.transport.client import ADMIT_PREFIX, CONTROL_ROUND, REJOIN_PREFIX

__all__ = ["Admission", "Membership", "request_rejoin"]

log = logging.getLogger("confide.party")

#: Model bytes per sealed chunk handed to a joiner (well under the relay's message cap).
CHUNK_BYTES = 4 * 1024 * 1024
MEMBERSHIP = "membership"
MODEL_PREFIX = "rejoin-model/"


@dataclass
class Admission:
    """What a rejoining party was given: where the job stands and everything it needs to go on."""

    round: int
    participants: list[str]
    counts: dict[str, np.ndarray]
    secrets: dict[str, bytes]
    weights: dict[str, np.ndarray]
    strategy: dict[str, np.ndarray]
    handled: list[str] = field(default_factory=list)
    leader: str = ""


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _arrays(data: bytes, what: str) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, KeyError) as error:
        raise ProtocolError(f"{what} is not a valid array bundle: {error}") from None


class Membership:
    """One party's view of who takes part in each round, and its part in admitting rejoiners."""

    def __init__(self, parties: list[str], party_id: str, protection, exchange, client, counts: dict) -> None:
        self.parties = list(parties)
        #: Sample counts per party from the set-up exchange (a joiner needs them for the weights).
        self.counts = counts
        self.party_id = party_id
        self.protection = protection
        self.exchange = exchange
        self.client = client
        #: Rejoin request tags already decided on (admitted, or superseded by a newer one).
        self.handled: set[str] = set()
        self._decision: dict[str, dict] | None = None
        self._round = 0

    @property
    def _keys(self):
        return getattr(self.protection, "keys", None)

    def _requests(self, among: list[str]) -> dict[str, list[str]]:
        """Unhandled rejoin request tags per party of ``among``, oldest first."""
        found: dict[str, list[str]] = {}
        for tag, sender in self.client.pending(CONTROL_ROUND, REJOIN_PREFIX):
            if sender in among and sender != self.party_id and tag not in self.handled:
                found.setdefault(sender, []).append(tag)
        return {party: sorted(tags, key=_incarnation) for party, tags in found.items()}

    def open_round(self, round_number: int, participants: list[str], snapshot) -> None:
        """At a round's start, before training: the leader decides and admits (others do nothing).

        ``snapshot()`` gives the round-start global model and strategy state (called only when
        someone joins), which a joiner must start from to end the round with everyone's model.
        """
        self._decision, self._round = None, round_number
        if not self.protection.rejoinable or participants[0] != self.party_id:
            return
        joiners: dict[str, dict] = {}
        handled: list[str] = []
        for party, tags in self._requests(self.parties).items():
            handled += tags
            tag = tags[-1]  # the newest incarnation; older requests are superseded
            try:
                fields = decode_fields(self.exchange.recv(CONTROL_ROUND, tag, party, timeout=5.0), "announcement")
                if self._keys is not None:
                    self._keys.accept(party, fields["announcement"], replace=True)
            except ConfideError as error:
                log.warning("rejoin request %s of %s refused: %s", tag, party, error)
                continue
            joiners[party] = {"tag": tag, "announcement": fields["announcement"]}
        self._decision = joiners
        others = [p for p in participants if p != self.party_id and p not in joiners]
        if others:
            message = encode_fields(
                round=round_number,
                handled=handled,
                joiners=json.dumps({p: {"tag": j["tag"]} for p, j in joiners.items()}),
                **{f"announcement/{p}": j["announcement"] for p, j in joiners.items()},
            )
            self.exchange.send(round_number, MEMBERSHIP, message, others)
        self.handled.update(handled)
        if joiners:
            members = self._members(participants, joiners)
            weights, strategy_state = snapshot()
            for party, joiner in joiners.items():
                self._admit(round_number, party, joiner["tag"], members, weights, strategy_state)
                log.info("round %d: %s rejoins (request %s)", round_number, party, joiner["tag"])

    def settle(self, round_number: int, participants: list[str], timeout: float) -> list[str]:
        """After training: the round's participants, as the leader decided them."""
        if not self.protection.rejoinable:
            return participants
        leader = participants[0]
        if leader == self.party_id:
            return self._members(participants, self._decision or {})
        deadline = time.monotonic() + timeout
        while True:
            # The leader's own rejoin request first: if it is here, its membership message (sent
            # before it died, if at all) is here too, since the relay keeps each sender's order.
            restarted = leader in self._requests([leader])
            try:
                message = self.exchange.recv(round_number, MEMBERSHIP, leader, timeout=0.0 if restarted else 0.5)
                break
            except MessageTimeoutError:
                if restarted:
                    log.warning("round %d: the leader %s restarted; the round runs without it", round_number, leader)
                    return [p for p in participants if p != leader]
                if time.monotonic() > deadline:
                    log.warning("round %d: no membership from the leader %s; nobody joins", round_number, leader)
                    return participants
        fields = decode_fields(message, "round", "handled", "joiners")
        if fields["round"] != round_number:
            raise ProtocolError(f"membership message of round {fields['round']} arrived for round {round_number}")
        joiners = json.loads(fields["joiners"])
        for party in joiners:
            announcement = fields.get(f"announcement/{party}")
            if party not in self.parties or not isinstance(announcement, bytes):
                raise ProtocolError(f"membership message admits {party!r} without a valid announcement")
            if self._keys is not None:
                self._keys.accept(party, announcement, replace=True)
        self.handled.update(str(tag) for tag in fields["handled"])
        return self._members(participants, joiners)

    def _members(self, participants: list[str], joiners) -> list[str]:
        return [p for p in self.parties if p in participants or p in joiners]

    def _admit(self, round_number, party, tag, members, weights, strategy_state) -> None:
        keys = self._keys
        incarnation = tag[len(REJOIN_PREFIX) :]
        model = _npz({f"w/{name}": value for name, value in weights.items()})
        strategy = _npz(strategy_state)
        chunks = [model[i : i + CHUNK_BYTES] for i in range(0, len(model), CHUNK_BYTES)] or [b""]
        counts = {p: np.asarray(v, dtype=np.float64).tolist() for p, v in self.counts.items()}
        inner = encode_fields(
            round=round_number,
            participants=members,
            counts=json.dumps(counts),
            secrets=encode_fields(**self.protection.group_secrets),
            announcements=json.dumps(
                {p: a.decode() for p, a in (keys.announcements.items() if keys is not None else []) if p in members}
            ),
            strategy=strategy,
            chunks=len(chunks),
            handled=sorted(self.handled),
        )
        admit_tag = f"{ADMIT_PREFIX}{incarnation}"
        self.exchange.send(
            CONTROL_ROUND,
            admit_tag,
            encode_fields(
                leader=self.party_id,
                announcement=keys.announcement() if keys is not None else b"",
                sealed=_seal(keys, party, admit_tag, inner),
            ),
            [party],
        )
        for index, chunk in enumerate(chunks):
            chunk_tag = f"{MODEL_PREFIX}{incarnation}/{index}"
            self.exchange.send(round_number, chunk_tag, _seal(keys, party, chunk_tag, chunk), [party])


def _seal(keys, party: str, tag: str, data: bytes) -> bytes:
    # Without pair keys (plain mode) the relay already sees every update: nothing is sealed.
    return keys.seal_to(party, tag, data) if keys is not None else data


def _open(keys, party: str, tag: str, data: bytes) -> bytes:
    return keys.open_from(party, tag, data) if keys is not None else data


def _incarnation(tag: str) -> int:
    try:
        return int(tag.rsplit("/", 1)[-1])
    except ValueError:
        return -1


def request_rejoin(protection, exchange, client, parties: list[str], timeout: float) -> Admission:
    """Ask every peer to take this restarted party back; wait for a leader's admission.

    The request is re-sent every 30 s (a restarted aggregator holds no mailbox of the old run).
    """
    if not protection.rejoinable:
        raise JobFailedError(
            f"{protection.mode} mode cannot take a restarted party back: its key share died with its process"
        )
    me = exchange.party_id
    peers = [p for p in parties if p != me]
    incarnation = str(time.time_ns())
    keys = getattr(protection, "keys", None)
    request = encode_fields(announcement=keys.announcement() if keys is not None else b"")
    admit_tag = f"{ADMIT_PREFIX}{incarnation}"
    deadline = time.monotonic() + timeout
    sent_at = -1e9
    while True:
        if time.monotonic() - sent_at > 30.0:
            exchange.send(CONTROL_ROUND, f"{REJOIN_PREFIX}{incarnation}", request, peers)
            sent_at = time.monotonic()
        found = [sender for tag, sender in client.pending(CONTROL_ROUND, admit_tag) if sender in peers]
        if found:
            break
        if time.monotonic() > deadline:
            raise JobFailedError(f"no peer admitted {me} back within {timeout:g} s (is the job still running?)")
        time.sleep(0.2)
    leader = found[0]
    outer = decode_fields(exchange.recv(CONTROL_ROUND, admit_tag, leader, timeout=1.0), "announcement", "sealed")
    if keys is not None:
        keys.accept(leader, outer["announcement"], replace=True)
    inner = decode_fields(
        _open(keys, leader, admit_tag, outer["sealed"]),
        "round",
        "participants",
        "counts",
        "secrets",
        "announcements",
        "strategy",
        "chunks",
        "handled",
    )
    round_number, participants = int(inner["round"]), [str(p) for p in inner["participants"]]
    if me not in participants or any(p not in parties for p in participants):
        raise ProtocolError(f"admission from {leader!r} lists participants {participants} that do not fit the job")
    if keys is not None:
        for party, announcement in json.loads(inner["announcements"]).items():
            if party != me:
                keys.accept(party, announcement.encode(), replace=True)
    model = b""
    for index in range(int(inner["chunks"])):
        chunk_tag = f"{MODEL_PREFIX}{incarnation}/{index}"
        model += _open(keys, leader, chunk_tag, exchange.recv(round_number, chunk_tag, leader))
    weights = {name[2:]: value for name, value in _arrays(model, f"model from {leader!r}").items()}
    secrets = decode_fields(inner["secrets"])
    counts = {p: np.asarray(v, dtype=np.float64) for p, v in json.loads(inner["counts"]).items()}
    return Admission(
        round=round_number,
        participants=participants,
        counts=counts,
        secrets={k: v for k, v in secrets.items() if isinstance(v, bytes)},
        weights=weights,
        strategy=_arrays(inner["strategy"], f"strategy state from {leader!r}"),
        handled=[str(t) for t in inner["handled"]],
        leader=leader,
    )
