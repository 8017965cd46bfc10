"""PeerKeys (signed X25519 announcements, pair keys, sealing), GroupCipher and the mask PRG."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.errors import CertificateError, ProtocolError
from confide.protect.keys import GroupCipher, PeerKeys, decode_fields, encode_fields, prg_words, round_key

JOB = "job-keys"


@pytest.fixture(scope="module")
def keys(federation):
    """PeerKeys of alpha, bravo and charlie that accepted each other."""
    out = {name: PeerKeys(federation[name], JOB) for name in ("alpha", "bravo", "charlie")}
    for me, mine in out.items():
        for peer, theirs in out.items():
            if peer != me:
                mine.accept(peer, theirs.announcement())
    return out


def flip(data: bytes, position: int) -> bytes:
    out = bytearray(data)
    out[position] ^= 0x01
    return bytes(out)


# ---------------------------------------------------------------------------------------------------------------------
# Announcements


def test_announcement_accepted_from_the_right_peer(federation):
    alpha, bravo = PeerKeys(federation["alpha"], JOB), PeerKeys(federation["bravo"], JOB)
    assert len(alpha.public) == 32 and alpha.public != bravo.public
    alpha.accept("bravo", bravo.announcement())
    fields = decode_fields(bravo.announcement(), "public", "certificate", "signature")
    assert fields["public"] == bravo.public
    # no secret material in the announcement
    assert b"PRIVATE KEY" not in bravo.announcement()


def test_announcement_replayed_under_another_name_is_refused(federation):
    alpha, bravo = PeerKeys(federation["alpha"], JOB), PeerKeys(federation["bravo"], JOB)
    with pytest.raises(CertificateError, match="charlie"):
        alpha.accept("charlie", bravo.announcement())
    with pytest.raises(ProtocolError, match="charlie"):
        alpha.pair_key("charlie", b"mask")


def test_announcement_from_another_federation_is_refused(federation, other_federation):
    alpha = PeerKeys(federation["alpha"], JOB)
    impostor = PeerKeys(other_federation["bravo"], JOB)
    with pytest.raises(CertificateError, match="bravo"):
        alpha.accept("bravo", impostor.announcement())


def test_announcement_of_another_job_is_refused(federation):
    alpha = PeerKeys(federation["alpha"], JOB)
    bravo_other_job = PeerKeys(federation["bravo"], "another-job")
    with pytest.raises(CertificateError):
        alpha.accept("bravo", bravo_other_job.announcement())


def test_announcement_with_substituted_public_key_is_refused(federation):
    alpha, bravo = PeerKeys(federation["alpha"], JOB), PeerKeys(federation["bravo"], JOB)
    relay = PeerKeys(federation["charlie"], JOB)  # any other key the relay could substitute
    fields = decode_fields(bravo.announcement(), "public", "certificate", "signature")
    forged = encode_fields(public=relay.public, certificate=fields["certificate"], signature=fields["signature"])
    with pytest.raises(CertificateError):
        alpha.accept("bravo", forged)


def test_announcement_with_wrong_public_key_length_is_refused(federation):
    alpha, bravo = PeerKeys(federation["alpha"], JOB), PeerKeys(federation["bravo"], JOB)
    fields = decode_fields(bravo.announcement())
    forged = encode_fields(public=b"\x01" * 31, certificate=fields["certificate"], signature=fields["signature"])
    with pytest.raises(ProtocolError, match="32 bytes"):
        alpha.accept("bravo", forged)


@pytest.mark.parametrize("data", [b"", b"not json", b"[1, 2]", b"\xff\xfe", b'{"public": {"b64": "AAAA"}}'])
def test_malformed_announcement_is_a_protocol_error(federation, data):
    alpha = PeerKeys(federation["alpha"], JOB)
    with pytest.raises(ProtocolError):
        alpha.accept("bravo", data)


def test_announcement_with_bad_base64_is_a_protocol_error(federation):
    alpha = PeerKeys(federation["alpha"], JOB)
    data = json.dumps({"public": {"b64": "abc"}, "certificate": "x", "signature": "y"}).encode()
    with pytest.raises(ProtocolError):
        alpha.accept("bravo", data)


def test_announcement_with_non_bytes_fields_is_refused(federation):
    alpha, bravo = PeerKeys(federation["alpha"], JOB), PeerKeys(federation["bravo"], JOB)
    fields = decode_fields(bravo.announcement())
    data = encode_fields(public=fields["public"], certificate=fields["certificate"], signature=12345)
    with pytest.raises((CertificateError, ProtocolError)):
        alpha.accept("bravo", data)


# ---------------------------------------------------------------------------------------------------------------------
# Pair keys and sealing


def test_pair_key_symmetric_and_per_purpose(keys):
    alpha, bravo, charlie = keys["alpha"], keys["bravo"], keys["charlie"]
    assert alpha.pair_key("bravo", b"mask") == bravo.pair_key("alpha", b"mask")
    assert alpha.pair_key("bravo", b"wrap") == bravo.pair_key("alpha", b"wrap")
    assert len(alpha.pair_key("bravo", b"mask")) == 32
    assert alpha.pair_key("bravo", b"mask") != alpha.pair_key("bravo", b"wrap")
    assert alpha.pair_key("bravo", b"mask") != alpha.pair_key("charlie", b"mask")
    assert alpha.pair_key("charlie", b"mask") == charlie.pair_key("alpha", b"mask")
    assert bravo.pair_key("charlie", b"mask") != alpha.pair_key("charlie", b"mask")


def test_pair_key_differs_per_job(federation):
    def pair(job: str) -> bytes:
        alpha, bravo = PeerKeys(federation["alpha"], job), PeerKeys(federation["bravo"], job)
        alpha.accept("bravo", bravo.announcement())
        return alpha.pair_key("bravo", b"mask")

    assert pair("job-a") != pair("job-b")


def test_pair_key_without_announcement_is_a_protocol_error(federation):
    with pytest.raises(ProtocolError, match="bravo"):
        PeerKeys(federation["alpha"], JOB).pair_key("bravo", b"mask")


def test_a_second_different_announcement_is_refused_and_the_first_key_kept(federation):
    alpha = PeerKeys(federation["alpha"], JOB)
    old = PeerKeys(federation["bravo"], JOB)
    alpha.accept("bravo", old.announcement())
    before = alpha.pair_key("bravo", b"mask")
    alpha.accept("bravo", old.announcement())  # a replayed copy of the same key is fine
    new = PeerKeys(federation["bravo"], JOB)  # bravo restarted with a fresh key mid-job
    with pytest.raises(ProtocolError, match="second, different key"):
        alpha.accept("bravo", new.announcement())
    old.accept("alpha", alpha.announcement())
    assert alpha.pair_key("bravo", b"mask") == before == old.pair_key("alpha", b"mask")


@settings(max_examples=25, deadline=None)
@given(payload=st.binary(max_size=2048), tag=st.text(min_size=1, max_size=20))
def test_seal_open_round_trip(keys, payload, tag):
    sealed = keys["alpha"].seal_to("bravo", tag, payload)
    assert keys["bravo"].open_from("alpha", tag, sealed) == payload
    assert len(sealed) == len(payload) + 12 + 16
    if len(payload) >= 16:
        assert payload not in sealed


def test_seal_is_randomized(keys):
    assert keys["alpha"].seal_to("bravo", "t", b"same") != keys["alpha"].seal_to("bravo", "t", b"same")


def test_sealed_message_tampered_or_misdirected_is_refused(keys):
    alpha, bravo, charlie = keys["alpha"], keys["bravo"], keys["charlie"]
    sealed = alpha.seal_to("bravo", "keys/group", b"secret bundle")
    for position in (0, 12, len(sealed) - 1):
        with pytest.raises(ProtocolError, match="keys/group"):
            bravo.open_from("alpha", "keys/group", flip(sealed, position))
    with pytest.raises(ProtocolError):
        bravo.open_from("alpha", "other-tag", sealed)
    with pytest.raises(ProtocolError):
        charlie.open_from("alpha", "keys/group", sealed)  # not the recipient
    with pytest.raises(ProtocolError):
        bravo.open_from("charlie", "keys/group", sealed)  # not the sender
    with pytest.raises(ProtocolError):
        bravo.open_from("alpha", "keys/group", sealed[:-1])


@pytest.mark.parametrize("length", [0, 3, 7])
def test_sealed_message_truncated_below_nonce_is_a_protocol_error(keys, length):
    sealed = keys["alpha"].seal_to("bravo", "t", b"payload")
    with pytest.raises(ProtocolError):
        keys["bravo"].open_from("alpha", "t", sealed[:length])


# ---------------------------------------------------------------------------------------------------------------------
# GroupCipher


@settings(max_examples=25, deadline=None)
@given(payload=st.binary(max_size=2048))
def test_group_cipher_round_trip(payload):
    key = bytes(range(32))
    sealed = GroupCipher(key, JOB).seal("shares/0", "alpha", payload)
    assert GroupCipher(key, JOB).open("shares/0", "alpha", sealed) == payload


def test_group_cipher_tamper_and_context_are_checked():
    key = bytes(range(32))
    group = GroupCipher(key, JOB)
    sealed = group.seal("shares/0", "alpha", b"decrypted part")
    for position in (0, 20, len(sealed) - 1):
        with pytest.raises(ProtocolError, match="shares/0"):
            group.open("shares/0", "alpha", flip(sealed, position))
    with pytest.raises(ProtocolError):
        group.open("shares/1", "alpha", sealed)
    with pytest.raises(ProtocolError):
        group.open("shares/0", "bravo", sealed)
    with pytest.raises(ProtocolError):
        GroupCipher(key, "another-job").open("shares/0", "alpha", sealed)
    with pytest.raises(ProtocolError):
        GroupCipher(bytes(32), JOB).open("shares/0", "alpha", sealed)


def test_group_cipher_truncated_below_nonce_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        GroupCipher(bytes(32), JOB).open("t", "alpha", b"abc")


@pytest.mark.parametrize("length", [0, 16, 31, 33])
def test_group_cipher_key_length(length):
    with pytest.raises(ProtocolError, match="32 bytes"):
        GroupCipher(bytes(length), JOB)


# ---------------------------------------------------------------------------------------------------------------------
# Fields, round keys, PRG


def test_fields_round_trip_and_missing_field():
    data = encode_fields(blob=b"\x00\xffbytes", name="alpha", count=3)
    assert decode_fields(data, "blob", "name") == {"blob": b"\x00\xffbytes", "name": "alpha", "count": 3}
    assert json.loads(data)["blob"] == {"b64": base64.b64encode(b"\x00\xffbytes").decode()}
    with pytest.raises(ProtocolError, match="missing_one"):
        decode_fields(data, "blob", "missing_one")


def test_round_key_separates_labels_rounds_and_attempts():
    base = bytes(range(32))
    seen = {round_key(base, label, r, a) for label in (b"secagg-mask", b"pad") for r in (1, 2) for a in (0, 1)}
    assert len(seen) == 8
    assert round_key(base, b"pad", 1, 0) == round_key(base, b"pad", 1, 0)
    assert all(len(k) == 32 for k in seen)


@settings(max_examples=30, deadline=None)
@given(key=st.binary(min_size=32, max_size=32), nonce=st.integers(0, 2**32 - 1), count=st.integers(0, 5000))
def test_prg_words_deterministic_and_sized(key, nonce, count):
    words = prg_words(key, nonce, count)
    assert words.dtype == np.uint32 and words.shape == (count,)
    assert np.array_equal(words, prg_words(key, nonce, count))
    # a shorter stream is a prefix of a longer one
    assert np.array_equal(prg_words(key, nonce, count // 2), words[: count // 2])


def test_prg_words_differ_across_nonces_and_keys():
    key = bytes(range(32))
    streams = [prg_words(key, nonce, 1024) for nonce in range(5)]
    streams.append(prg_words(bytes(32), 0, 1024))
    for i, a in enumerate(streams):
        for b in streams[i + 1 :]:
            assert np.mean(a == b) < 0.01
    # looks uniform: mean of uint32 words near 2^31
    big = prg_words(key, 99, 100_000).astype(np.float64)
    assert abs(big.mean() / 2**31 - 1) < 0.02
