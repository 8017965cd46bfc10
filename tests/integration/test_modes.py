"""Every protection mode trains Homo LR across separate processes over gRPC + mTLS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from confide.spec import VERIFIED_MODES
from tests.fixtures.federation import run_local
from tests.integration.conftest import make_spec

MODES = ["plain", "secagg", "paillier", "groupmask", "tee", "threshold", "lattice"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for mode in MODES:
        spec = make_spec(job_id=f"modes-{mode}", protection={"mode": mode})
        out[mode] = run_local(spec, tmp_path_factory.mktemp(mode), progress=False, echo=lambda *_: None)
    return out


@pytest.mark.parametrize("mode", MODES)
def test_mode_trains_and_reports_what_ran(reports, mode):
    report = reports[mode]
    assert report["mode"] == mode
    assert len(report["rounds"]) == 15
    assert all(r["participants"] == ["hospital-a", "hospital-b", "hospital-c"] for r in report["rounds"])
    assert report["rounds"][-1]["loss"] < report["rounds"][0]["loss"]
    assert report["final_auc"] > 0.98
    assert report["aggregator_saw"]
    # Every party checked every sum where the mode allows it; elsewhere the report says the sums were trusted.
    verification = report["protection"]["verification"]
    assert verification["ran"] is (mode in VERIFIED_MODES), verification
    if verification["ran"]:
        assert all(r["verify_s"] > 0 and not r["refused"] for r in report["rounds"])
    else:
        assert "trusted" in verification["reason"]
    stored = json.loads(Path(report["files"]["json"]).read_text())
    assert stored["mode"] == mode
    assert Path(report["files"]["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("mode", ["paillier", "threshold"])
def test_paillier_modes_name_the_crypto_engine(reports, mode):
    protection = reports[mode]["protection"]
    assert protection["crypto_engine"].startswith(("cpu:", "gpu:"))
    assert protection["crypto_engine_reason"]
    assert protection["cpu_batches"] + protection["gpu_batches"] > 0


@pytest.mark.parametrize("mode", ["secagg", "paillier", "groupmask", "tee", "threshold", "lattice"])
def test_protected_modes_match_plain_auc(reports, mode):
    assert abs(reports[mode]["final_auc"] - reports["plain"]["final_auc"]) <= 0.005


def test_paillier_report_states_protection(reports):
    protection = reports["paillier"]["protection"]
    assert protection["key_bits"] == 2048
    assert protection["quantization_bits"] == 16
    assert protection["last_alpha"] > 0
    assert "nothing" in reports["paillier"]["aggregator_saw"]
    assert "sum" in reports["secagg"]["aggregator_saw"]
    assert "every" in reports["plain"]["aggregator_saw"]


def test_threshold_key_was_generated_by_the_parties(reports):
    # Distributed key generation at 2048 bits between the three party processes, over the relay.
    protection = reports["threshold"]["protection"]
    assert protection["keygen"] == "distributed"
    assert protection["threshold"] == 2 and protection["parties"] == 3
    assert protection["keygen_seconds"] > 0
    assert "nobody" in protection["secret_key_holders"]
    assert "shares" in reports["threshold"]["aggregator_saw"]


def test_lattice_sums_what_secagg_sums_and_says_what_ran(reports):
    # The same fixed point, narrowed to what two lanes a coefficient leave: lanes of 24 + 2 bits (3
    # parties never carry), the scale 2^(61 - 52) four times the summed error (3 * 21 * 4 < 2^9).
    protection = reports["lattice"]["protection"]
    assert protection["message_bits"] == 24 and protection["threshold"] == 2 and protection["parties"] == 3
    assert (protection["lanes"], protection["lane_bits"], protection["scale_bits"]) == (2, 26, 9)
    assert protection["ring"].startswith("Z_q[X]/(X^4096 + 1)") and "eta 21" in protection["error"]
    assert "nothing" in reports["lattice"]["aggregator_saw"]
    # Four bytes a value like secagg; the key shares add a fixed 8 KiB per share, not per value.
    lattice = [r["loss"] for r in reports["lattice"]["rounds"]]
    masked = [r["loss"] for r in reports["secagg"]["rounds"]]
    assert lattice == pytest.approx(masked, abs=1e-3)


def test_label_skew_split_trains(tmp_path):
    spec = make_spec(job_id="skew", data={"split": "label_skew"}, protection={"mode": "groupmask"})
    report = run_local(spec, tmp_path, progress=False, echo=lambda *_: None)
    assert report["mode"] == "groupmask"
    assert report["final_auc"] > 0.95


def test_tee_report_says_the_enclave_was_simulated(reports):
    protection = reports["tee"]["protection"]
    assert protection["enclave_simulated"] is True
    assert protection["enclave"]["mode"] == "simulation"
    assert protection["enclave"]["hardware_isolation"] is False
    assert "SIMULATION" in protection["note"]
    assert "simulated" in reports["tee"]["aggregator_saw"]
