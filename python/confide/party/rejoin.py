"""A party that comes back: who takes part in each round, and how a restarted party rejoins.

A horizontal party that crashed is dropped from the round it was in (the survivors retry it).
When its process is started again with ``--rejoin`` it reloads its own last checkpoint, makes
a fresh X25519 key and sends every peer a **rejoin request** at ``CONTROL_ROUND``: its
incarnation (a number larger than any earlier one of this party) and its key announcement,
signed together with its certificate key. Every peer checks the signature against the
federation CA and, where the party's certificate directory holds the CRL, that the certificate
is not revoked; a request no newer than the last incarnation seen is a replay and is ignored.
So neither the relay nor a peer can rejoin in a party's name, or replay an old request. The
relay, seeing the request, aborts any open attempt its old process held up, so nobody waits
out a round timeout for a process that no longer exists.

At every round's start the **leader** (the first participant) looks for requests and decides
the round's membership:

1. It verifies each request and sends every other participant a ``membership`` message for
   the round, signed with its certificate key: who joins, with their signed requests (each
   receiver verifies them itself), and the newest incarnation seen of every party, so a later
   leader never admits a stale request.
2. It admits each joiner at ``CONTROL_ROUND`` (``admit/<incarnation>``): its own announcement
   in clear, then, sealed under the new pair key, the round number, the participants, the
   sample counts, the mode's group secrets (the shared Paillier key, the group key) and every
   participant's announcement; and the round-start global model and strategy state in sealed
   4 MB chunks at the round itself, so a large model passes the relay in pieces under its
   message cap and leaves with the round's messages. In ``plain`` mode (no pair keys; the relay
   sees every update anyway) the admission and the model travel unsealed.

A joiner not admitted within ``max(60 s, round_timeout_s)`` asks again under a new incarnation
(the leader that decided on its request may have died before admitting it).

A round that loses all parties but one (the leader among them, say, with 3 parties and
``min_parties`` 2) would leave too few to retry it. The one survivor then waits for the dropped
parties' requests (:meth:`Membership.await_rejoiners`) and, as the retry's leader, admits them
to the next attempt of that round with the round-start model; the admission names the attempt.

The others read the decision after local training (the message has long arrived), so a round
costs no extra wait while everyone is present. A leader that dies between rounds is noticed
from its own rejoin request: its peers run the round without it, and the next leader admits it.

The joiner trains the round it was admitted to on the model it was given, exactly as the
others do, so every party ends with the same model; its report keeps the rounds before the
crash and names the rounds it missed. Threshold mode cannot rejoin (a key share dies with its
process) and says so; a job under differential privacy rejoins with its own ledger, which
counts the rounds it took part in, and a party whose budget is spent does not ask back in.
"""

from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from confide.crypto.identity import verify_signature
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
    incarnations: dict[str, int] = field(default_factory=dict)
    leader: str = ""
    #: The attempt of ``round`` it joins: 0, or the retry a lone survivor admitted it to.
    attempt: int = 0
    #: The request tags this process sent (dropped from the client's re-send list once admitted).
    requests: list[str] = field(default_factory=list)


def _statement(kind: str, job_id: str, party: str, *parts: bytes) -> bytes:
    return b"\x00".join([f"confide-{kind}-v1".encode(), job_id.encode(), party.encode(), *parts])


def _signed(identity, kind: str, job_id: str, payload: bytes, *parts: bytes) -> bytes:
    """``payload`` with the sender's certificate and its signature over (kind, job, sender, parts, payload)."""
    statement = _statement(kind, job_id, identity.name, *parts, payload)
    return encode_fields(payload=payload, certificate=identity.cert_pem, signature=identity.sign(statement))


def _verified(identity, kind: str, job_id: str, sender: str, data: bytes, *parts: bytes, revoked=None) -> bytes:
    """The payload of a :func:`_signed` message from ``sender``; a forged, foreign or revoked one raises."""
    fields = decode_fields(data, "payload", "certificate", "signature")
    for name in ("payload", "certificate", "signature"):
        if not isinstance(fields[name], bytes):
            raise ProtocolError(f"{kind} message from {sender!r}: {name} must be bytes")
    statement = _statement(kind, job_id, sender, *parts, fields["payload"])
    verify_signature(fields["certificate"], identity.ca_pem, statement, fields["signature"], expected_name=sender)
    if revoked is not None:
        revoked(fields["certificate"])
    return fields["payload"]


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _arrays(data: bytes, what: str) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, KeyError, EOFError) as error:
        raise ProtocolError(f"{what} is not a valid array bundle: {error}") from None


def _incarnation(tag: str) -> int:
    try:
        return int(tag.rsplit("/", 1)[-1])
    except ValueError:
        return -1


def _seal(keys, party: str, tag: str, data: bytes) -> bytes:
    # Without pair keys (plain mode) the relay already sees every update: nothing is sealed.
    return keys.seal_to(party, tag, data) if keys is not None else data


def _open(keys, party: str, tag: str, data: bytes) -> bytes:
    return keys.open_from(party, tag, data) if keys is not None else data


class Membership:
    """One party's view of who takes part in each round, and its part in admitting rejoiners.

    ``revoked(cert_pem)`` raises for a revoked certificate (the federation's CRL, where this
    party holds it); None: only the CA's signature is checked.
    """

    def __init__(
        self, parties: list[str], party_id: str, protection, exchange, client, counts: dict, revoked=None
    ) -> None:
        self.parties = list(parties)
        self.party_id = party_id
        self.protection = protection
        self.exchange = exchange
        self.client = client
        #: Sample counts per party from the set-up exchange (a joiner needs them for the weights).
        self.counts = counts
        self.revoked = revoked
        #: The newest incarnation decided on per party: a request must be newer to count.
        self.incarnations: dict[str, int] = {}
        self._checked: dict[tuple[str, str], bytes | None] = {}  # (party, tag) -> announcement, None if refused
        self._decision: dict[str, dict] | None = None

    @property
    def _keys(self):
        return getattr(self.protection, "keys", None)

    def _request(self, party: str, tag: str) -> bytes | None:
        """The verified announcement of ``party``'s request ``tag`` (b"" in plain mode), or None."""
        key = (party, tag)
        if key not in self._checked:
            try:
                data = self.exchange.recv(CONTROL_ROUND, tag, party, timeout=5.0)
                payload = _verified(
                    self.exchange.identity,
                    "rejoin",
                    self.exchange.job_id,
                    party,
                    data,
                    str(_incarnation(tag)).encode(),
                    revoked=self.revoked,
                )
                self._checked[key] = decode_fields(payload, "announcement")["announcement"]
            except ConfideError as error:
                log.warning("rejoin request %s of %s refused: %s", tag, party, error)
                self._checked[key] = None
        return self._checked[key]

    def _newest(self, party: str) -> tuple[str, bytes] | None:
        """``party``'s newest verified request newer than any decided on, as (tag, announcement)."""
        known = self.incarnations.get(party, 0)
        tags = sorted(
            (tag for tag, sender in self.client.pending(CONTROL_ROUND, REJOIN_PREFIX) if sender == party),
            key=_incarnation,
            reverse=True,
        )
        for tag in tags:
            if _incarnation(tag) <= known:
                return None
            announcement = self._request(party, tag)
            if announcement is not None:
                return tag, announcement
        return None

    def open_round(self, round_number: int, participants: list[str], snapshot, attempt: int = 0) -> list[str]:
        """At a round's start, before training: the leader decides and admits (others do nothing).

        ``snapshot()`` gives the round-start global model and strategy state (called only when
        someone joins), which a joiner must start from to end the round with everyone's model.
        ``attempt``: the attempt of the round the joiners take part in (a lone survivor's retry,
        :meth:`await_rejoiners`). Returns the round's members as decided here.
        """
        self._decision = None
        if not self.protection.rejoinable or participants[0] != self.party_id:
            return list(participants)
        joiners: dict[str, dict] = {}
        for party in self.parties:
            if party == self.party_id:
                continue
            found = self._newest(party)
            if found is None:
                continue
            tag, announcement = found
            if self._keys is not None:
                try:
                    self._keys.accept(party, announcement, replace=True)
                except ConfideError as error:
                    log.warning("rejoin request %s of %s refused: %s", tag, party, error)
                    continue
            joiners[party] = {"tag": tag, "request": self.exchange.recv(CONTROL_ROUND, tag, party, timeout=1.0)}
            self.incarnations[party] = _incarnation(tag)
        self._decision = joiners
        if joiners:
            members = self._members(participants, joiners)
            weights, strategy_state = snapshot()
            for party, joiner in joiners.items():
                try:
                    self._admit(round_number, party, joiner["tag"], members, weights, strategy_state, attempt)
                except ConfideError as error:  # it asks again under a new incarnation
                    log.warning("round %d: admitting %s failed: %s", round_number, party, error)
                    continue
                log.info("round %d: %s rejoins (request %s)", round_number, party, joiner["tag"])
        # The others hear of the joiners only now that every node has their admission: their
        # headers of this round list the joiners, and a node that still counted one a dead process
        # would abort the attempt before the joiner's own header came (docs/dataplane.md).
        others = [p for p in participants if p != self.party_id and p not in joiners]
        if others:
            payload = encode_fields(
                round=round_number,
                incarnations=json.dumps(self.incarnations),
                joiners=json.dumps({p: j["tag"] for p, j in joiners.items()}),
                **{f"request/{p}": j["request"] for p, j in joiners.items()},
            )
            identity = self.exchange.identity
            message = _signed(identity, MEMBERSHIP, self.exchange.job_id, payload, str(round_number).encode())
            self.exchange.send(round_number, MEMBERSHIP, message, others)
        return self._members(participants, joiners)

    def await_rejoiners(self, round_number: int, dropped: list[str], needed: int, timeout: float) -> bool:
        """A lone survivor of an aborted round: wait until ``needed`` of ``dropped`` ask back in.

        Two of three parties crashing in one round leave fewer than ``min_parties``; under a
        launcher (or a service manager) that restarts them they ask back in within seconds, and
        the survivor can admit them to a retry of the same round (:meth:`open_round` with the
        next attempt) instead of failing the job. Returns whether enough asked within ``timeout``.
        """
        if not self.protection.rejoinable:
            return False
        deadline = time.monotonic() + timeout
        log.warning(
            "round %d: %s dropped out and too few parties are left; waiting up to %gs for them to ask back in",
            round_number,
            ", ".join(dropped),
            timeout,
        )
        while True:
            if sum(self._newest(party) is not None for party in dropped) >= needed:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def settle(self, round_number: int, participants: list[str], timeout: float) -> list[str]:
        """After training: the round's participants, as the leader decided them."""
        if not self.protection.rejoinable:
            return participants
        leader = participants[0]
        if leader == self.party_id:
            return self._members(participants, self._decision or {})
        deadline = time.monotonic() + timeout
        while True:
            # The leader's own (verified, new) rejoin request first: if it is here, its membership
            # message (sent before it died, if at all) is here too: the relay keeps a sender's order.
            restarted = self._newest(leader) is not None
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
        payload = _verified(
            self.exchange.identity, MEMBERSHIP, self.exchange.job_id, leader, message, str(round_number).encode()
        )
        fields = decode_fields(payload, "round", "incarnations", "joiners")
        if fields["round"] != round_number:
            raise ProtocolError(f"membership message of round {fields['round']} arrived for round {round_number}")
        joiners = json.loads(fields["joiners"])
        for party, tag in joiners.items():
            request = fields.get(f"request/{party}")
            if party not in self.parties or not isinstance(request, bytes):
                raise ProtocolError(f"membership message admits {party!r} without its request")
            payload = _verified(
                self.exchange.identity,
                "rejoin",
                self.exchange.job_id,
                party,
                request,
                str(_incarnation(tag)).encode(),
                revoked=self.revoked,
            )
            if self._keys is not None:
                self._keys.accept(party, decode_fields(payload, "announcement")["announcement"], replace=True)
        for party, number in json.loads(fields["incarnations"]).items():
            self.incarnations[party] = max(self.incarnations.get(party, 0), int(number))
        return self._members(participants, joiners)

    def _members(self, participants: list[str], joiners) -> list[str]:
        return [p for p in self.parties if p in participants or p in joiners]

    def _admit(self, round_number, party, tag, members, weights, strategy_state, attempt: int = 0) -> None:
        keys = self._keys
        incarnation = tag[len(REJOIN_PREFIX) :]
        bundle = _npz(
            {
                **{f"w/{name}": value for name, value in weights.items()},
                **{f"s/{name}": value for name, value in strategy_state.items()},
            }
        )
        chunks = [bundle[i : i + CHUNK_BYTES] for i in range(0, len(bundle), CHUNK_BYTES)] or [b""]
        counts = {p: np.asarray(v, dtype=np.float64).tolist() for p, v in self.counts.items()}
        inner = encode_fields(
            round=round_number,
            participants=members,
            counts=json.dumps(counts),
            secrets=encode_fields(**self.protection.group_secrets),
            announcements=json.dumps(
                {p: a.decode() for p, a in (keys.announcements.items() if keys is not None else []) if p in members}
            ),
            chunks=len(chunks),
            incarnations=json.dumps(self.incarnations),
            attempt=attempt,
            # The aggregator nodes this leader counts lost: the joiner routes as everyone does.
            lost_nodes=json.dumps(sorted(self.client.lost())),
        )
        for index, chunk in enumerate(chunks):
            chunk_tag = f"{MODEL_PREFIX}{incarnation}/{index}"
            self.exchange.send(round_number, chunk_tag, _seal(keys, party, chunk_tag, chunk), [party])
        admit_tag = f"{ADMIT_PREFIX}{incarnation}"
        # Through every node, as the request came: each node that saw the request must see this, or
        # it would take the joiner's attempts for a dead process's (docs/dataplane.md).
        self.client.send_through_every_node(
            CONTROL_ROUND,
            admit_tag,
            encode_fields(
                leader=self.party_id,
                announcement=keys.announcement() if keys is not None else b"",
                sealed=_seal(keys, party, admit_tag, inner),
            ),
            [party],
        )


def request_rejoin(
    protection, exchange, client, parties: list[str], timeout: float, retry_s: float = 60.0, asked=lambda: None
):
    """Ask every peer to take this restarted party back; wait for a leader's admission.

    Not admitted within ``retry_s``, it asks again under a new incarnation (the leader that
    decided on the last request may have died before admitting it); ``asked()`` is called after
    each request went out. Returns an :class:`Admission`.
    """
    if not protection.rejoinable:
        raise JobFailedError(
            f"{protection.mode} mode cannot take a restarted party back: its key share died with its process"
        )
    me = exchange.party_id
    peers = [p for p in parties if p != me]
    keys = getattr(protection, "keys", None)
    announcement = keys.announcement() if keys is not None else b""
    deadline = time.monotonic() + timeout
    sent: list[str] = []
    asked_at = -1e18
    while True:
        if time.monotonic() - asked_at > retry_s:
            incarnation = time.time_ns()
            payload = encode_fields(announcement=announcement)
            request = _signed(exchange.identity, "rejoin", exchange.job_id, payload, str(incarnation).encode())
            sent.append(f"{REJOIN_PREFIX}{incarnation}")
            # Through every node: the peers may have moved the relay off one this fresh process counts live.
            client.send_through_every_node(CONTROL_ROUND, sent[-1], request, peers)
            asked_at = time.monotonic()
            asked()
        wanted = {f"{ADMIT_PREFIX}{_incarnation(tag)}" for tag in sent}
        found = [(tag, s) for tag, s in client.pending(CONTROL_ROUND, ADMIT_PREFIX) if tag in wanted and s in peers]
        if found:
            break
        if time.monotonic() > deadline:
            raise JobFailedError(f"no peer admitted {me} back within {timeout:g} s (is the job still running?)")
        time.sleep(0.2)
    admit_tag, leader = max(found, key=lambda item: _incarnation(item[0]))
    incarnation = admit_tag[len(ADMIT_PREFIX) :]
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
        "chunks",
        "incarnations",
    )
    round_number, participants = int(inner["round"]), [str(p) for p in inner["participants"]]
    client.adopt_lost(int(index) for index in json.loads(inner.get("lost_nodes") or "[]"))
    if me not in participants or any(p not in parties for p in participants):
        raise ProtocolError(f"admission from {leader!r} lists participants {participants} that do not fit the job")
    if keys is not None:
        for party, text in json.loads(inner["announcements"]).items():
            if party != me:
                keys.accept(party, text.encode(), replace=True)
    bundle = b"".join(
        _open(keys, leader, tag, exchange.recv(round_number, tag, leader))
        for tag in (f"{MODEL_PREFIX}{incarnation}/{i}" for i in range(int(inner["chunks"])))
    )
    # Out of the pool and the relay's mailbox: the handed-over model stays in no copy beyond the model's own.
    exchange.release(round_number, f"{MODEL_PREFIX}{incarnation}/")
    arrays = _arrays(bundle, f"model from {leader!r}")
    del bundle
    secrets = decode_fields(inner["secrets"])
    counts = {p: np.asarray(v, dtype=np.float64) for p, v in json.loads(inner["counts"]).items()}
    return Admission(
        round=round_number,
        participants=participants,
        counts=counts,
        secrets={k: v for k, v in secrets.items() if isinstance(v, bytes)},
        weights={name[2:]: value for name, value in arrays.items() if name.startswith("w/")},
        strategy={name[2:]: value for name, value in arrays.items() if name.startswith("s/")},
        incarnations={p: int(n) for p, n in json.loads(inner["incarnations"]).items()},
        leader=leader,
        requests=sent,
        attempt=_attempt(inner.get("attempt", 0)),
    )


def _attempt(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1_000_000:
        raise ProtocolError(f"admission names attempt {value!r}, not an attempt number")
    return value
