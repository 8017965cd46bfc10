"""The float modes' wire formats, party side: bfloat16 rounding, int8 scale and error, float16's range
refused; plain and tee pick their aggregation kinds from the wire."""

from __future__ import annotations

import numpy as np
import pytest

from confide.aggregator.rounds import NATIVE_KIND, is_tee
from confide.errors import InvalidParameterError
from confide.protect import ProtectionParams
from confide.protect.base import RoundContext
from confide.protect.plain import WIRE_KINDS, Plain, to_bfloat16
from confide.protect.tee import TEE_WIRE_KINDS, open_slice, seal_slice
from confide.v1 import runtime_pb2 as pb


def encode(wire: str, values) -> bytes:
    context = RoundContext(round=1, attempt=0, participants=["a", "b"], party_id="a", vector_length=4, slice_length=4)
    return Plain(None, ProtectionParams(wire=wire)).encode(context, 0, np.asarray(values, dtype=np.float32))


def test_bfloat16_rounds_to_nearest_even():
    values = np.array([1.0, -2.0, 1.00390625, 1.01171875, 3.0e38, 1.0e-30], dtype=np.float32)
    words = to_bfloat16(values)
    assert words[0] == 0x3F80 and words[1] == 0xC000
    assert words[2] == 0x3F80  # halfway between 0x3F80 and 0x3F81: to the even one
    assert words[3] == 0x3F82  # halfway between 0x3F81 and 0x3F82: to the even one
    back = (words.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(back, values, rtol=2**-8)


def test_int8_carries_a_scale_and_errs_by_at_most_half_a_step():
    values = np.random.default_rng(3).normal(0, 0.05, 1000).astype(np.float32)
    payload = encode("int8", values)
    assert len(payload) == 4 + values.size
    scale = np.frombuffer(payload[:4], "<f4")[0]
    back = np.frombuffer(payload[4:], np.int8) * scale
    assert scale == pytest.approx(np.abs(values).max() / 127)
    assert np.abs(back - values).max() <= scale / 2 + 1e-9
    assert encode("int8", np.zeros(4)) == b"\0" * 8


def test_float16_refuses_what_it_cannot_hold_and_names_the_field():
    assert len(encode("float16", [1.0, 2.0, -3.0, 4.0])) == 8
    with pytest.raises(
        InvalidParameterError, match=r"protection.wire float16: round 1 holds a value of magnitude 70000"
    ):
        encode("float16", [1.0, 7e4, 0.0, 0.0])


def test_the_wire_picks_the_aggregation_kind_and_an_unknown_one_is_refused():
    assert Plain(None, ProtectionParams(wire="bfloat16")).kind == pb.AGGREGATION_KIND_BFLOAT16_SUM
    assert Plain(None, ProtectionParams()).kind == pb.AGGREGATION_KIND_FLOAT32_SUM
    assert Plain(None, ProtectionParams(wire="int8")).report()["wire"] == "int8"
    with pytest.raises(InvalidParameterError, match="protection.wire must be one of"):
        Plain(None, ProtectionParams(wire="float8"))


def test_tee_has_a_sealed_kind_for_every_wire_and_seals_the_narrow_bytes():
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    assert TEE_WIRE_KINDS.keys() == WIRE_KINDS.keys()
    for wire, kind in TEE_WIRE_KINDS.items():
        assert is_tee(kind) and not is_tee(WIRE_KINDS[wire])
        assert NATIVE_KIND[kind] == "tee_" + NATIVE_KIND[WIRE_KINDS[wire]]
    key = AESGCM(bytes(32))
    narrow = encode("bfloat16", [1.0, 2.0, 3.0, 4.0])
    sealed = seal_slice(key, b"aad", narrow)
    assert len(sealed) == 12 + len(narrow) + 16
    assert key.decrypt(sealed[:12], sealed[12:], b"aad") == narrow
    np.testing.assert_array_equal(open_slice(key, b"aad", seal_slice(key, b"aad", np.ones(3))), np.ones(3, np.float32))
