"""Robust strategies: each rule's estimate, the aggregator's slice-by-slice and whole-update paths, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from confide.aggregator.robust import RobustRound, strategy_of
from confide.aggregator.rounds import validate_header
from confide.errors import InvalidParameterError, ProtocolError
from confide.ml.strategies import STRATEGIES, RobustStrategy, make_strategy
from confide.spec import parse_job
from confide.v1 import runtime_pb2 as pb

ROBUST = [name for name, cls in STRATEGIES.items() if issubclass(cls, RobustStrategy)]


def honest_and_one_scaled(m=5, n=200, scale=100.0, seed=0):
    """m - 1 honest updates around one direction and one scaled by ``scale`` (the last row)."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=n)
    rows = direction + 0.1 * rng.normal(size=(m, n))
    rows[-1] *= scale
    return rows.astype(np.float32), direction


def gram(rows):
    wide = rows.astype(np.float64)
    return wide @ wide.T


def estimate(strategy, rows):
    if strategy.whole_vector:
        return strategy.weights(gram(rows)) @ rows.astype(np.float64)
    return strategy.combine(rows)


@pytest.mark.parametrize("name", ROBUST)
def test_every_rule_resists_one_scaled_update_where_the_mean_does_not(name):
    rows, direction = honest_and_one_scaled()
    strategy = make_strategy(name)
    strategy.check(rows.shape[0])
    robust = estimate(strategy, rows)
    honest_mean = rows[:-1].astype(np.float64).mean(axis=0)
    assert np.linalg.norm(robust - honest_mean) < 0.5 * np.linalg.norm(direction), name
    assert np.linalg.norm(rows.mean(axis=0) - honest_mean) > 10 * np.linalg.norm(direction)


def test_median_and_trimmed_mean_are_the_textbook_ones():
    rows = np.array([[1, 10, -3], [2, 20, -1], [3, 30, 100], [4, -40, 0], [5, 50, 2]], dtype=np.float32)
    assert np.array_equal(make_strategy("median").combine(rows), np.median(rows, axis=0).astype(np.float32))
    trimmed = make_strategy("trimmed_mean", trim_fraction=0.2).combine(rows)
    assert np.allclose(trimmed, [3.0, (10 + 20 + 30) / 3, (-1 + 0 + 2) / 3])


def test_krum_picks_the_update_closest_to_its_neighbours_and_multi_krum_averages_the_best():
    rows, _ = honest_and_one_scaled(m=6)
    krum = make_strategy("krum", byzantine=1)
    weights = krum.weights(gram(rows))
    assert weights.sum() == pytest.approx(1.0) and np.count_nonzero(weights) == 1 and weights[-1] == 0
    multi = make_strategy("multi_krum", byzantine=1, selected=0)
    weights = multi.weights(gram(rows))
    assert np.count_nonzero(weights) == 5 and weights[-1] == 0 and weights.sum() == pytest.approx(1.0)


def test_norm_clip_scales_the_outlier_to_the_median_norm_or_the_bound():
    rows, _ = honest_and_one_scaled()
    norms = np.linalg.norm(rows.astype(np.float64), axis=1)
    weights = make_strategy("norm_clip").weights(gram(rows))
    assert weights[-1] * rows.shape[0] == pytest.approx(np.median(norms) / norms[-1])
    fixed = make_strategy("norm_clip", norm_bound=1.0).weights(gram(rows))
    assert np.allclose(fixed * rows.shape[0], np.minimum(1.0, 1.0 / norms))


def header(rule: str, participants=5, nodes=1, slices=3, **options):
    return pb.RoundHeader(
        job_id="robust",
        participants=[f"p{i}" for i in range(participants)],
        kind=pb.AGGREGATION_KIND_FLOAT32_STACK,
        num_slices=slices,
        slice_length=4,
        vector_length=4 * slices,
        cluster_nodes=nodes,
        robust=pb.RobustRule(rule=rule, **options),
    )


def stacked(rows):
    return np.ascontiguousarray(rows, dtype="<f4").tobytes()


def test_a_coordinate_wise_rule_delivers_each_slice_as_it_completes():
    rows, _ = honest_and_one_scaled(n=12)
    state = RobustRound(header("median"), owned=3)
    first = state.take([(0, stacked(rows[:, 0:4]))])
    assert [i for i, _ in first] == [0]
    assert np.allclose(np.frombuffer(first[0][1], dtype="<f4"), np.median(rows[:, 0:4], axis=0))


def test_a_whole_update_rule_holds_the_slices_until_the_last_then_weighs_whole_updates():
    rows, _ = honest_and_one_scaled(n=12)
    state = RobustRound(header("krum", byzantine=1), owned=3)
    assert state.take([(2, stacked(rows[:, 8:12]))]) == []
    assert state.take([(0, stacked(rows[:, 0:4]))]) == []
    out = dict(state.take([(1, stacked(rows[:, 4:8]))]))
    assert sorted(out) == [0, 1, 2]
    whole = np.concatenate([np.frombuffer(out[i], dtype="<f4") for i in range(3)])
    chosen = int(np.argmax(state.weights))
    assert chosen != 4 and np.allclose(whole, rows[chosen])


@pytest.mark.parametrize(
    "rule,options,participants,nodes,words",
    [
        ("fedavg", {}, 5, 1, ["header.robust.rule", "median"]),
        ("krum", {"byzantine": 2}, 5, 1, ["byzantine 2 is too large for 5 participants", "2f + 2 < m"]),
        ("krum", {}, 5, 2, ["krum weighs whole updates", "cluster of 2"]),
        ("trimmed_mean", {"trim_fraction": 0.6}, 5, 1, ["trim_fraction must be in (0, 0.5)"]),
        ("median", {}, 2, 1, ["at least 3 participants"]),
    ],
)
def test_the_aggregator_refuses_a_rule_it_cannot_run(rule, options, participants, nodes, words):
    with pytest.raises(ProtocolError) as error:
        strategy_of(header(rule, participants, nodes, **options))
    assert all(w in str(error.value) for w in words), str(error.value)


BASE = {"job_id": "robust", "parties": [f"h{i}" for i in range(5)], "protection": {"mode": "plain"}}


@pytest.mark.parametrize(
    "strategy,protection,words",
    [
        ({"name": "median"}, {"mode": "secagg"}, ["strategy.name median", "protection.mode plain", "cannot read"]),
        ({"name": "median"}, {"mode": "lattice"}, ["protection.mode plain (or tee", "cannot read"]),
        ({"name": "median"}, {"mode": "tee", "wire": "bfloat16"}, ["protection.wire float32"]),
        ({"name": "krum", "byzantine": 2}, {"mode": "plain"}, ["strategy.byzantine 2", "too large"]),
        ({"name": "norm_clip", "norm_bound": 0}, {"mode": "plain"}, ["strategy.norm_bound"]),
        ({"name": "norm_clip", "norm_bound": float("nan")}, {"mode": "plain"}, ["strategy.norm_bound"]),
        ({"name": "trimmed_mean", "trim_fraction": 0.5}, {"mode": "plain"}, ["strategy.trim_fraction"]),
        ({"name": "median"}, {"mode": "plain", "wire": "int8"}, ["protection.wire float32"]),
        ({"name": "median"}, {"mode": "plain", "verify": "on"}, ["protection.verify on", "not a sum"]),
    ],
)
def test_bad_robust_jobs_are_refused_naming_the_field(strategy, protection, words):
    with pytest.raises(InvalidParameterError) as error:
        parse_job({**BASE, "strategy": strategy, "protection": protection})
    assert all(w in str(error.value) for w in words), str(error.value)


def test_tee_takes_every_rule_and_its_aggregator_refuses_a_whole_update_rule_on_a_cluster():
    for name in ("median", "trimmed_mean", "krum", "multi_krum", "norm_clip"):
        job = parse_job({**BASE, "strategy": {"name": name}, "protection": {"mode": "tee"}})
        assert job.strategy.name == name and job.protection.mode == "tee"
    stacked = header("krum", 5, 1, byzantine=1)
    stacked.kind = pb.AGGREGATION_KIND_TEE_FLOAT32_STACK
    stacked.encryption_key, stacked.party_id, stacked.routing = b"k" * 92, "p0", pb.RESULT_ROUTING_ALL
    assert validate_header(stacked) is None
    stacked.cluster_nodes = 2
    with pytest.raises(ProtocolError) as error:
        validate_header(stacked)
    assert "krum weighs whole updates" in str(error.value) and "cluster of 2" in str(error.value)


def test_a_robust_strategy_sends_its_change_unweighted():
    delta = np.arange(4.0)
    assert make_strategy("median").contribution(delta, 0.25) is delta and delta[3] == 3.0
    assert make_strategy("krum", byzantine=1).describe() == {
        "rule": "krum",
        "byzantine": 1,
        "selected": 0,
        "name": "krum",
    }
