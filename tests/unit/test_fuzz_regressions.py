"""Every input the fuzzers (fuzz/) found that crashed a decoder, replayed against the fixed decoder.

Each file under ``fuzz/regressions/<target>/`` is a reproducer libFuzzer wrote; the harness of
that target must now end with the decoder's documented error (or a result). The constructed cases
below pin down each fix with the smallest input that broke it, and the error class it now gives.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from confide import checkpoints
from confide.errors import (
    CertificateError,
    InvalidParameterError,
    JobFailedError,
    ProtocolError,
)
from confide.ml.strategies import make_strategy
from confide.protect import threshold
from confide.protect.base import pack_parts, unpack_parts
from confide.protect.keys import decode_fields, encode_fields
from confide.vertical import wire

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
sys.path.insert(0, str(FUZZ / "python"))

import _common  # noqa: E402
import party_checkpoint  # noqa: E402
import push_stream  # noqa: E402

REPRODUCERS = sorted(p for p in (FUZZ / "regressions").glob("*/*") if p.is_file())


def harness(target: str):
    return __import__(target)


def test_every_target_with_a_reproducer_exists():
    targets = {p.parent.name for p in REPRODUCERS}
    assert targets, "no reproducers found under fuzz/regressions/"
    for target in targets:
        assert (FUZZ / "python" / f"{target}.py").is_file(), target


@pytest.mark.parametrize("path", REPRODUCERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reproducer_ends_in_a_documented_error(path):
    module = harness(path.parent.name)
    data = path.read_bytes()
    try:
        module.fuzz_one(data)
    except module.ALLOWED:
        pass  # the documented outcome; anything else propagates and fails the test


# -- constructed cases, one per fix -----------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"\x01", struct.pack("<I", 1), struct.pack("<III", 1, 0, 3) + b"\x00" * 8],
    ids=["empty", "short-count", "missing-part", "values-overrun"],
)
def test_unpack_parts_truncated_is_a_protocol_error(data):
    with pytest.raises(ProtocolError, match="decrypted-share message"):
        unpack_parts(data)


def test_unpack_parts_still_round_trips():
    parts = {2: np.arange(3, dtype="<f4")}
    assert {k: v.tolist() for k, v in unpack_parts(pack_parts(parts)).items()} == {2: [0.0, 1.0, 2.0]}
    with pytest.raises(ProtocolError, match="trailing"):
        unpack_parts(pack_parts(parts) + b"\x00")


def _wire(header) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return b"CVW1" + struct.pack(">I", len(text)) + text


@pytest.mark.parametrize(
    "data",
    [
        _wire(b"[" * 100_000 + b"]" * 100_000),
        _wire({"x": {"$a": [0, 0], "dtype": "<f8", "shape": [2**32, 2**32]}}),
        _wire({"x": {"$a": [0, 0], "dtype": "<f8", "shape": [2**70]}}),
        _wire({"x": {"$a": [0, 0], "dtype": ["<f8"], "shape": [0]}}),
    ],
    ids=["deep-json", "shape-product-wraps-int64", "shape-beyond-int64", "dtype-a-list"],
)
def test_vertical_wire_hostile_headers_are_protocol_errors(data):
    with pytest.raises(ProtocolError, match="message"):
        wire.decode(data)


def test_vertical_wire_empty_array_still_decodes():
    decoded = wire.decode(wire.encode({"x": np.zeros((0, 3), dtype="<f8")}))
    assert decoded["x"].shape == (0, 3)


def test_decode_fields_deep_json_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="fields encoding"):
        decode_fields(b"[" * 100_000)


def test_partial_decryption_blobs_need_ascii_digit_names():
    # "²".isdigit() is True but int("²") raises ValueError.
    with pytest.raises(ProtocolError, match="slice indices"):
        threshold._unpack_blobs(json.dumps({"\u00b2": {"b64": "AA=="}}).encode())
    assert threshold._unpack_blobs(encode_fields(**{"7": b"\x01"})) == {7: b"\x01"}


@pytest.mark.parametrize(
    "fields",
    [{"public": "text", "share": b"\x01"}, {"public": b"\x00" * 8, "share": 5}],
    ids=["public-a-string", "share-an-int"],
)
def test_dealt_threshold_key_fields_must_be_bytes(fields):
    with pytest.raises(ProtocolError, match="must be bytes"):
        threshold._dealt_key(encode_fields(**fields), 2)


@pytest.mark.parametrize("leaves", [5, None, 2.5, True])
def test_checkpoint_leaves_that_are_not_a_list_are_invalid(leaves):
    with pytest.raises(InvalidParameterError, match="must be a list of leaf dicts"):
        checkpoints.compare(leaves, [])
    with pytest.raises(InvalidParameterError, match="must be a list of leaf dicts"):
        checkpoints.root_of({"a": leaves})


def test_fedadam_state_without_its_moments_is_invalid():
    strategy = make_strategy("fedadam")
    with pytest.raises(InvalidParameterError, match="exactly m and v"):
        strategy.load_state({"m": np.zeros(3)})
    with pytest.raises(InvalidParameterError, match="one shape"):
        strategy.load_state({"m": np.zeros(3), "v": np.zeros(4)})
    strategy.load_state({"m": np.zeros(3), "v": np.ones(3)})
    assert strategy.state()["v"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "files",
    [
        [b"[]"],
        [json.dumps({"round": 3, "format": 2}).encode(), b"PK\x05\x06" + b"\x00" * 18, b"", b""],
        [json.dumps({"round": 3, "format": 2}).encode(), b"not a zip", b"", b""],
        [b"[" * 100_000],
    ],
    ids=["state-a-list", "empty-zip", "not-a-zip", "deep-json"],
)
def test_damaged_party_checkpoint_is_a_job_failed_error(files):
    with pytest.raises(JobFailedError, match="cannot resume"):
        party_checkpoint.fuzz_one(_common.framed(*files))


def test_checkpoint_with_bad_strategy_state_is_a_job_failed_error(tmp_path):
    from confide.party import checkpointing

    model, layout = party_checkpoint.model_and_layout()
    good = make_strategy("fedadam")
    checkpointing.write_checkpoint(tmp_path, 3, model, layout, good, ["a"])
    target = tmp_path / checkpoints.round_name(3)
    (target / "strategy.npz").write_bytes(checkpointing.npz_bytes({"m": np.zeros(5)}))
    with pytest.raises(JobFailedError, match="fedadam state"):
        checkpointing.load_checkpoint(tmp_path, 3, model, layout, make_strategy("fedadam"))


def test_push_stream_that_is_not_protobuf_ends_with_invalid_argument():
    core = push_stream._fresh_core()
    context = push_stream.FakeContext("a")
    servicer = push_stream.AggregationServicer(core, "aggregator")
    with pytest.raises(push_stream.Aborted):
        servicer.PushSlices(iter([b"\xff\xff\xff"]), context)
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    core.close()


@pytest.mark.parametrize("name", ["certificate-bad-issuer", "certificate-bad-version"])
def test_malformed_announcement_certificates_are_certificate_errors(name):
    import sealed_messages

    data = (FUZZ / "regressions" / "sealed_messages" / name).read_bytes()
    with pytest.raises(CertificateError):
        sealed_messages.fuzz_one(data)


@pytest.mark.parametrize(
    ("name", "match"),
    [("manifest-not-an-object", "not an object"), ("unknown-zip-compression", "compression method is not supported")],
)
def test_damaged_model_artifacts_are_invalid_parameter_errors(name, match):
    import model_artifact

    data = (FUZZ / "regressions" / "model_artifact" / name).read_bytes()
    with pytest.raises(InvalidParameterError, match=match):
        model_artifact.fuzz_one(data)


def test_homo_lr_load_of_a_plain_npy_is_invalid(tmp_path):
    from confide.ml.homo_lr import HomoLR

    path = tmp_path / "model.npz"
    with path.open("wb") as handle:
        np.save(handle, np.arange(3.0))
    with pytest.raises(InvalidParameterError, match="not a saved HomoLR model"):
        HomoLR.load(path)


def test_damaged_stored_round_is_a_wire_format_error(tmp_path):
    from confide.aggregator.store import ResultStore
    from confide.errors import WireFormatError
    from confide.v1 import runtime_pb2 as pb

    store = ResultStore(tmp_path)
    store.save(pb.RoundHeader(job_id="j", round=1, participants=["a"]), {0: b"\x00" * 8})
    path = tmp_path / "j" / "round-1-0.bin"
    whole = path.read_bytes()
    assert ResultStore(tmp_path).load()[0][1] == {0: b"\x00" * 8}
    for damaged in (whole[:5], whole[:-1], whole + b"\x00"):
        path.write_bytes(damaged)
        with pytest.raises(WireFormatError, match="round-1-0.bin is damaged"):
            ResultStore(tmp_path).load()
    path.unlink()
    (tmp_path / "j" / "encryption_key.bin").write_bytes(b"\x02\x00\xff\xfe")
    with pytest.raises(WireFormatError, match="encryption_key.bin is damaged"):
        ResultStore(tmp_path).load_keys()
