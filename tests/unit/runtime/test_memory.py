"""The global vector a round holds: in memory for a small model, on disk for a large one."""

from __future__ import annotations

import numpy as np
import pytest

from confide.errors import InvalidParameterError
from confide.ml import WeightLayout
from confide.party import memory
from confide.party.memory import HeldVector, SpilledAggregate, byte_pieces, check_memory_limit, resident_bytes


def test_a_large_global_vector_waits_on_disk_and_comes_back_exactly(monkeypatch):
    monkeypatch.setattr(memory, "CHUNK", 1000)  # several chunks
    rng = np.random.default_rng(5)
    global_vector = rng.standard_normal(4321).astype(np.float32)
    local = global_vector + rng.standard_normal(4321).astype(np.float32)
    held = HeldVector(global_vector.copy(), spill=True)
    assert held.spilled
    delta = local.copy()
    held.subtract_from(delta)
    np.testing.assert_array_equal(delta, local - global_vector)
    np.testing.assert_array_equal(held.load(), global_vector)
    assert held.load().dtype == np.float32
    held.close()


def test_only_large_vectors_spill_and_fedprox_keeps_them():
    small = {"w": np.zeros(10, dtype=np.float32)}
    held = HeldVector.of_weights(WeightLayout.of(small), dict(small))
    assert not held.spilled
    np.testing.assert_array_equal(held.load(), small["w"])
    large = {"w": np.zeros(memory.SPILL_BYTES // 4, dtype=np.float32)}
    assert HeldVector.of_weights(WeightLayout.of(large), dict(large)).spilled
    assert not HeldVector.of_weights(WeightLayout.of(large), dict(large), keep=True).spilled


def test_a_large_models_weights_go_to_disk_a_tensor_at_a_time(monkeypatch):
    monkeypatch.setattr(memory, "SPILL_BYTES", 64)
    monkeypatch.setattr(memory, "CHUNK", 7)
    rng = np.random.default_rng(3)
    weights = {
        "dense/kernel": rng.standard_normal((5, 4)).astype(np.float32),
        "dense/bias": rng.standard_normal(4).astype(np.float32),
        "out/kernel": rng.standard_normal((4, 3)).astype(np.float32),
    }
    layout = WeightLayout.of(weights)
    expected = layout.flatten(weights)
    given = dict(weights)
    held = HeldVector.of_weights(layout, given)
    assert held.spilled and given == {}  # each tensor taken out once written
    np.testing.assert_array_equal(held.load(), expected)
    local = expected + 1.5
    held.subtract_from(local)
    np.testing.assert_allclose(local, np.full(layout.size, 1.5, dtype=np.float32))
    with pytest.raises(InvalidParameterError, match="differ in names"):
        HeldVector.of_weights(layout, {"dense/kernel": weights["dense/kernel"]})


def test_a_model_whose_rounds_would_pass_the_memory_limit_is_refused_with_the_numbers():
    check_memory_limit("hospital-a", 25_000_000, 100 * 2**20, limit_mb=1024, resident=500 * 2**20)  # 800 MiB: fits
    with pytest.raises(
        InvalidParameterError,
        match=r"party 'hospital-a': the model's 25,000,000 values \(100 MiB\) need about 1,100 MiB here \(this "
        r"process holds 800 MiB with the model built, and a round adds up to 3x the model's bytes\), past "
        r"model.memory_limit_mb 1024",
    ):
        check_memory_limit("hospital-a", 25_000_000, 100 * 2**20, limit_mb=1024, resident=800 * 2**20)
    assert resident_bytes() > 0


def test_a_spilled_aggregate_takes_what_a_mode_does_with_its_output(monkeypatch):
    monkeypatch.setattr(memory, "CHUNK", 700)
    rng = np.random.default_rng(9)
    expected = rng.standard_normal(2500).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, 2500)
    aggregate = SpilledAggregate(2500, "float32")
    for start in range(0, 2500, 1000):  # slices, as finish_round assigns them
        aggregate[start : start + 1000] = expected[start : start + 1000]
    aggregate *= scale  # paillier's per-value scale
    aggregate *= 0.5  # a rescale after exclusions
    expected = (expected * scale).astype(np.float32) * np.float32(0.5)
    np.testing.assert_allclose(aggregate.load(), expected, rtol=1e-6)
    global_vector = np.ones(2500, dtype=np.float32)
    aggregate.add_into(global_vector)
    np.testing.assert_allclose(global_vector, 1 + expected, rtol=1e-6)
    with pytest.raises(ValueError, match="3 values for positions 0:4"):
        aggregate[0:4] = [1, 2, 3]
    aggregate.close()


@pytest.mark.parametrize("size", [1, 12, 13, 50, 400])
def test_weights_are_cut_into_pieces_of_the_flat_vectors_bytes(size):
    rng = np.random.default_rng(4)
    weights = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": rng.standard_normal(7),  # float64: sent in the layout's dtype
        "c": np.asfortranarray(rng.standard_normal((4, 2)).astype(np.float32)),
    }
    layout = WeightLayout.of(weights)
    pieces = list(byte_pieces(layout, weights, size))
    assert all(len(piece) == size for piece in pieces[:-1]) and 0 < len(pieces[-1]) <= size
    assert b"".join(pieces) == layout.flatten(weights).tobytes()


def test_an_empty_model_is_one_empty_piece():
    layout = WeightLayout.of({"w": np.zeros(0, dtype=np.float32)})
    assert list(byte_pieces(layout, {"w": np.zeros(0, dtype=np.float32)}, 16)) == [b""]
