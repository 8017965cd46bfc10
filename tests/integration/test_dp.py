"""Differential privacy between separate processes: the job report states the epsilon the accountant gives.

Distributed noise runs under paillier (24-bit codes, adaptive clipping, a loose budget: with 3
parties the clip count is mostly noise), secagg and lattice; DP-SGD under groupmask. Breast cancer over 3
hospitals, 15 rounds; then DP-SGD in a PyTorch model (Opacus) and a Keras network on JAX.
"""

from __future__ import annotations

import json

import dp_accounting
import pytest
from dp_accounting import rdp

from tests.fixtures.federation import run_local
from tests.integration.conftest import make_spec

CASES = {
    "paillier-distributed": (
        {"mode": "paillier", "bits": 24},
        {"mechanism": "distributed", "epsilon": 50, "adaptive_clipping": True, "clip_norm": 0.5},
    ),
    "secagg-distributed": ({"mode": "secagg", "mask_bound": 64}, {"mechanism": "distributed", "epsilon": 20}),
    # lattice: the noise on the mode's narrower grid (24-bit messages for 3 parties), summed exactly.
    "lattice-distributed": ({"mode": "lattice", "mask_bound": 64}, {"mechanism": "distributed", "epsilon": 20}),
    "groupmask-dp-sgd": ({"mode": "groupmask"}, {"mechanism": "dp_sgd", "epsilon": 3}),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for name, (protection, privacy) in CASES.items():
        spec = make_spec(job_id=f"dp-{name}", protection=protection, privacy=privacy)
        workdir = tmp_path_factory.mktemp(name)
        out[name] = run_local(spec, workdir, progress=False, echo=lambda *_: None)
        out[name]["test_workdir"] = workdir
    return out


def _rdp(event, delta):
    accountant = rdp.RdpAccountant()
    accountant.compose(event)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("name", list(CASES))
def test_the_job_trains_within_its_budget_and_says_so(reports, name):
    report = reports[name]
    privacy = report["protection"]["privacy"]
    assert len(report["rounds"]) == 15
    assert privacy["rounds_accounted"] == 15
    assert 0 < privacy["epsilon_spent"] <= privacy["epsilon_budget"]
    assert privacy["delta"] == 1e-5
    assert "dp-accounting" in privacy["accountant"]
    # Party-level DP over 3 parties is noisy (docs/benchmarks.md has the spread); these bounds hold
    # with a wide margin in repeated runs, they check that the model learns, not how well.
    floor = {
        "groupmask-dp-sgd": 0.95,
        "secagg-distributed": 0.6,
        "lattice-distributed": 0.6,
        "paillier-distributed": 0.0,
    }[name]
    assert report["final_auc"] > floor
    assert all(r["loss"] == r["loss"] for r in report["rounds"])  # finite throughout


def test_distributed_epsilon_is_the_accountants(reports):
    privacy = reports["secagg-distributed"]["protection"]["privacy"]
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(privacy["noise_multiplier"]), 15)
    assert privacy["epsilon_spent"] == pytest.approx(_rdp(event, 1e-5), rel=1e-9)
    assert privacy["unit"].startswith("one party's whole update")


def test_lattice_noise_lies_on_its_own_coarser_grid(reports):
    def last_round(name: str) -> dict:
        party = reports[name]["test_workdir"] / "parties" / "hospital-a.report.json"
        return json.loads(party.read_text())["rounds"][-1]["stats"]["privacy"]

    lattice, secagg = last_round("lattice-distributed"), last_round("secagg-distributed")
    assert lattice["grid_bits"] == secagg["grid_bits"] - 8  # 24-bit messages against 32-bit words
    assert reports["lattice-distributed"]["protection"]["mode"] == "lattice"


def test_adaptive_clipping_ran_under_paillier_with_a_public_alpha(reports):
    report = reports["paillier-distributed"]
    privacy = report["protection"]["privacy"]
    assert privacy["adaptive_clipping"] and privacy["count_noise_multiplier"] > 0
    assert privacy["final_clip_norm"] != 0.5  # it moved
    assert report["mode"] == "paillier"


def test_dp_sgd_states_every_partys_epsilon(reports):
    privacy = reports["groupmask-dp-sgd"]["protection"]["privacy"]
    assert privacy["unit"] == "one record of this party"
    assert set(privacy["per_party"]) == {"hospital-a", "hospital-b", "hospital-c"}
    assert all(0 < v["epsilon_spent"] <= 3 for v in privacy["per_party"].values())


#: The network jobs run two of the example's three parties: DP-SGD and its accountant work per
#: party, and a third PyTorch or Keras party process cost each job about 9 s of CPU.
TWO_PARTIES = ["hospital-a", "hospital-b"]


def _nn_job(tmp_path, path, **changes):
    from confide.spec import load_job, parse_job

    spec = load_job(path).model_dump(mode="json")
    spec.update(changes)
    return run_local(parse_job(spec), tmp_path, progress=False, echo=lambda *_: None)


def test_pytorch_dp_sgd_through_opacus_between_processes(tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("opacus") is None:
        pytest.skip("PyTorch and Opacus are the torch extra (confide[torch]); make test installs them")
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "pytorch_digits" / "job_dp.yaml"
    report = _nn_job(tmp_path, path, job_id="dp-torch", rounds=3, parties=TWO_PARTIES)
    privacy = report["protection"]["privacy"]
    assert privacy["rounds_accounted"] == 3 and 0 < privacy["epsilon_spent"] <= 8
    assert privacy["unit"] == "one record of this party"


def test_keras_dp_sgd_on_jax_between_processes(tmp_path):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "digits_cnn.yaml"
    from confide.spec import load_job

    model = load_job(path).model.model_dump(mode="json")
    model["backends"] = {}
    report = _nn_job(
        tmp_path,
        path,
        job_id="dp-keras",
        rounds=2,
        parties=TWO_PARTIES,
        model=model,
        privacy={"mechanism": "dp_sgd", "epsilon": 8},
    )
    privacy = report["protection"]["privacy"]
    assert privacy["rounds_accounted"] == 2 and 0 < privacy["epsilon_spent"] <= 8
