"""The native data plane from Python: weighted means, duplicates, checkpoints, spills, tee."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from confide import _native
from confide.protect.tee import RESULT_POSITION, open_slice, seal_slice, slice_aad, wrap_session_key

M, SLICES, L = 5, 12, 1000
rng = np.random.default_rng(11)
UPDATES = rng.standard_normal((M, SLICES * L)).astype(np.float32)
WEIGHTS = [1.0, 2.5, 0.5, 3.0, 1.0]


def reference() -> np.ndarray:
    w = np.asarray(WEIGHTS, dtype=np.float64)
    return (w[:, None] * UPDATES.astype(np.float64)).sum(0) / w.sum()


def pack(indices, payloads, n_valid=L):
    return (
        np.asarray(indices, dtype="<u4").tobytes(),
        np.full(len(indices), n_valid, dtype="<u4").tobytes(),
        np.asarray([len(p) for p in payloads], dtype="<u4").tobytes(),
        b"".join(payloads),
    )


def push(plane, rid, p, indices, payload_of):
    return plane.push(rid, p, *pack(indices, [payload_of(p, i) for i in indices]))


def plain_payload(p, i):
    return UPDATES[p, i * L : (i + 1) * L].tobytes()


def open_mean(plane, rid=1, **extra):
    plane.open_round(rid, "job-1", "f32_mean", M, SLICES, L, SLICES * L, WEIGHTS, None, 1, 0, **extra)


def assert_close(got: dict[int, bytes]):
    out = np.concatenate([np.frombuffer(got[i], dtype="<f4") for i in range(SLICES)])
    ref = reference()
    scale = (np.abs(UPDATES) * np.asarray(WEIGHTS)[:, None]).sum(0) / sum(WEIGHTS)
    assert np.all(np.abs(out - ref) <= 4 * np.finfo(np.float32).eps * scale + 1e-30)


def test_any_order_and_duplicates_give_the_weighted_mean():
    plane = _native.DataPlane(2, 64 << 20)
    open_mean(plane)
    work = [(p, i) for p in range(M) for i in range(SLICES)]
    order = rng.permutation(len(work))
    got, accepted, repeated = {}, 0, 0
    for chunk in np.array_split(order, 9):
        by_party: dict[int, list[int]] = {}
        for k in chunk:
            p, i = work[k]
            by_party.setdefault(p, []).append(i)
        for p, indices in by_party.items():
            took, dup, late, completed = push(plane, 1, p, indices + indices[:1], plain_payload)
            accepted += took
            repeated += dup + late
            got.update(dict(completed))
    assert accepted == M * SLICES
    assert repeated >= 9  # one repeated slice per (chunk, party) push
    assert sorted(got) == list(range(SLICES))
    assert_close(got)
    stats = plane.stats()
    assert stats["staged_bytes"] == 0 and stats["peak_staged_bytes"] > 0


def test_late_copy_after_completion_is_not_folded_again():
    plane = _native.DataPlane(1, 64 << 20)
    open_mean(plane)
    got = {}
    for p in range(M):
        got.update(dict(push(plane, 1, p, list(range(SLICES)), plain_payload)[3]))
    took, dup, late, completed = push(plane, 1, 0, [3], plain_payload)
    assert (took, late, completed) == (0, 1, [])
    assert_close(got)


def test_missing_participant_checkpointed_then_restored():
    plane = _native.DataPlane(2, 64 << 20)
    open_mean(plane)
    for p in range(M - 1):
        assert push(plane, 1, p, list(range(SLICES)), plain_payload)[3] == []
    missing = dict(plane.missing(1))
    assert sorted(missing) == list(range(SLICES)) and all(v == [M - 1] for v in missing.values())
    blob = plane.checkpoint_round(1)
    assert plane.stats()["staged_bytes"] == 0
    plane.restore_round(1, blob)
    got = dict(push(plane, 1, M - 1, list(range(SLICES)), plain_payload)[3])
    assert_close(got)


def test_tiny_staged_cap_spills_and_stays_exact(tmp_path):
    plane = _native.DataPlane(1, 3 * L * 4, str(tmp_path))
    open_mean(plane)
    got = {}
    for p in range(M):
        got.update(dict(push(plane, 1, p, list(range(SLICES)), plain_payload)[3]))
    assert_close(got)
    stats = plane.stats()
    assert stats["spills"] > 0
    assert stats["peak_staged_bytes"] <= 4 * L * 4


def test_bad_slices_are_refused_with_the_field_named():
    plane = _native.DataPlane(1, 64 << 20)
    open_mean(plane)
    with pytest.raises(ValueError, match="slice 2"):
        plane.push(1, 0, *pack([2], [b"\0" * 12]))
    nan = np.full(L, np.nan, dtype="<f4").tobytes()
    with pytest.raises(ValueError, match="finite|non-finite"):
        plane.push(1, 0, *pack([1], [nan]))
    with pytest.raises(ValueError, match="index|num_slices"):
        plane.push(1, 0, *pack([SLICES], [plain_payload(0, 0)]))
    with pytest.raises(ValueError, match="participant"):
        plane.push(1, M, *pack([0], [plain_payload(0, 0)]))
    # Nothing stored was lost: a clean run still completes.
    got = {}
    for p in range(M):
        got.update(dict(push(plane, 1, p, list(range(SLICES)), plain_payload)[3]))
    assert_close(got)


def test_u32_sums_wrap_exactly():
    plane = _native.DataPlane(2, 64 << 20)
    plane.open_round(5, "job-2", "u32_sum", 3, 2, 8, 16, None, None, 1, 0)
    words = rng.integers(0, 2**32, size=(3, 16), dtype=np.uint64).astype(np.uint32)
    got = {}
    for p in range(3):
        got.update(
            dict(plane.push(5, p, *pack([0, 1], [words[p, :8].tobytes(), words[p, 8:].tobytes()], n_valid=8))[3])
        )
    total = np.concatenate([np.frombuffer(got[0], "<u4"), np.frombuffer(got[1], "<u4")])
    assert np.array_equal(total, (words.astype(np.uint64).sum(0) % 2**32).astype(np.uint32))


def test_tee_slices_are_opened_folded_and_resealed_by_the_enclave():
    enclave = _native.SimulatedEnclave(2)
    report = enclave.report()
    assert report["mode"] == "simulation" and report["hardware_isolation"] is False
    assert "no SGX" in report["note"]
    json.dumps(report)
    session_key = os.urandom(32)
    enclave.provision("job-t", wrap_session_key(session_key, enclave.public_key(), "job-t"))
    plane = _native.DataPlane(2, 64 << 20, None, enclave)
    plane.open_round(9, "job-t", "tee_f32_mean", M, SLICES, L, SLICES * L, WEIGHTS, None, 3, 1)
    aead = AESGCM(session_key)

    def sealed(p, i):
        return seal_slice(aead, slice_aad("job-t", 3, 1, p, i), UPDATES[p, i * L : (i + 1) * L])

    got = {}
    for p in reversed(range(M)):
        got.update(dict(push(plane, 9, p, list(range(SLICES)), sealed)[3]))
    opened = {
        i: open_slice(aead, slice_aad("job-t", 3, 1, RESULT_POSITION, i), blob).tobytes() for i, blob in got.items()
    }
    assert_close(opened)
    # The aggregator's output is ciphertext, not the mean in the clear.
    assert all(got[i] != opened[i] for i in got)


def test_tee_refuses_tampered_and_replayed_slices():
    enclave = _native.SimulatedEnclave(1)
    key = os.urandom(32)
    enclave.provision("job-u", wrap_session_key(key, enclave.public_key(), "job-u"))
    plane = _native.DataPlane(1, 64 << 20, None, enclave)
    plane.open_round(2, "job-u", "tee_f32_sum", 2, 1, L, L, None, None, 1, 0)
    aead = AESGCM(key)
    good = seal_slice(aead, slice_aad("job-u", 1, 0, 0, 0), UPDATES[0, :L])
    tampered = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(ValueError, match="authentication"):
        plane.push(2, 0, *pack([0], [tampered]))
    with pytest.raises(ValueError, match="authentication"):
        plane.push(2, 1, *pack([0], [good]))  # party 0's slice replayed as party 1's
    assert plane.push(2, 0, *pack([0], [good]))[0] == 1


def test_tee_key_wrapped_to_another_enclave_is_refused():
    ours, other = _native.SimulatedEnclave(1), _native.SimulatedEnclave(1)
    wrapped = wrap_session_key(os.urandom(32), other.public_key(), "job-v")
    with pytest.raises(ValueError):
        ours.provision("job-v", wrapped)
    with pytest.raises(ValueError):
        ours.provision("job-w", wrapped)  # bound to its session too


def test_a_data_port_that_cannot_listen_raises_a_confide_error_that_is_an_oserror():
    import socket

    from confide.errors import InvalidParameterError, ServerStartError, TransportError

    class Control:
        observing = False

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ServerStartError, match=f"cannot listen on {address}") as caught:
            _native.DataServer(_native.DataPlane(1), Control(), address, b"cert", b"key", b"ca")
    assert isinstance(caught.value, OSError) and isinstance(caught.value, TransportError)
    with pytest.raises(InvalidParameterError, match="workers: must be at most"):
        _native.DataPlane(10**6)
