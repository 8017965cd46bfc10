"""sessions.py without a store: deltas, their application, set_path, routing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confide.controller import sessions as cfg
from confide.errors import InvalidParameterError

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_keys = st.text("abcdef", min_size=1, max_size=3)
_json = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)
_configs = st.dictionaries(_keys, _json, max_size=5)


@settings(max_examples=150, deadline=None)
@given(_configs, _configs)
def test_apply_delta_of_delta_gives_the_target(a, b):
    ops = cfg.delta(a, b)
    assert cfg.apply_delta(a, ops) == b
    assert cfg.config_digest(cfg.apply_delta(a, ops)) == cfg.config_digest(b)


@settings(max_examples=100, deadline=None)
@given(_configs)
def test_delta_of_equal_configs_is_empty(a):
    assert cfg.delta(a, a) == []
    assert cfg.delta(None, a) == [{"op": "set", "path": [], "value": a}]
    assert cfg.apply_delta(a, cfg.delta(a, None)) is None


def test_delta_touches_only_changed_leaves():
    old = {"spec": {"model": {"learning_rate": 0.1, "l2": 0.0}, "rounds": 10}, "role": "party"}
    new = {"spec": {"model": {"learning_rate": 0.05, "l2": 0.0}, "rounds": 10}, "role": "party"}
    assert cfg.delta(old, new) == [{"op": "set", "path": ["spec", "model", "learning_rate"], "value": 0.05}]


def test_apply_delta_does_not_mutate_its_input():
    old = {"a": {"b": 1}}
    cfg.apply_delta(old, [{"op": "set", "path": ["a", "b"], "value": 2}])
    assert old == {"a": {"b": 1}}


@pytest.mark.parametrize(
    "ops",
    [[{"op": "merge", "path": ["a"]}], [{"op": "set", "path": "a"}], [{"path": ["a"]}]],
)
def test_malformed_delta(ops):
    with pytest.raises(InvalidParameterError, match="delta operation 0 is malformed"):
        cfg.apply_delta({"a": 1}, ops)


def test_delta_on_a_missing_configuration():
    with pytest.raises(InvalidParameterError, match="does not exist"):
        cfg.apply_delta(None, [{"op": "set", "path": ["a"], "value": 1}])


def test_set_path():
    data = {"model": {"learning_rate": 0.1}}
    assert cfg.set_path(data, "model.learning_rate", 0.5) == {"model": {"learning_rate": 0.5}}
    assert cfg.set_path(data, "transport.round_timeout_s", 3) == {
        "model": {"learning_rate": 0.1},
        "transport": {"round_timeout_s": 3},
    }
    assert data == {"model": {"learning_rate": 0.1}}  # a copy


@pytest.mark.parametrize("dotted", ["", ".a", "a.", "a..b", None, 3])
def test_set_path_refuses_bad_paths(dotted):
    with pytest.raises(InvalidParameterError, match="setting path"):
        cfg.set_path({}, dotted, 1)


def test_set_path_refuses_to_descend_into_a_value():
    with pytest.raises(InvalidParameterError, match="model.learning_rate is not a section"):
        cfg.set_path({"model": {"learning_rate": 0.1}}, "model.learning_rate.x", 1)


def test_routing_depends_only_on_the_slice_index():
    policy = cfg.routing_policy([{"name": "n0", "address": "a"}, {"name": "n1", "address": "b"}], workers=2)
    assert [cfg.route(policy, i) for i in range(5)] == [("n0", 0), ("n1", 0), ("n0", 1), ("n1", 1), ("n0", 0)]
    with pytest.raises(InvalidParameterError, match="at least one aggregator"):
        cfg.routing_policy([])
