"""A party whose rows are partitioned Parquet, held in-process or by Ray actors, in a real job."""

from __future__ import annotations

import json

import pytest
import yaml

from confide.errors import JobFailedError
from confide.local import run_local
from confide.spec import parse_job
from tests.fixtures.partitions import write_partitions

PARTIES = ["hospital-a", "hospital-b"]


def _catalogs(tmp_path) -> dict[str, str]:
    out = {}
    for index, party in enumerate(PARTIES):
        root = write_partitions(tmp_path / party / "rows", [400, 250, 333][: 3 - index], seed=index)
        catalog = tmp_path / party / "catalog.yaml"
        catalog.write_text(
            yaml.safe_dump({"datasets": {"rows": {"source": "parquet", "path": str(root), "partitioned": True}}})
        )
        out[party] = str(catalog)
    return out


def _job(mode: str = "plain") -> dict:
    return {
        "job_id": f"partitioned-{mode}",
        "rounds": 3,
        "parties": PARTIES,
        "model": {"algorithm": "homo_lr", "learning_rate": 1.0, "local_epochs": 10, "batch_size": 0},
        "fl_data": {
            "label": "label",
            "participants": {p: {"dataset": "rows", "test_fraction": 0.2} for p in PARTIES},
            "pipeline": [
                {
                    "name": "site",
                    "op": "encode",
                    "params": {"columns": ["site"], "categories": {"site": ["north", "south"]}},
                }
            ],
        },
        "protection": {"mode": mode},
        "metrics": ["loss", "auc"],
    }


def _weights(workdir) -> dict[str, list[float]]:
    return {p: json.loads((workdir / "parties" / f"{p}.report.json").read_text())["weights"] for p in PARTIES}


def test_a_job_trains_on_partitions_held_inline(tmp_path):
    catalogs = _catalogs(tmp_path)
    report = run_local(parse_job(_job()), tmp_path / "inline", progress=False, echo=lambda *_: None, catalogs=catalogs)
    assert len(report["rounds"]) == 3 and report["final_auc"] > 0.9
    party = json.loads((tmp_path / "inline" / "parties" / "hospital-a.report.json").read_text())
    assert party["samples"] + party["test_samples"] == 983 and party["features"] == 7
    assert party["compute"] == {"engine": "inline"}
    weights = _weights(tmp_path / "inline")
    assert weights["hospital-a"] == weights["hospital-b"]
    mini = {**_job(), "job_id": "partitioned-minibatch"}
    mini["model"] = {**mini["model"], "batch_size": 32}
    with pytest.raises(JobFailedError, match="set model.batch_size: 0"):
        run_local(parse_job(mini), tmp_path / "mini", progress=False, echo=lambda *_: None, catalogs=catalogs)


def test_a_keras_network_trains_data_parallel_on_the_partitions(tmp_path):
    catalogs = _catalogs(tmp_path)
    job = {**_job(), "job_id": "partitioned-keras", "metrics": ["loss", "accuracy", "auc"]}
    job["model"] = {
        "algorithm": "keras",
        "learning_rate": 0.05,
        "batch_size": 32,
        "network": {
            "layers": [
                {"class_name": "Dense", "config": {"units": 8, "activation": "relu"}},
                {"class_name": "Dense", "config": {"units": 1, "activation": "sigmoid"}},
            ],
            "optimizer": {"class_name": "Adam"},
            "loss": "binary_crossentropy",
        },
    }
    report = run_local(parse_job(job), tmp_path / "keras", progress=False, echo=lambda *_: None, catalogs=catalogs)
    assert len(report["rounds"]) == 3 and report["final_auc"] > 0.9 and report["final_accuracy"] > 0.8
    weights = _weights(tmp_path / "keras")
    assert weights["hospital-a"] == weights["hospital-b"]


def test_a_party_on_ray_trains_the_same_model_as_inline(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'confide[ray]'; make test installs it)")
    catalogs = _catalogs(tmp_path)
    run = dict(progress=False, echo=lambda *_: None, catalogs=catalogs)
    run_local(parse_job(_job()), tmp_path / "inline", **run)
    report = run_local(parse_job(_job()), tmp_path / "ray", compute={"hospital-a": "ray"}, **run)
    assert len(report["rounds"]) == 3
    party = json.loads((tmp_path / "ray" / "parties" / "hospital-a.report.json").read_text())
    assert party["compute"]["engine"] == "ray" and party["compute"]["nodes"] == 1
    # The holders add their sums in the same order wherever they run: the same model, bit for bit.
    assert _weights(tmp_path / "ray") == _weights(tmp_path / "inline")
