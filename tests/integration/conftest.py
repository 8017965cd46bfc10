"""Helpers for integration tests: real processes (or in-process servers) on loopback with mTLS."""

from __future__ import annotations

import copy

import pytest

from confide.spec import JobSpec, parse_job

BASE = {
    "job_id": "itest",
    "rounds": 15,
    "parties": ["hospital-a", "hospital-b", "hospital-c"],
    "model": {"algorithm": "homo_lr", "learning_rate": 0.5, "local_epochs": 2, "batch_size": 32},
    "data": {"dataset": "breast_cancer", "split": "iid", "seed": 7},
    "protection": {"mode": "plain", "key_bits": 2048, "bits": 16, "share_timeout_s": 3.0},
    "transport": {"round_timeout_s": 20.0, "dropout_grace_s": 1.0, "reconnect_timeout_s": 30.0},
    "seed": 7,
}


def make_spec(**overrides) -> JobSpec:
    """BASE with nested overrides: make_spec(protection={"mode": "secagg"}, rounds=5)."""
    data = copy.deepcopy(BASE)
    for key, value in overrides.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return parse_job(data)


@pytest.fixture
def spec_factory():
    return make_spec
