"""Every protection mode trains the same Keras CNN on digits to the plain accuracy (real processes, mTLS).

Apart from tests/integration/test_models.py so that ``make test`` can run this file's shared six
jobs on one core while the other core runs the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.keras_jobs import keras_job, party_report, run, skip_without_frameworks

skip_without_frameworks()

MODES = ["plain", "secagg", "paillier", "groupmask", "tee", "lattice"]
#: Two parties: what is compared is each mode's aggregate against plain's, which does not depend on
#: how many send it; a third Keras party cost each job about 9 s of CPU (import, build, train).
PARTIES = ["hospital-a", "hospital-b"]


@pytest.fixture(scope="module")
def digits_reports(tmp_path_factory):
    return {
        mode: run(
            keras_job(job_id=f"nn-{mode}", parties=PARTIES, protection={"mode": mode}), tmp_path_factory.mktemp(mode)
        )
        for mode in MODES
    }


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_trains_the_cnn_to_the_plain_accuracy_within_one_point(digits_reports, mode):
    report = digits_reports[mode]
    assert report["mode"] == mode
    assert report["model"]["algorithm"] == "keras" and report["model"]["layers"] == 2
    assert report["final_accuracy"] > 0.9
    assert abs(report["final_accuracy"] - digits_reports["plain"]["final_accuracy"]) <= 0.01
    assert report["rounds"][-1]["loss"] < report["rounds"][0]["loss"]


def test_paillier_clips_each_layer_with_its_own_threshold(digits_reports, tmp_path):
    entry = party_report(Path(digits_reports["paillier"]["files"]["json"]).parent, "hospital-a")["rounds"][-1]
    alphas = entry["stats"]["layer_alphas"]
    assert len(alphas) == 2 and alphas[0] != alphas[1]
    assert entry["stats"]["alpha"] == max(alphas)
