"""What the aggregator can learn, checked on everything it received over the wire.

The parties run ``run_party`` (real gRPC + mTLS) in threads of this process so the test can see
their keys and true updates; the aggregator records every header, slice and envelope it gets.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np
import pytest

from confide.aggregator import AggregatorConfig, serve
from confide.crypto import EncryptedVector, EncryptionKey
from confide.party import runner
from confide.transport.certs import Identity, init_federation
from tests.integration.conftest import make_spec

PARTIES = ["hospital-a", "hospital-b", "hospital-c"]


def run_recorded(tmp_path, monkeypatch, mode: str, **spec_overrides):
    spec = make_spec(job_id=f"privacy-{mode}", rounds=2, protection={"mode": mode}, **spec_overrides)
    certs = tmp_path / "certs"
    init_federation(certs, parties=PARTIES)
    recorded = []
    server, port, core = serve(
        Identity.load(certs, "aggregator"),
        "127.0.0.1:0",
        AggregatorConfig(round_timeout_s=30),
        observer=lambda event, party, message: recorded.append((event, party, message)),
    )
    protections, truth = {}, defaultdict(dict)
    make = runner.make_protection

    def capture(mode_name, exchange, params, **extra):
        protection = make(mode_name, exchange, params, **extra)
        protections[exchange.party_id] = protection
        encode = protection.encode

        def recording_encode(context, index, values):
            truth[exchange.party_id][(context.round, index)] = np.array(values, dtype=np.float64)
            return encode(context, index, values)

        protection.encode = recording_encode
        return protection

    monkeypatch.setattr(runner, "make_protection", capture)
    reports, errors = {}, []

    def party(name):
        try:
            reports[name] = runner.run_party(
                spec, name, aggregator=f"127.0.0.1:{port}", certs_dir=certs, workdir=tmp_path / "work"
            )
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=party, args=(name,)) for name in PARTIES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    server.stop(grace=None).wait()
    core.close()
    assert not errors, errors
    return recorded, protections, truth, reports


def first_slices(recorded) -> dict[str, np.ndarray]:
    """Slice 0 of round 1 per party: each party's stream delivers its rounds in order."""
    out = {}
    for event, party, message in recorded:
        if event == "slice" and message.index == 0 and party not in out:
            out[party] = np.frombuffer(message.payload, "<u4")
    return out


def payloads(recorded):
    for event, _, message in recorded:
        if event == "slice":
            yield message.payload
        elif event == "envelope":
            yield message.payload
        elif event == "header":
            yield message.encryption_key


def test_paillier_aggregator_gets_ciphertexts_and_the_public_key_only(tmp_path, monkeypatch):
    recorded, protections, _, _ = run_recorded(tmp_path, monkeypatch, "paillier")
    keys = {p._key.export_secret() for p in protections.values()}
    assert len(keys) == 1, "every party holds the one shared key"
    secret = protections["hospital-a"]._key
    public = secret.encryption_key
    p, q = secret.primes()
    forbidden = [secret.export_secret(), p.to_bytes(128, "big"), q.to_bytes(128, "big")]
    seen = list(payloads(recorded))
    assert seen
    for blob in seen:
        for item in forbidden:
            assert item not in blob
    headers = [m for e, _, m in recorded if e == "header"]
    keyed = [h for h in headers if h.encryption_key]
    assert {h.party_id for h in keyed} == set(PARTIES), "each party sends the public key once per job"
    assert len(keyed) < len(headers), "later headers leave the key out"
    assert all(EncryptionKey.from_bytes(h.encryption_key) == public for h in keyed)
    slices = [m for e, _, m in recorded if e == "slice"]
    assert slices
    for item in slices:
        vector = EncryptedVector.from_bytes(item.payload, public)
        assert vector.num_ciphertexts >= 1
    # The key bundle went through the relay sealed: no envelope parses as a secret key or a public key.
    assert all(b"CSK1" not in m.payload for e, _, m in recorded if e == "envelope")


def test_secagg_aggregator_learns_only_the_sum(tmp_path, monkeypatch):
    spec = {"data": {"dataset": "synthetic", "samples": 900, "features": 4000, "density": None}}
    recorded, _, truth, reports = run_recorded(tmp_path, monkeypatch, "secagg", **spec)
    fraction_bits = reports["hospital-a"]["rounds"][0]["stats"]["fraction_bits"]
    first = {p: truth[p][(1, 0)] for p in PARTIES}
    # Round 1, slice 0 of each party as the aggregator saw it: uncorrelated with the true update...
    round_one = first_slices(recorded)
    for party, words in round_one.items():
        decoded = words.view(np.int32) / 2.0**fraction_bits
        assert abs(np.corrcoef(decoded, first[party])[0, 1]) < 0.1
    # ...while their sum is the sum of the updates.
    total = sum(w.astype(np.uint64) for w in round_one.values()) % 2**32
    decoded_sum = total.astype(np.uint32).view(np.int32) / 2.0**fraction_bits
    np.testing.assert_allclose(decoded_sum, sum(first.values()), atol=3 * 2.0**-fraction_bits)


def test_groupmask_aggregator_learns_not_even_the_sum(tmp_path, monkeypatch):
    spec = {"data": {"dataset": "synthetic", "samples": 900, "features": 4000, "density": None}}
    recorded, protections, truth, reports = run_recorded(tmp_path, monkeypatch, "groupmask", **spec)
    fraction_bits = reports["hospital-a"]["rounds"][0]["stats"]["fraction_bits"]
    first = {p: truth[p][(1, 0)] for p in PARTIES}
    round_one = first_slices(recorded)
    total = sum(w.astype(np.uint64) for w in round_one.values()) % 2**32
    decoded_sum = total.astype(np.uint32).view(np.int32) / 2.0**fraction_bits
    true_sum = sum(first.values())
    assert abs(np.corrcoef(decoded_sum, true_sum)[0, 1]) < 0.1
    for party, words in round_one.items():
        assert abs(np.corrcoef(words.view(np.int32).astype(float), first[party])[0, 1]) < 0.1
    for blob in payloads(recorded):
        assert protections["hospital-a"]._group_key not in blob
    # The parties themselves recovered the sum (their models agree and trained).
    weights = {tuple(r["weights"]) for r in reports.values()}
    assert len(weights) == 1


@pytest.mark.parametrize("mode", ["plain"])
def test_plain_mode_says_the_aggregator_sees_everything(tmp_path, monkeypatch, mode):
    _, protections, _, reports = run_recorded(tmp_path, monkeypatch, mode)
    assert reports["hospital-a"]["protection"]["aggregator_sees"] == "every party's update in the clear"


def test_tee_aggregator_outside_the_enclave_gets_ciphertexts_and_a_wrapped_key(tmp_path, monkeypatch):
    recorded, protections, truth, reports = run_recorded(tmp_path, monkeypatch, "tee")
    headers = [m for event, _, m in recorded if event == "header"]
    session_keys = {p._aead is not None for p in protections.values()}
    assert session_keys == {True}
    for header in headers:
        # 92 bytes: the session key wrapped to the enclave's X25519 key, never the key itself.
        assert len(header.encryption_key) in (0, 92)
    slices = [(party, m) for event, party, m in recorded if event == "slice"]
    assert slices
    for party, message in slices:
        # nonce + ciphertext + tag; the float32 words of the true update appear nowhere.
        values = truth[party][(1, message.index)] if (1, message.index) in truth[party] else None
        assert len(message.payload) == 12 + 4 * message.n_valid + 16
        if values is not None:
            assert np.asarray(values, dtype="<f4").tobytes() not in message.payload
    for report in reports.values():
        assert report["protection"]["enclave_simulated"] is True
