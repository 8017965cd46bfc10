"""What the relay holds: deliveries until their recipients acknowledge them, never refused for room.

A real aggregator over mTLS and one AggregatorClient per party (threads of this process). A
threshold key generation of six parties with a small candidate batch sends hundreds of batches
through the relay; before acknowledgements the relay kept every one until round 1 and refused
pushes past a 2 GiB cap (four parties once died of it).
"""

from __future__ import annotations

import threading
import time

import pytest

from confide.aggregator import AggregatorConfig, serve
from confide.crypto import threshold as th
from confide.protect.base import SETUP_ROUND
from confide.transport.certs import Identity, init_federation
from confide.transport.client import AggregatorClient

PARTIES = [f"party-{i}" for i in range(1, 7)]


@pytest.fixture
def relay(tmp_path):
    init_federation(tmp_path / "certs", parties=PARTIES)
    identity = Identity.load(tmp_path / "certs", "aggregator")
    config = AggregatorConfig(state_dir=str(tmp_path / "state"), mailbox_memory_bytes=1 << 20)
    server, port, core = serve(identity, "127.0.0.1:0", config)
    clients = {
        name: AggregatorClient(f"127.0.0.1:{port}", Identity.load(tmp_path / "certs", name), "job-1")
        for name in PARTIES
    }
    for client in clients.values():
        client.connect(timeout=10)
    yield core, clients
    for client in clients.values():
        client.close()
    server.stop(grace=None).wait()
    core.close()


class _Channel:
    """The key generation's channel straight over a client (the sealing of protect/threshold.py left out).

    Tags are prefixed by the generation's number, so one set of clients runs several in turn.
    """

    def __init__(self, client: AggregatorClient, generation: int, batches: list[int], sent: list[int]) -> None:
        self.client, self.index, self.parties = client, PARTIES.index(client.party_id) + 1, len(PARTIES)
        self.prefix, self.batches, self.sent = f"gen{generation}/", batches, sent

    def send(self, to: int, tag: str, payload: bytes) -> None:
        if self.index == 1 and to == 2 and tag.startswith("dkg/modulus/") and tag.endswith("/shares"):
            self.batches.append(1)
        self.sent.append(len(payload))
        self.client.send(SETUP_ROUND, self.prefix + tag, payload, [PARTIES[to - 1]])

    def broadcast(self, tag: str, payload: bytes) -> None:
        for to in range(1, self.parties + 1):
            if to != self.index:
                self.send(to, tag, payload)

    def recv(self, sender: int, tag: str) -> bytes:
        return self.client.recv(SETUP_ROUND, self.prefix + tag, PARTIES[sender - 1], timeout=120)

    def release(self, prefix: str) -> None:
        self.client.release(SETUP_ROUND, self.prefix + prefix)


def _watch(core, samples: list[int], done: threading.Event) -> threading.Thread:
    def watch() -> None:
        while not done.wait(0.02):
            samples.append(core.mailboxes.retained_bytes + core.mailboxes.spilled_bytes)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _all_acknowledged(core) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and core.mailboxes.retained_bytes:
        time.sleep(0.05)
    return core.mailboxes.retained_bytes == 0


def test_threshold_key_generations_of_six_parties_leave_the_relay_holding_little(relay):
    """Small candidate batches; generations in turn until 30 batches (480 candidates) ran: the count is random."""
    core, clients = relay
    errors, samples, done, batches, sent = [], [], threading.Event(), [], []
    watcher = _watch(core, samples, done)
    generation = 0
    while len(batches) < 30 and generation < 30:
        generation += 1
        keys = {}

        def generate(name: str, generation: int = generation, keys: dict = keys) -> None:
            try:
                channel = _Channel(clients[name], generation, batches, sent)
                keys[name] = th.generate_threshold_key(channel, bits=256, threshold=3, batch=16)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=generate, args=(name,), daemon=True) for name in PARTIES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not errors, errors
        assert len({key.public.n for key in keys.values()}) == 1
    done.set()
    watcher.join(5)
    assert len(batches) >= 30
    # What the relay holds is what went out within about one acknowledgement interval (0.2 s),
    # however many batches ran: a small share of what passed through, never the exchange until
    # round 1 (which is what it kept before acknowledgements), and nothing went to disk (1 MiB
    # memory budget). How much one interval holds depends on the host: on 2026-11-29 four runs
    # here peaked at 275-337 KiB of 7-10 MB relayed (a fixed 256 KiB bound had failed a CI run).
    relayed = sum(sent)
    print(f"relayed {relayed} bytes in {len(sent)} messages; the relay held at most {max(samples)}")
    assert max(samples) <= relayed // 10
    assert core.mailboxes.peak_bytes <= 1 << 20 and core.mailboxes.spilled_bytes == 0
    assert _all_acknowledged(core), "every delivery filed is acknowledged and dropped"


def test_what_the_relay_holds_does_not_grow_with_the_length_of_an_exchange(relay):
    """Six parties, 200 steps of 4 KiB to all peers (24 MB delivered), every step read before the next."""
    core, clients = relay
    payload = bytes(4096)
    samples, errors, done = [], [], threading.Event()
    steps = 200

    def exchange(name: str) -> None:
        try:
            client = clients[name]
            peers = [p for p in PARTIES if p != name]
            for step in range(1, steps + 1):
                client.send(SETUP_ROUND, f"step/{step}", payload, peers)
                for peer in peers:
                    assert client.recv(SETUP_ROUND, f"step/{step}", peer, timeout=60) == payload
                if step > 1:
                    client.release(SETUP_ROUND, f"step/{step - 1}")
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    watcher = _watch(core, samples, done)
    threads = [threading.Thread(target=exchange, args=(name,), daemon=True) for name in PARTIES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    done.set()
    watcher.join(5)
    assert not errors, errors
    relayed = sum(sum(client.bytes_sent.values()) for client in clients.values())
    assert relayed > 6 * steps * len(payload)  # one envelope to five peers is sent once
    early, late = max(samples[: len(samples) // 4]), max(samples[len(samples) // 4 :])
    assert max(samples) <= 1 << 20 and core.mailboxes.spilled_bytes == 0
    assert late <= 2 * early + 64 * 1024, (early, late)  # flat: the last three quarters hold no more
    assert _all_acknowledged(core)


def test_a_party_that_reads_nothing_slows_only_itself(relay, tmp_path):
    """One recipient never subscribes again: the others get every envelope, the relay spills its share."""
    core, clients = relay
    absent = clients.pop(PARTIES[-1])
    absent.close()  # its mailbox fills; nobody reads or acknowledges it
    sender = clients[PARTIES[0]]
    payload = bytes(64 * 1024)
    for number in range(48):  # 3 MiB to each recipient, against a 1 MiB memory budget
        sender.send(1, f"big/{number}", payload, PARTIES[1:])
    for name in PARTIES[1:-1]:
        for number in range(48):
            assert clients[name].recv(1, f"big/{number}", PARTIES[0], timeout=30) == payload
    assert core.mailboxes.peak_bytes <= 1 << 20
    assert core.mailboxes.spilled_bytes > 0
    assert core.mailboxes.unacknowledged("job-1", PARTIES[-1]) == 48
    spilled = list((tmp_path / "state" / "mailboxes").iterdir())
    assert spilled, "the absent party's deliveries wait on disk"
    # The round after next retires them, acknowledged or not.
    sender.send(3, "next", b"x", [PARTIES[1]])
    assert core.mailboxes.unacknowledged("job-1", PARTIES[-1]) == 0
    assert core.mailboxes.spilled_bytes == 0
    assert not list((tmp_path / "state" / "mailboxes").iterdir())
