"""Federated fine-tuning of a pretrained transformer with LoRA, in every protection mode (real processes, mTLS).

The base model is a tiny BERT the fixture pretrains (tests/fixtures/hf_models.py) and saves as a
party would hold it; every party loads it from its own folder. Only the adapter and the new head
travel; the base model's digest is compared before round 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from confide.errors import JobFailedError
from confide.protect import MODES
from confide.spec import parse_job
from tests.fixtures.federation import run_local
from tests.fixtures.hf_models import LENGTH, VOCABULARY, pretrained_base, skip_without_hf

skip_without_hf()

HF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_models.py"
#: Two parties: each party process spends about 8 s of CPU importing transformers and peft.
PARTIES = ["hospital-a", "hospital-b"]
#: What travels: LoRA (r 8) on query and value of 2 layers, and the 2-class head: 2 x 2 x 8 x (32 + 32) + 32 x 2 + 2.
ADAPTER_VALUES = 2 * 2 * 8 * (32 + 32) + 32 * 2 + 2


def hf_job(job_id: str, mode: str, pretrained, **model) -> dict:
    return {
        "job_id": job_id,
        "rounds": 2,
        "parties": PARTIES,
        "model": {
            "algorithm": "hf",
            "learning_rate": 0.005,
            "batch_size": 16,
            "hf": {"pretrained": pretrained},
            **model,
        },
        "data": {"dataset": "text", "samples": 800, "example_shape": [LENGTH], "classes": 2, "vocabulary": VOCABULARY},
        # threshold: the dealer deals the key shares (distributed key generation takes 10-50 s here, and
        # is the threshold tests' subject, not this file's).
        "protection": {"mode": mode, "share_timeout_s": 10.0, **({"keygen": "dealer"} if mode == "threshold" else {})},
        "transport": {"round_timeout_s": 120.0, "dropout_grace_s": 2.0},
        "metrics": ["loss", "accuracy"],
        "seed": 5,
    }


def own_code_job(job_id: str, mode: str, base: Path) -> dict:
    """The same job through model.entry: the party builds its peft model and trains it with a Trainer."""
    job = hf_job(job_id, mode, str(base))
    job["model"] = {
        "algorithm": "custom",
        "entry": f"{HF_FIXTURES}:federated_model",
        "options": {"pretrained": str(base)},
    }
    return job


def party_report(workdir, party: str) -> dict:
    return json.loads((Path(workdir) / "parties" / f"{party}.report.json").read_text())


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return pretrained_base(tmp_path_factory.mktemp("hf") / "tiny-bert")


@pytest.fixture(scope="module")
def reports(base, tmp_path_factory):
    out = {}
    for mode in MODES:
        workdir = tmp_path_factory.mktemp(f"hf-{mode}")
        # The plain run also trains the same model centrally on the pooled rows (the report's baseline).
        out[mode] = (
            run_local(
                parse_job(hf_job(f"hf-{mode}", mode, str(base))),
                workdir,
                progress=False,
                echo=lambda *_: None,
                baseline=mode == "plain",
            ),
            workdir,
        )
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_fine_tunes_to_the_central_accuracy_within_one_point(reports, mode):
    report, _ = reports[mode]
    central = reports["plain"][0]["centralized"]
    assert report["mode"] == mode and central["algorithm"] == "hf"
    assert report["final_accuracy"] >= 0.95
    assert abs(report["final_accuracy"] - central["pooled_accuracy"]) <= 0.01


@pytest.mark.parametrize("mode", list(MODES))
def test_only_the_adapter_travels(reports, mode):
    report, workdir = reports[mode]
    model = party_report(workdir, "hospital-a")["model"]
    assert model["algorithm"] == "hf" and model["adapter"] == "lora"
    assert model["parameters"] == ADAPTER_VALUES
    assert model["base_parameters"] > 15 * ADAPTER_VALUES
    digests = {party_report(workdir, p)["model"]["base_sha256"] for p in PARTIES}
    assert len(digests) == 1 and len(digests.pop()) == 64
    # A party's upload in a round is the adapter, encoded by the mode: far below the base model's bytes.
    full_bytes = 4 * model["base_parameters"]
    for entry in report["rounds"]:
        per_party = entry["bytes_sent"] / len(PARTIES)
        assert per_party < full_bytes, (mode, per_party, full_bytes)


def test_the_own_code_route_trains_with_a_trainer(base, tmp_path):
    job = own_code_job("hf-own", "secagg", base)
    report = run_local(parse_job(job), tmp_path, progress=False, echo=lambda *_: None)
    assert report["final_accuracy"] >= 0.95
    assert party_report(tmp_path, "hospital-b")["model"]["parameters"] == ADAPTER_VALUES


def test_a_party_with_another_base_model_is_named_before_round_one(base, tmp_path):
    from safetensors.numpy import load_file, save_file  # transformers' own dependency

    # The same checkpoint with one weight changed by 0.001, as a party's copy of it might be.
    other = tmp_path / "other-bert"
    shutil.copytree(base, other)
    weights = load_file(other / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].copy()
    weights[name].flat[0] += 1e-3
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    folders = {"hospital-a": str(base), "hospital-b": str(other)}
    with pytest.raises(
        JobFailedError,
        match=r"party 'hospital-(a|b)' has another base model than 'hospital-(a|b)'.*model.hf.pretrained",
    ):
        run_local(
            parse_job(hf_job("hf-other", "plain", folders)), tmp_path / "run", progress=False, echo=lambda *_: None
        )
    assert not any((tmp_path / "run" / "parties").glob("*/checkpoints/round-*"))


def test_an_adapter_of_another_shape_is_named(base, tmp_path):
    job = own_code_job("hf-rank", "plain", base)
    with pytest.raises(JobFailedError, match=r"has another model than .*lora_A"):
        run_local(
            parse_job(job),
            tmp_path,
            progress=False,
            echo=lambda *_: None,
            party_env={"hospital-b": {"CONFIDE_TEST_LORA_R": "4"}},
        )
