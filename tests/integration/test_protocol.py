"""The aggregator's services over real mTLS: identities, bad slices, duplicates, late rounds."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from confide.aggregator import AggregatorConfig, serve
from confide.crypto import BatchCryptCodec, DecryptionKey, encrypt_packed
from confide.errors import PermissionDeniedError, ProtocolError, RoundClosedError, TransportUnavailableError
from confide.transport.certs import Identity, init_federation
from confide.transport.client import AGGREGATOR, AggregatorClient
from confide.v1 import runtime_pb2 as pb
from confide.v1 import runtime_pb2_grpc as rpc
from tests.fixtures.keys import fixed_key

PARTIES = ["party-a", "party-b"]


@pytest.fixture
def federation(tmp_path):
    init_federation(tmp_path / "certs", parties=PARTIES)
    init_federation(tmp_path / "rogue", parties=PARTIES)
    identity = Identity.load(tmp_path / "certs", "aggregator")
    server, port, core = serve(identity, "127.0.0.1:0", AggregatorConfig(round_timeout_s=3.0, dropout_grace_s=0.5))
    clients = []

    def client(name: str, directory: str = "certs") -> AggregatorClient:
        c = AggregatorClient(
            f"127.0.0.1:{port}",
            Identity.load(tmp_path / directory, name),
            "job-1",
            reconnect_timeout_s=3,
            message_timeout_s=5,
        )
        clients.append(c)
        return c

    yield client, port, tmp_path
    for c in clients:
        c.close()
    server.stop(grace=None).wait()
    core.close()


def header(party: str, *, round_number: int = 1, attempt: int = 0, length: int = 10, **extra) -> pb.RoundHeader:
    fields = dict(
        job_id="job-1",
        round=round_number,
        attempt=attempt,
        party_id=party,
        participants=PARTIES,
        kind=pb.AGGREGATION_KIND_FLOAT32_SUM,
        num_slices=1,
        slice_length=16,
        vector_length=length,
        routing=pb.RESULT_ROUTING_ALL,
        mode="plain",
    )
    fields.update(extra)
    return pb.RoundHeader(**fields)


def floats(values) -> pb.Slice:
    data = np.asarray(values, dtype="<f4")
    return pb.Slice(index=0, n_valid=data.size, payload=data.tobytes())


def test_peer_from_another_ca_is_refused(federation):
    client, port, tmp_path = federation
    rogue = client("party-a", "rogue")
    with pytest.raises(TransportUnavailableError):
        rogue.connect(timeout=2)


def test_client_without_certificate_is_refused(federation):
    _, port, tmp_path = federation
    ca = (tmp_path / "certs" / "ca.crt").read_bytes()
    with grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(root_certificates=ca)) as channel:
        with pytest.raises(grpc.RpcError) as error:
            rpc.AggregationStub(channel).Health(pb.HealthRequest(), timeout=2)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_claiming_another_partys_identity_is_refused(federation):
    client, _, _ = federation
    a = client("party-a")
    with pytest.raises(PermissionDeniedError, match="party-b.*party-a"):
        a.push(header("party-b"), [floats(np.ones(10))])
    envelope = pb.Envelope(job_id="job-1", round=0, tag="t", sender="party-b", recipients=["party-a"], payload=b"x")
    with pytest.raises(grpc.RpcError) as error:
        a._relay.Send(envelope, timeout=3)
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stream = a._relay.Subscribe(pb.SubscribeRequest(job_id="job-1", party_id="party-b"), timeout=3)
    with pytest.raises(grpc.RpcError) as error:
        next(stream)
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_bad_slices_get_clear_errors_and_the_round_still_completes(federation):
    client, _, _ = federation
    a, b = client("party-a"), client("party-b")
    a.connect()
    b.connect()
    good = np.arange(10, dtype=np.float32)
    with pytest.raises(ProtocolError, match="n_valid of slice 0 is 9; it must be 10"):
        a.push(header("party-a"), [pb.Slice(index=0, n_valid=9, payload=good[:9].tobytes())])
    with pytest.raises(ProtocolError, match="payload holds 36 bytes"):
        a.push(header("party-a"), [pb.Slice(index=0, n_valid=10, payload=good[:9].tobytes())])
    with pytest.raises(ProtocolError, match="index 3 is out of range"):
        a.push(header("party-a"), [pb.Slice(index=3, n_valid=10, payload=good.tobytes())])
    with pytest.raises(ProtocolError, match="non-finite"):
        a.push(header("party-a"), [floats([np.nan] * 10)])
    with pytest.raises(ProtocolError, match="header.vector_length"):
        b.push(header("party-b", length=11), [floats(np.ones(11))])
    assert a.push(header("party-a"), [floats(good)]).accepted == 1
    reply = b.push(header("party-b"), [floats(good)])
    assert reply.round_complete
    for c in (a, b):
        combined = c.wait(("job-1", 1, "agg/0/0", AGGREGATOR), 5)
        np.testing.assert_array_equal(np.frombuffer(combined.payload, "<f4"), 2 * good)


def test_duplicated_and_late_slices(federation):
    client, _, _ = federation
    a, b = client("party-a"), client("party-b")
    a.connect()
    b.connect()
    values = np.ones(10, dtype=np.float32)
    reply = a.push(header("party-a"), [floats(values), floats(values)])
    assert (reply.accepted, reply.duplicates) == (1, 1)
    assert a.push(header("party-a"), [floats(values)]).duplicates == 1
    assert b.push(header("party-b"), [floats(values)]).round_complete
    # A late copy after completion: acknowledged as complete, the result is queued again, nothing is re-added.
    late = a.push(header("party-a"), [floats(values)])
    assert late.round_complete and late.accepted == 0
    combined = a.wait(("job-1", 1, "agg/0/0", AGGREGATOR), 5)
    np.testing.assert_array_equal(np.frombuffer(combined.payload, "<f4"), 2 * values)
    # Rounds far behind the job are closed.
    assert a.push(header("party-a", round_number=4), []).accepted == 0
    with pytest.raises(RoundClosedError, match="round 1 of job 'job-1' is closed"):
        a.push(header("party-a", round_number=1, attempt=1), [floats(values)])


def test_absent_participant_aborts_the_attempt_and_late_slices_are_refused(federation):
    client, _, _ = federation
    a = client("party-a")
    a.connect()
    a.watch_round(1, 0)
    a.push(header("party-a"), [floats(np.ones(10))])
    from confide.errors import RoundAbortedError

    with pytest.raises(RoundAbortedError) as aborted:
        a.wait(("job-1", 1, "agg/0/0", AGGREGATOR), 10)
    assert aborted.value.dropped == ["party-b"]
    assert aborted.value.survivors == ["party-a"]
    b = client("party-b")
    with pytest.raises(RoundClosedError, match="aborted"):
        b.push(header("party-b"), [floats(np.ones(10))])


def test_paillier_slices_under_another_key_are_refused(federation):
    client, _, _ = federation
    a, b = client("party-a"), client("party-b")
    key, other = fixed_key(), DecryptionKey.generate(2048)
    codec = BatchCryptCodec(bits=16, max_parties=2, alpha=1.0)
    values = np.linspace(-0.5, 0.5, 10)

    def ciphertext(k):
        return pb.Slice(index=0, n_valid=10, payload=encrypt_packed(values, codec, k).to_bytes())

    paillier = dict(
        kind=pb.AGGREGATION_KIND_PAILLIER_PRODUCT,
        routing=pb.RESULT_ROUTING_ROUND_ROBIN,
        encryption_key=key.encryption_key.to_bytes(),
        mode="paillier",
    )
    with pytest.raises(ProtocolError, match="key"):
        a.push(header("party-a", **paillier), [ciphertext(other)])
    with pytest.raises(ProtocolError, match="header.encryption_key"):
        b.push(header("party-b", **{**paillier, "encryption_key": other.encryption_key.to_bytes()}), [])
    with pytest.raises(ProtocolError, match="header.encryption_key is required"):
        b.push(header("party-b", job_id="job-2", **{**paillier, "encryption_key": b""}), [])
    assert a.push(header("party-a", **paillier), [ciphertext(key)]).accepted == 1
    # Once the aggregator knows the job's key, headers may leave it out.
    assert b.push(header("party-b", **{**paillier, "encryption_key": b""}), [ciphertext(key)]).round_complete


def test_a_completed_round_is_not_served_to_a_run_under_another_key(federation):
    client, _, _ = federation
    a, b = client("party-a"), client("party-b")
    key, other = fixed_key(), DecryptionKey.generate(2048)
    codec = BatchCryptCodec(bits=16, max_parties=2, alpha=1.0)
    paillier = dict(
        kind=pb.AGGREGATION_KIND_PAILLIER_PRODUCT,
        routing=pb.RESULT_ROUTING_ROUND_ROBIN,
        encryption_key=key.encryption_key.to_bytes(),
        mode="paillier",
    )
    block = pb.Slice(index=0, n_valid=10, payload=encrypt_packed(np.zeros(10), codec, key).to_bytes())
    a.push(header("party-a", **paillier), [block])
    assert b.push(header("party-b", **paillier), [block]).round_complete
    rerun = {**paillier, "encryption_key": other.encryption_key.to_bytes()}
    with pytest.raises(ProtocolError, match="completed under another key"):
        a.push(header("party-a", **rerun), [])


def test_relay_keeps_a_resent_envelope_once_and_frees_what_its_recipient_released(federation):
    client, _, _ = federation
    a, b = client("party-a"), client("party-b")
    a.connect(timeout=5)
    b.connect(timeout=5)
    for step in (1, 2):
        a.send(0, f"dkg/modulus/{step}/shares", bytes([step]) * 1000, ["party-b"])
    a._replay()  # what a reconnect does: every retained envelope again, twice here
    a._replay()
    assert b.recv(0, "dkg/modulus/1/shares", "party-a", timeout=5) == b"\x01" * 1000
    assert b.recv(0, "dkg/modulus/2/shares", "party-a", timeout=5) == b"\x02" * 1000

    b.release(0, "dkg/modulus/1/")
    assert b.pending(0, "dkg/") == [("dkg/modulus/2/shares", "party-a")]
    a.release(0, "dkg/modulus/1/")
    assert [key[1] for key in a._sent] == ["dkg/modulus/2/shares"], "released: no longer re-sent"
    # party-b's process ends (acknowledging what it filed); what reaches its mailbox meanwhile
    # waits for the next process, which is replayed that and not what the first one had filed.
    b.close()
    a.send(0, "dkg/modulus/3/shares", b"\x03" * 1000, ["party-b"])
    again = client("party-b")
    again.connect(timeout=5)
    assert again.recv(0, "dkg/modulus/3/shares", "party-a", timeout=5) == b"\x03" * 1000
    assert again.pending(0, "dkg/") == [("dkg/modulus/3/shares", "party-a")]

    # A party frees only its own mailbox.
    theft = pb.Envelope(job_id="job-1", round=2**32 - 1, tag="release/0/dkg/", sender="party-b", recipients=["party-a"])
    with pytest.raises(ProtocolError, match="only recipient"):
        again._call(lambda timeout: again._relay_send(theft, timeout), "releasing")
    malformed = pb.Envelope(
        job_id="job-1", round=2**32 - 1, tag="release/x/dkg/", sender="party-b", recipients=["party-b"]
    )
    with pytest.raises(ProtocolError, match="release/<round>/<tag prefix>"):
        again._call(lambda timeout: again._relay_send(malformed, timeout), "releasing")
    # The same for acknowledgements: only one's own mailbox, and in the form ack/<epoch>/<seq>.
    for tag, recipients, problem in (
        ("ack/1/5", ["party-a"], "only recipient"),
        ("ack/5", ["party-b"], "ack/<epoch>/<sequence number>"),
        ("ack/x/5", ["party-b"], "ack/<epoch>/<sequence number>"),
    ):
        bad = pb.Envelope(job_id="job-1", round=2**32 - 1, tag=tag, sender="party-b", recipients=recipients)
        with pytest.raises(ProtocolError, match=problem):
            again._call(lambda timeout, bad=bad: again._relay_send(bad, timeout), "acknowledging")
