"""Differential privacy: noise calibration checked statistically, sensitivity bounds, exact transport
through every protection's encoding, and epsilon equal to dp-accounting's for the run's parameters."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from scipy import stats

from confide.crypto import BatchCryptCodec, decrypt_packed, encrypt_packed, sum_encrypted
from confide.crypto.fixedpoint import FixedPoint
from confide.errors import InvalidParameterError
from confide.ml.homo_lr import HomoLR
from confide.privacy import distributed_plan, sgd_plan
from confide.privacy.accounting import PrivacyLedger
from confide.privacy.distributed import DistributedNoise
from confide.privacy.noise import clip_l2, discrete_gaussian, generator, randomized_round
from confide.privacy.party import PartyPrivacy
from confide.spec import parse_job
from tests.fixtures.keys import fixed_key

PARTIES = ["a-1", "a-2", "a-3"]


def job(protection=None, privacy=None, **extra):
    return parse_job(
        {
            "job_id": "dp",
            "parties": PARTIES,
            "rounds": 10,
            "protection": protection or {"mode": "secagg", "mask_bound": 256},
            "privacy": {"mechanism": "distributed", "epsilon": 8, **(privacy or {})},
            **extra,
        }
    )


def rdp_epsilon(event, delta):
    accountant = rdp.RdpAccountant()
    accountant.compose(event)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("sigma", [0.8, 3.7, 40.0])
def test_discrete_gaussian_has_the_calibrated_variance(sigma):
    draws = discrete_gaussian(sigma, 400_000, generator())
    assert draws.dtype == np.int64
    n = draws.size
    variance = draws.var(ddof=1)
    # The discrete Gaussian's variance is sigma^2 up to exp(-2 pi^2 sigma^2) (CKS20, Fact 20).
    exact = sum(k * k * math.exp(-k * k / (2 * sigma * sigma)) for k in range(-2000, 2001)) / sum(
        math.exp(-k * k / (2 * sigma * sigma)) for k in range(-2000, 2001)
    )
    low, high = stats.chi2.ppf([0.0005, 0.9995], n - 1) / (n - 1)
    assert exact * low <= variance <= exact * high
    assert abs(draws.mean()) < 5 * math.sqrt(exact / n)
    # Shape: P[0] matches the normalised mass at 0.
    p0 = 1 / sum(math.exp(-k * k / (2 * sigma * sigma)) for k in range(-2000, 2001))
    assert abs((draws == 0).mean() - p0) < 5 * math.sqrt(p0 * (1 - p0) / n)


def test_clipping_and_rounding_respect_the_sensitivity_bound():
    rng = np.random.default_rng(0)
    for _ in range(200):
        d = int(rng.integers(1, 300))
        update = rng.normal(0, rng.choice([1e-3, 1.0, 1e3]), d)
        clip = float(rng.uniform(0.1, 5))
        clipped, norm = clip_l2(update, clip)
        assert np.linalg.norm(clipped) <= clip * (1 + 1e-12)
        assert norm == pytest.approx(np.linalg.norm(update))
        scale = 2.0 ** int(rng.integers(0, 20))
        rounded = randomized_round(clipped * scale, generator())
        assert np.linalg.norm(rounded) <= scale * clip + math.sqrt(d) + 1e-9
    # Unbiased: the mean of many roundings of 0.3 is 0.3.
    assert randomized_round(np.full(200_000, 0.3), generator()).mean() == pytest.approx(0.3, abs=0.005)


@pytest.mark.parametrize("colluders", [0, 1])
def test_the_parties_noise_shares_sum_to_the_calibrated_variance(colluders):
    spec = job(
        privacy={"tolerate_colluders": colluders}, protection={"mode": "secagg", "mask_bound": 256, "min_parties": 3}
    )
    plan = distributed_plan(spec.privacy, spec.rounds)
    d = 60_000
    shares = []
    for _ in PARTIES:
        noise = DistributedNoise(spec.privacy, spec.protection, plan)
        vector, alpha = noise.privatize(np.zeros(d), PARTIES)
        assert alpha is None
        shares.append(vector)
    total = np.sum(shares, axis=0)  # what the secure sum yields (before the mean)
    sensitivity = noise.last["sensitivity"]
    expected = (len(PARTIES) / (len(PARTIES) - colluders)) * (plan.noise_multiplier * sensitivity) ** 2
    low, high = stats.chi2.ppf([0.0005, 0.9995], d - 1) / (d - 1)
    assert expected * low <= total.var(ddof=1) <= expected * high
    # Sensitivity in real units is clip + sqrt(d) / 2^g, and the noise std is z times it.
    assert sensitivity == pytest.approx(1.0 + math.sqrt(d) / 2 ** noise.last["grid_bits"])


def test_fixed_point_carries_the_noisy_grid_exactly():
    spec = job()
    plan = distributed_plan(spec.privacy, spec.rounds)
    rng = np.random.default_rng(1)
    vectors = []
    for _ in PARTIES:
        noise = DistributedNoise(spec.privacy, spec.protection, plan)
        vectors.append(noise.privatize(rng.normal(0, 0.5, 500), PARTIES)[0])
    fixed = FixedPoint(spec.protection.mask_bound, len(PARTIES))
    words = np.sum([fixed.encode(v) for v in vectors], axis=0, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(fixed.decode(words), np.sum(vectors, axis=0))


def test_batchcrypt_carries_the_noisy_grid_exactly():
    spec = job(protection={"mode": "paillier", "bits": 24})
    plan = distributed_plan(spec.privacy, spec.rounds)
    key = fixed_key()
    rng = np.random.default_rng(2)
    vectors, alphas = [], set()
    for _ in PARTIES:
        noise = DistributedNoise(spec.privacy, spec.protection, plan)
        vector, alpha = noise.privatize(rng.normal(0, 0.5, 700), PARTIES)
        vectors.append(vector)
        alphas.add(alpha)
    assert len(alphas) == 1
    codec = BatchCryptCodec(bits=24, max_parties=len(PARTIES), alpha=alphas.pop())
    total = sum_encrypted([encrypt_packed(v, codec, key) for v in vectors])
    assert np.array_equal(decrypt_packed(total, key), np.sum(vectors, axis=0))


def test_reported_epsilon_is_the_accountants_for_the_run():
    spec = job(privacy={"epsilon": 4, "delta": 1e-6})
    party = PartyPrivacy(spec, "a-1", samples=100)
    z = party.plan.noise_multiplier
    for round_number in range(1, 7):
        assert party.allow(round_number)
        party.record()
    expected = rdp_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 6), 1e-6)
    report = party.report()
    assert report["epsilon_spent"] == pytest.approx(expected, rel=1e-12)
    assert report["delta"] == 1e-6 and report["rounds_accounted"] == 6
    assert "dp-accounting" in report["accountant"]
    # Over the planned 10 rounds the calibration meets the budget and no more than needed.
    full = rdp_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 10), 1e-6)
    assert 4 * 0.995 <= full <= 4


def test_dp_sgd_epsilon_is_the_accountants_poisson_sampled_gaussian():
    spec = parse_job(
        {
            "job_id": "sgd",
            "parties": PARTIES,
            "rounds": 5,
            "model": {"batch_size": 20, "local_epochs": 2},
            "privacy": {"mechanism": "dp_sgd", "epsilon": 3, "delta": 1e-5},
        }
    )
    plan = sgd_plan(spec.privacy, samples=200, batch_size=20, epochs=2, rounds=5)
    assert plan.sample_rate == 0.1 and plan.steps_per_round == 20
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(plan.noise_multiplier)), 100
    )
    assert plan.spent(5) == pytest.approx(rdp_epsilon(event, 1e-5), rel=1e-12)
    assert plan.spent(5) <= 3


def test_adaptive_clipping_follows_the_noisy_count():
    spec = job(privacy={"adaptive_clipping": True, "target_quantile": 0.5, "clip_learning_rate": 0.2})
    plan = distributed_plan(spec.privacy, spec.rounds)
    assert plan.count_noise_multiplier == pytest.approx(2 * plan.noise_multiplier)
    noise = DistributedNoise(spec.privacy, spec.protection, plan)
    vector, _ = noise.privatize(np.zeros(10), PARTIES)
    assert vector.size == 11  # the count rides along
    aggregate = np.zeros(11)
    aggregate[10] = 3.0  # every party was inside the clip: shrink it
    mean = noise.finish(aggregate, PARTIES)
    assert mean.size == 10
    assert noise.clip == pytest.approx(math.exp(-0.2 * 0.5))
    aggregate[10] = 0.0  # nobody inside: grow it
    noise.finish(aggregate, PARTIES)
    assert noise.clip == pytest.approx(1.0)
    # Its release is accounted: epsilon composes both Gaussian mechanisms.
    z, zb = plan.noise_multiplier, plan.count_noise_multiplier
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z), dp_accounting.GaussianDpEvent(zb)]), 10
    )
    assert plan.spent(10) == pytest.approx(rdp_epsilon(event, 1e-5))


def test_the_budget_stops_or_warns_when_rounds_run_past_it():
    spec = job(privacy={"epsilon": 2})
    party = PartyPrivacy(spec, "a-1", samples=100)
    for round_number in range(1, 11):
        assert party.allow(round_number)
        party.record()
    assert not party.allow(11)  # a resumed run with more rounds than the budget was calibrated for
    assert party.report()["stopped_before_round"] == 11
    warn = PartyPrivacy(job(privacy={"epsilon": 2, "on_budget_spent": "warn"}), "a-1", samples=100)
    warn.ledger = PrivacyLedger.from_json(party.ledger.to_json())
    assert warn.allow(11)
    assert warn.report()["over_budget"]


@pytest.mark.parametrize(
    ("protection", "privacy", "message"),
    [
        ({"mode": "secagg", "mask_bound": 64}, {"epsilon": 0}, "privacy.epsilon"),
        ({"mode": "secagg", "mask_bound": 64}, {"epsilon": 3, "noise_multiplier": 0.5}, "budget cannot be met"),
        ({"mode": "secagg", "mask_bound": 64}, {"epsilon": 1e-4}, "above privacy.max_noise_multiplier"),
        ({"mode": "plain"}, {"epsilon": 3}, "hides single updates"),
        ({"mode": "tee"}, {"epsilon": 3}, "hides single updates"),
        ({"mode": "secagg"}, {"epsilon": 3}, "protection.mask_bound (8) must hold"),
        ({"mode": "secagg", "mask_bound": None}, {"epsilon": 3}, "mask_bound: null"),
        ({"mode": "paillier", "bits": 4}, {"epsilon": 3}, "raise protection.bits"),
        ({"mode": "secagg", "mask_bound": 64}, {"epsilon": 3, "tolerate_colluders": 2}, "tolerate_colluders"),
        ({"mode": "secagg", "mask_bound": 64}, {"epsilon": 3, "delta": 0}, "privacy.delta"),
    ],
)
def test_budgets_and_settings_that_cannot_run_are_refused_before_the_job_starts(protection, privacy, message):
    with pytest.raises(InvalidParameterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        job(protection=protection, privacy=privacy)


def test_dp_sgd_needs_a_model_that_runs_it():
    with pytest.raises(InvalidParameterError, match="jax backend only"):
        parse_job(
            {
                "job_id": "x",
                "parties": PARTIES,
                "model": {
                    "algorithm": "keras",
                    "backend": "torch",
                    "network": {"layers": [{"class_name": "Dense", "config": {"units": 2}}]},
                },
                "data": {"dataset": "digits"},
                "privacy": {"mechanism": "dp_sgd", "epsilon": 3},
            }
        )
    spec = parse_job(
        {
            "job_id": "x",
            "parties": PARTIES,
            "model": {"algorithm": "custom", "entry": "m.py:f"},
            "privacy": {"mechanism": "dp_sgd", "epsilon": 3},
        }
    )

    class NoRecords:  # a custom model without per-record gradients
        batch_size = 32

    with pytest.raises(InvalidParameterError, match="computes no per-record gradients"):
        PartyPrivacy(spec, "a-1", samples=500, model=NoRecords())


def test_dp_sgd_clips_every_record_and_adds_its_noise():
    rng = np.random.default_rng(3)
    X = rng.normal(0, 1, (400, 5))
    X[0] *= 1e6  # one record with a huge gradient
    y = (X[:, 0] > 0).astype(np.float64)
    steps, lr, clip, z = math.ceil(400 / 40), 1.0, 0.5, 1e-6
    model = HomoLR(learning_rate=lr, batch_size=40, seed=1)
    model.initialize(5)
    model.local_train(X, y, epochs=1, dp_sgd=(z, clip, 0.1))
    # Each step moves w by at most lr / (q n) * (records in the batch * clip + noise): the
    # huge record cannot dominate, and the whole epoch stays within the bound.
    moved = np.linalg.norm(model.get_weights())
    assert moved <= steps * lr / 40 * (400 * clip) + 1e-3
    # With noise, two runs from the same seed differ (the noise is not drawn from the seed).
    again = HomoLR(learning_rate=lr, batch_size=40, seed=1)
    again.initialize(5)
    again.local_train(X, y, epochs=1, dp_sgd=(1.0, clip, 0.1))
    third = HomoLR(learning_rate=lr, batch_size=40, seed=1)
    third.initialize(5)
    third.local_train(X, y, epochs=1, dp_sgd=(1.0, clip, 0.1))
    assert not np.array_equal(again.get_weights(), third.get_weights())


@pytest.mark.slow
def test_dp_sgd_refuses_a_party_too_small_for_its_budget():
    spec = parse_job(
        {
            "job_id": "sgd",
            "parties": PARTIES,
            "rounds": 50,
            "model": {"batch_size": 64},
            "privacy": {"mechanism": "dp_sgd", "epsilon": 0.05},
        }
    )
    with pytest.raises(InvalidParameterError, match="budget cannot be met"):
        PartyPrivacy(spec, "a-1", samples=80)


def test_pytorch_dp_sgd_clips_each_record_under_the_users_own_loop():
    torch = pytest.importorskip("torch", reason="PyTorch is an extra (confide[torch]); make test installs it")
    pytest.importorskip("opacus", reason="Opacus comes with the torch extra; make test installs it")
    from confide.ml.base import FitConfig
    from confide.ml.torch_adapter import TorchModel

    def train(net, loader, epochs):
        optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
        for _ in range(epochs):
            for x, t in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(net(x), t).backward()
                optimizer.step()

    rng = np.random.default_rng(4)
    X = rng.normal(0, 1, (300, 6)).astype(np.float32)
    X[0] *= 1e6  # one record whose plain gradient would dwarf the rest
    y = (X[:, 0] > 0).astype(np.int64)
    net = torch.nn.Linear(6, 2)
    model = TorchModel(net, train, batch_size=30)
    model.build((6,), 2)
    before = {k: v.copy() for k, v in model.get_weights().items()}
    config = FitConfig(round=1, seed=(0, 0, 1), epochs=2, dp_sgd=(1e-6, 0.5, 0.1))
    result = model.fit(X, y, config)
    assert result.metrics["dp_sgd_steps"] == 2 * 10  # every optimizer step went through the hook
    moved = np.sqrt(sum(np.sum((model.get_weights()[k] - before[k]) ** 2) for k in before))
    # lr / (q n) * (records in a batch * clip) per step, 20 steps: far below what the huge record would do.
    assert moved <= 20 * 1.0 / 30 * (300 * 0.5)
    assert not hasattr(next(net.parameters()), "grad_sample") or next(net.parameters()).grad_sample is None
    # Without DP the same loop is untouched (no hook left behind).
    plain = model.fit(X[1:], y[1:], FitConfig(round=2, seed=(0, 0, 2), epochs=1))
    assert "dp_sgd_steps" not in plain.metrics
    batch_norm = TorchModel(torch.nn.Sequential(torch.nn.Linear(6, 2), torch.nn.BatchNorm1d(2)), train, batch_size=30)
    with pytest.raises(InvalidParameterError, match="Opacus cannot compute per-record gradients"):
        batch_norm.fit(X, y, config)


def test_one_party_over_its_budget_stops_every_party():
    from confide.party.rounds import privacy_allows as _privacy_allows

    class Votes:
        def __init__(self, others):
            self.others = others

        def exchange_values(self, round_number, tag, values, peers):
            assert tag == "privacy/allow" and peers == ["a-2", "a-3"]
            return {"a-1": values, **{p: [v] for p, v in zip(peers, self.others, strict=True)}}

    spec = job(privacy={"epsilon": 8})
    party = PartyPrivacy(spec, "a-1", samples=100)
    assert _privacy_allows(Votes([1.0, 1.0]), party, "a-1", PARTIES, 1)
    assert not _privacy_allows(Votes([1.0, 0.0]), party, "a-1", PARTIES, 1)  # a-3's budget is spent
    assert party.report()["stopped_before_round"] == 1


def test_the_default_noise_holds_against_a_participant_who_knows_its_own_share():
    spec = job()
    assert spec.privacy.tolerate_colluders == 1
    plan = distributed_plan(spec.privacy, spec.rounds)
    noise = DistributedNoise(spec.privacy, spec.protection, plan)
    noise.privatize(np.zeros(10), PARTIES)
    # Each of the 3 shares has variance (z Delta)^2 / 2: the two shares a participant does not know sum to (z Delta)^2.
    per_party = noise.last["noise_sigma_per_party"]
    assert per_party == pytest.approx(plan.noise_multiplier * noise.last["sensitivity"] / math.sqrt(2))
