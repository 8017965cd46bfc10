"""plain and tee with narrower values on the wire: float16, bfloat16 and int8 halve or quarter the upload.

Real processes. A numpy linear model of 650,000 values on digits (tests/fixtures/models.py), two
parties, three rounds: the bytes each round sends against plain float32's, the accuracy against
float32's, and the report naming the wire format. tee seals the same narrow words; its enclave
widens them after opening (28 bytes of nonce and tag a slice are all it adds).
"""

from __future__ import annotations

import pytest

from tests.fixtures.keras_jobs import FIXTURES, keras_job, run

WIDTH = 10_000  # 64 x 10,000 + 10,000 values


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    runs = [("plain", wire) for wire in ("float32", "float16", "bfloat16", "int8")] + [
        ("tee", "bfloat16"),
        ("tee", "int8"),
    ]
    for mode, wire in runs:
        job = keras_job(
            job_id=f"wire-{mode}-{wire}",
            rounds=3,
            parties=["hospital-a", "hospital-b"],
            model={
                "algorithm": "custom",
                "entry": f"{FIXTURES}:federated_model",
                "options": {"width": WIDTH},
                "network": None,
            },
            protection={"mode": mode, "wire": wire},
        )
        out[mode, wire] = run(job, tmp_path_factory.mktemp(f"{mode}-{wire}"))
    return out


@pytest.mark.parametrize(
    ("mode", "wire", "share"),
    [
        ("plain", "float16", 0.5),
        ("plain", "bfloat16", 0.5),
        ("plain", "int8", 0.25),
        ("tee", "bfloat16", 0.5),
        ("tee", "int8", 0.25),
    ],
)
def test_a_narrow_wire_sends_its_share_of_the_bytes_and_keeps_the_accuracy(reports, mode, wire, share):
    report, full = reports[mode, wire], reports["plain", "float32"]
    assert report["mode"] == mode and report["protection"]["wire"] == wire
    assert full["protection"]["wire"] == "float32"
    for narrow, wide in zip(report["rounds"], full["rounds"], strict=True):
        assert narrow["bytes_sent"] / wide["bytes_sent"] == pytest.approx(share, abs=0.02)
        # The sum comes back as float32: the download does not shrink.
        assert narrow["bytes_received"] == pytest.approx(wide["bytes_received"], rel=0.02)
    assert full["final_accuracy"] > 0.8
    assert abs(report["final_accuracy"] - full["final_accuracy"]) <= 0.02
