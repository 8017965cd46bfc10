import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from confide.data import FLData, FLDataConflictError, Participant, Provisioned, Step, Table, is_empty_diff
from confide.errors import InvalidParameterError

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def small_table():
    return Table(
        {
            "age": np.array([30.0, np.nan, 50.0, 70.0, 20.0, 40.0, 60.0, 80.0, 35.0, 45.0]),
            "bmi": np.array([20.0, 25.0, 30.0, 35.0, 22.0, 28.0, 31.0, 26.0, 24.0, 27.0]),
            "city": np.array(["a", "b", None, "a", "c", "b", "a", "c", "b", "a"], dtype=object),
            "count": np.arange(1, 11),
            "y": np.array([0, 1, 0, 1, 1, 0, 1, 0, 1, 0]),
        }
    )


def base(pipeline=(), **participants):
    parties = participants or {"hospital-a": {"dataset": "t", "test_fraction": 0.0}}
    return FLData.create(parties, "y", list(pipeline))


def step(name, kind, /, **params):
    return {"name": name, "op": kind, "params": params}


def run(pipeline, table=None, **participant):
    p = {"dataset": "t", "test_fraction": 0.0, **participant}
    return base(pipeline, **{"hospital-a": p}).provision("hospital-a", small_table() if table is None else table)


CLEAN = [step("drop-city", "drop", columns=["city"]), step("fill", "impute", strategy="mean")]

# ---------------------------------------------------------------------- strategies

PARTIES = ["hospital-a", "hospital-b", "clinic-c", "clinic-d", "lab-e"]
STEP_NAMES = ["s1", "s2", "s3", "s4", "s5"]
PARAMS = [
    ("filter", {"column": "age", "op": ">", "value": 25}),
    ("filter", {"column": "city", "op": "notnull"}),
    ("select", {"columns": ["age", "bmi"]}),
    ("drop", {"columns": ["count"]}),
    ("impute", {"strategy": "median"}),
    ("impute", {"columns": ["age"], "strategy": "constant", "value": 0}),
    ("scale", {"method": "standard"}),
    ("scale", {"method": "minmax", "bounds": {"bmi": [10, 50]}}),
    ("clip", {"columns": ["bmi"], "low": 21, "high": 33}),
    ("log1p", {"columns": ["count"]}),
]

participants_st = st.builds(
    Participant,
    dataset=st.sampled_from(["t", "u", "breast-cancer"]),
    fraction=st.sampled_from([1.0, 0.5, 0.8]),
    test_fraction=st.sampled_from([0.0, 0.2, 0.3]),
    seed=st.integers(0, 3),
)
steps_st = st.builds(lambda n, p: Step(n, p[0], p[1]), st.sampled_from(STEP_NAMES), st.sampled_from(PARAMS))


def shape(data, fl, n, parties=PARTIES, names=STEP_NAMES):
    """Apply up to ``n`` random valid operations touching only ``parties`` and step ``names``."""
    for _ in range(n):
        kind = data.draw(st.sampled_from(["add", "remove", "update", "append", "insert", "drop", "sub"]))
        try:
            if kind == "add":
                fl = fl.participants_shaping(add={data.draw(st.sampled_from(parties)): data.draw(participants_st)})
            elif kind == "remove":
                fl = fl.participants_shaping(remove=[data.draw(st.sampled_from(parties))])
            elif kind == "update":
                fl = fl.participants_shaping(update={data.draw(st.sampled_from(parties)): data.draw(participants_st)})
            elif kind == "append":
                s = data.draw(steps_st)
                fl = fl.pipeline_shaping(append=[Step(data.draw(st.sampled_from(names)), s.op, s.params)])
            elif kind == "insert":
                s = data.draw(steps_st)
                fl = fl.pipeline_shaping(
                    insert=(
                        data.draw(st.integers(0, len(fl.pipeline))),
                        Step(data.draw(st.sampled_from(names)), s.op, s.params),
                    )
                )
            elif kind == "drop":
                fl = fl.pipeline_shaping(remove=[data.draw(st.sampled_from(names))])
            else:
                s = data.draw(steps_st)
                fl = fl.pipeline_substitute(data.draw(st.sampled_from(names)), {"op": s.op, "params": s.params})
        except InvalidParameterError:
            pass  # e.g. removing an absent party: the draw was not applicable
    return fl


def random_fldata(data, n=6):
    start = FLData.create({"hub": data.draw(participants_st)}, "y", [])
    return shape(data, start, n)


# ---------------------------------------------------------------------- properties


@SETTINGS
@given(st.data())
def test_export_import_round_trip(data):
    fl = random_fldata(data)
    if data.draw(st.booleans()):
        fl = fl.rollback(data.draw(st.integers(0, fl.version)))
    if data.draw(st.booleans()):
        fl = fl.freeze()
    back = FLData.from_json(fl.to_json())
    assert back == fl and back.fingerprint == fl.fingerprint and back.lineage() == fl.lineage()
    assert FLData.from_dict(json.loads(json.dumps(fl.to_dict()))) == fl
    assert back.to_json() == fl.to_json()


@SETTINGS
@given(st.data())
def test_rollback_restores_the_state_of_that_version(data):
    fl = random_fldata(data)
    v = data.draw(st.integers(0, fl.version))
    back = fl.rollback(v)
    assert back.fingerprint == fl.lineage()[v]["fingerprint"]
    assert back.version == fl.version + 1
    assert back.lineage()[-1]["operation"] == "rollback" and back.lineage()[-1]["arguments"] == {"version": v}
    assert back.lineage()[:-1] == fl.lineage()


@SETTINGS
@given(st.data())
def test_diff_is_empty_exactly_when_fingerprints_agree(data):
    a = random_fldata(data)
    b = shape(data, a, data.draw(st.integers(0, 3)))
    if data.draw(st.booleans()):
        b = b.freeze()
    assert is_empty_diff(a.diff(a)) and is_empty_diff(b.diff(b))
    assert is_empty_diff(a.diff(b)) == (a.fingerprint == b.fingerprint)
    assert is_empty_diff(b.diff(a)) == (a.fingerprint == b.fingerprint)


@SETTINGS
@given(st.data())
def test_merge_of_disjoint_branches_combines_both(data):
    common = random_fldata(data, 8)
    a_parties, b_parties = PARTIES[:2], PARTIES[2:]
    a_steps, b_steps = STEP_NAMES[:2], STEP_NAMES[2:]
    a = shape(data, common, 4, a_parties, a_steps)
    b = shape(data, common, 4, b_parties, b_steps)
    try:
        ab, ba = a.merge(b), b.merge(a)
    except FLDataConflictError as e:
        # Only possible conflict here: both sides moved (removed and re-added) one of their own
        # steps, so both changed the relative order of the steps they share.
        assert all(c.startswith("pipeline order changed differently") for c in e.conflicts)
        return
    assert ab.fingerprint == ba.fingerprint
    assert ab.lineage()[:-1] == a.lineage() and ab.lineage()[-1]["operation"] == "merge"
    for side, parties, names in ((a, a_parties, a_steps), (b, b_parties, b_steps)):
        for n in parties:
            assert ab.participants.get(n) == side.participants.get(n)
        mine = {s.name: s for s in side.pipeline if s.name in names}
        assert {s.name: s for s in ab.pipeline if s.name in names} == mine
        assert [s.name for s in ab.pipeline if s.name in names] == [s.name for s in side.pipeline if s.name in names]
    assert ab.participants["hub"] == common.participants["hub"]
    assert FLData.from_json(ab.to_json()) == ab


@SETTINGS
@given(st.data())
def test_conflicting_merge_names_the_conflict(data):
    common = random_fldata(data)
    party = data.draw(st.sampled_from(sorted(common.participants)))
    a = common.participants_shaping(update={party: {"seed": 101}})
    b = common.participants_shaping(update={party: {"seed": 102}})
    with pytest.raises(FLDataConflictError, match=f"participant '{party}' changed differently") as e:
        a.merge(b)
    assert len(e.value.conflicts) == 1
    with pytest.raises(FLDataConflictError):
        b.merge(a)
    if common.pipeline:
        name = common.pipeline[0].name
        a2 = a.pipeline_substitute(name, {"op": "log1p", "params": {"columns": ["x"]}})
        b2 = b.pipeline_shaping(remove=[name])
        with pytest.raises(FLDataConflictError) as e:
            a2.merge(b2)
        assert any(f"participant '{party}'" in c for c in e.value.conflicts)
        assert any(f"step '{name}'" in c and "removed" in c for c in e.value.conflicts)


@SETTINGS
@given(st.data())
def test_frozen_refuses_every_change(data):
    fl = random_fldata(data).freeze()
    assert fl.frozen
    calls = [
        lambda: fl.participants_shaping(add={"new-party": "t"}),
        lambda: fl.participants_shaping(remove=["hub"]),
        lambda: fl.pipeline_shaping(append=[step("zz", "log1p", columns=["a"])]),
        lambda: fl.pipeline_substitute("s1", {"op": "log1p", "params": {"columns": ["a"]}}),
        lambda: fl.rollback(0),
        lambda: fl.freeze(),
        lambda: fl.merge(fl),
    ]
    for call in calls:
        with pytest.raises(InvalidParameterError, match="frozen"):
            call()
    assert FLData.from_json(fl.to_json()).frozen


def _table(seed, rows=40):
    rng = np.random.default_rng(seed)
    return Table(
        {
            "age": np.where(rng.random(rows) < 0.1, np.nan, rng.normal(50, 10, rows)),
            "bmi": rng.normal(25, 3, rows),
            "city": np.array(rng.choice(["a", "b"], rows), dtype=object),
            "count": rng.integers(0, 9, rows),
            "y": rng.integers(0, 2, rows),
        }
    )


@SETTINGS
@given(st.data())
def test_provision_is_deterministic_and_uses_only_the_partys_table(data):
    me = data.draw(participants_st)
    fl = FLData.create({"hospital-b": me}, "y", CLEAN + [step("sc", "scale", method="standard")])
    table = _table(data.draw(st.integers(0, 100)))
    first = fl.provision("hospital-b", table)
    again = fl.provision("hospital-b", table)
    for x, y in ((first.X, again.X), (first.y, again.y), (first.X_test, again.X_test)):
        assert (x is None and y is None) or np.array_equal(x, y)
    assert (first.X_test is None) == (me.test_fraction == 0.0)
    # Other parties' entries (datasets, fractions, seeds) do not change this party's result,
    # as long as the party keeps its place in the sorted names.
    other = fl.participants_shaping(add={"lab-e": data.draw(participants_st), "lab-f": data.draw(participants_st)})
    again = other.provision("hospital-b", table)
    assert np.array_equal(first.X, again.X) and np.array_equal(first.y, again.y)
    assert first.feature_names == ["age", "bmi", "count"]
    n = table.rows if me.fraction == 1.0 else max(1, round(me.fraction * table.rows))
    assert first.X.shape[0] + (0 if first.X_test is None else first.X_test.shape[0]) == n


# ---------------------------------------------------------------------- creation and state


def test_create_forms_and_state():
    fl = FLData.create(
        {"hospital-b": Participant("u", 0.5), "hospital-a": "t", "clinic-c": {"dataset": "t", "seed": 3}},
        "y",
        [Step("f", "filter", {"column": "age", "op": ">=", "value": 1}), step("d", "drop", columns=["city"])],
    )
    assert list(fl.participants) == ["clinic-c", "hospital-a", "hospital-b"]
    assert fl.participants["clinic-c"] == Participant("t", 1.0, 0.2, 3)
    assert fl.datasets() == {"clinic-c": "t", "hospital-a": "t", "hospital-b": "u"}
    assert fl.pipeline[0].params == {"column": "age", "op": ">=", "value": 1.0}
    assert fl.label == "y" and not fl.frozen and fl.version == 0
    assert fl.lineage() == [
        {
            "version": 0,
            "operation": "create",
            "arguments": {k: v for k, v in fl.state().items() if k != "frozen"},
            "fingerprint": fl.fingerprint,
        }
    ]
    assert len(fl.fingerprint) == 64 and int(fl.fingerprint, 16) >= 0
    assert "v0, 3 participants" in repr(fl)
    # the fingerprint is the state's, not the lineage's
    again = FLData.create({"hospital-a": "t"}, "y").participants_shaping(add={"hospital-b": "u"})
    other = FLData.create({"hospital-a": "t", "hospital-b": "u"}, "y")
    assert again.fingerprint == other.fingerprint and again != other
    # values are immutable: changing returned copies changes nothing
    fl.lineage()[0]["arguments"]["label"] = "x"
    fl.pipeline[0].params["value"] = 99
    fl.state()["participants"].clear()
    assert fl.lineage()[0]["arguments"]["label"] == "y" and fl.pipeline[0].params["value"] == 1.0


@pytest.mark.parametrize(
    "participants, label, pipeline, match",
    [
        ({}, "y", [], "at least 1 participant"),
        ([], "y", [], "participants must be a mapping"),
        ({"Hospital A": "t"}, "y", [], "participants key must be a party name of 1..64 characters of \\[a-z0-9-\\]"),
        ({"a" * 65: "t"}, "y", [], "party name of 1..64"),
        ({"h": "T!"}, "y", [], r"participants\['h'\].dataset must be 1..64 characters"),
        ({"h": {"dataset": "t", "fraction": 0}}, "y", [], r"participants\['h'\].fraction must be in \(0, 1\]"),
        ({"h": {"dataset": "t", "fraction": 1.5}}, "y", [], r"fraction must be in \(0, 1\], got 1.5"),
        ({"h": {"dataset": "t", "test_fraction": 0.95}}, "y", [], r"test_fraction must be in \[0, 0.9\]"),
        ({"h": {"dataset": "t", "seed": -1}}, "y", [], r"participants\['h'\].seed must be in \[0,"),
        ({"h": {"dataset": "t", "colour": 1}}, "y", [], r"participants\['h'\]: unknown key 'colour'"),
        ({"h": {"fraction": 1}}, "y", [], r"participants\['h'\].dataset is required"),
        ({"h": "t"}, "", [], "label must be a column name"),
        ({"h": "t"}, "y", "abc", "pipeline must be a list of steps"),
        ({"h": "t"}, "y", [{"op": "drop"}], r"pipeline\[0\].name is required"),
        ({"h": "t"}, "y", [{"name": "a", "op": "drop", "params": {}, "x": 1}], r"pipeline\[0\]: unknown key 'x'"),
        ({"h": "t"}, "y", [step("a", "drop", columns=["c"])] * 2, "step name 'a' is used more than once"),
        (
            {"h": "t"},
            "y",
            [step("a", "drop", columns=["y"])],
            "step 'a' \\(drop\\): columns must not include the label",
        ),
    ],
)
def test_create_errors_name_the_field(participants, label, pipeline, match):
    with pytest.raises(InvalidParameterError, match=match):
        FLData.create(participants, label, pipeline)


@pytest.mark.parametrize(
    "name, op, params, match",
    [
        ("bad name", "drop", {"columns": ["a"]}, "step name must be 1..64 characters"),
        ("s", "merge", {}, "step 's': op must be one of filter"),
        ("s", "filter", {"column": "a", "op": "~", "value": 1}, r"step 's' \(filter\) params.op must be one of"),
        ("s", "filter", {"column": "a", "op": "<"}, r"params.value is required for op '<'"),
        ("s", "filter", {"column": "a", "op": "<", "value": "x"}, r"params.value must be a finite real number"),
        ("s", "filter", {"column": "a", "op": ">", "value": float("nan")}, "params.value must be a finite"),
        ("s", "filter", {"column": "a", "op": "notnull", "value": 1}, "params.value must be absent for op 'notnull'"),
        ("s", "filter", {"column": "", "op": "notnull"}, "params.column must be a column name"),
        ("s", "filter", {"op": "notnull"}, "params.column is required"),
        ("s", "select", {"columns": []}, r"params.columns must list 1..10000 columns"),
        ("s", "select", {"columns": "age"}, "params.columns must be a list of column names"),
        ("s", "drop", {"columns": ["a", "a"]}, "params.columns lists column 'a' more than once"),
        ("s", "drop", {"columns": ["a"], "how": 1}, "params: unknown key 'how'"),
        ("s", "impute", {"strategy": "mode"}, "params.strategy must be mean, median or constant"),
        ("s", "impute", {"strategy": "constant"}, "params.value is required for strategy 'constant'"),
        ("s", "impute", {"strategy": "mean", "value": 1}, "params.value is only allowed with strategy 'constant'"),
        ("s", "scale", {"method": "robust"}, "params.method must be standard or minmax"),
        (
            "s",
            "scale",
            {"method": "standard", "bounds": {"a": [0, 1]}},
            "params.bounds is only allowed with method 'minmax'",
        ),
        ("s", "scale", {"method": "minmax", "bounds": {"a": [1, 1]}}, r"params.bounds\['a'\] must have low < high"),
        ("s", "scale", {"method": "minmax", "bounds": {"a": [1]}}, r"params.bounds\['a'\] must be \[low, high\]"),
        ("s", "scale", {"method": "minmax", "bounds": {}}, "params.bounds must be a non-empty mapping"),
        (
            "s",
            "scale",
            {"method": "minmax", "columns": ["b"], "bounds": {"a": [0, 1]}},
            r"params.bounds names columns not in .*params.columns: \['a'\]",
        ),
        ("s", "clip", {"columns": ["a"]}, "at least one of low and high is required"),
        ("s", "clip", {"columns": ["a"], "low": 2, "high": 1}, "params.low must be <= .*params.high"),
        ("s", "log1p", {}, "params.columns is required"),
    ],
)
def test_step_errors_name_the_step_and_field(name, op, params, match):
    with pytest.raises(InvalidParameterError, match=match):
        Step(name, op, params)


def test_step_value_semantics():
    a = Step("s", "clip", {"columns": ["a"], "low": 1})
    assert a == Step("s", "clip", {"columns": ["a"], "low": 1.0}) and hash(a) == hash(Step.from_value(a.to_dict()))
    assert a != Step("s", "clip", {"columns": ["a"], "high": 1})
    assert a.to_dict() == {"name": "s", "op": "clip", "params": {"columns": ["a"], "low": 1.0}}
    assert "clip" in repr(a)


# ---------------------------------------------------------------------- shaping


def test_participants_shaping():
    fl = base(**{"hospital-a": "t", "hospital-b": "u"})
    added = fl.participants_shaping(add={"clinic-c": {"dataset": "v", "fraction": 0.5}})
    assert added.participants["clinic-c"] == Participant("v", 0.5)
    assert added.lineage()[-1]["operation"] == "participants_shaping"
    removed = added.participants_shaping(remove=["hospital-a"])
    assert list(removed.participants) == ["clinic-c", "hospital-b"]
    updated = removed.participants_shaping(update={"hospital-b": {"test_fraction": 0.0}})
    assert updated.participants["hospital-b"] == Participant("u", 1.0, 0.0, 0)
    replaced = updated.participants_shaping(update={"hospital-b": Participant("w")})
    assert replaced.participants["hospital-b"] == Participant("w")
    combined = fl.participants_shaping(add={"lab-e": "t"}, remove=["hospital-a"], update={"hospital-b": {"seed": 4}})
    assert combined.datasets() == {"hospital-b": "u", "lab-e": "t"} and combined.participants["hospital-b"].seed == 4
    assert combined.version == 1 and fl.version == 0  # fl itself is unchanged


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "nothing to change"),
        ({"add": {"hospital-a": "t"}}, "add: party 'hospital-a' is already a participant"),
        ({"remove": ["clinic-z"]}, "remove: unknown party 'clinic-z'"),
        ({"remove": ["hospital-a", "hospital-b"]}, "at least 1 participant must remain"),
        ({"remove": "hospital-a"}, "remove must be a list of party names"),
        ({"update": {"clinic-z": {"seed": 1}}}, "update: unknown party 'clinic-z'"),
        ({"update": {"hospital-a": {"fraction": 2}}}, r"update\['hospital-a'\].fraction must be in \(0, 1\]"),
        ({"update": {"hospital-a": {"colour": 2}}}, r"update\['hospital-a'\]: unknown key 'colour'"),
        ({"remove": ["hospital-a"], "update": {"hospital-a": {"seed": 1}}}, "update: unknown party 'hospital-a'"),
        ({"remove": ["hospital-a"], "add": {"hospital-a": "t"}}, "party 'hospital-a' appears in both remove and add"),
        ({"add": {"Bad": "t"}}, "add key must be a party name"),
    ],
)
def test_participants_shaping_errors(kwargs, match):
    fl = base(**{"hospital-a": "t", "hospital-b": "u"})
    with pytest.raises(InvalidParameterError, match=match):
        fl.participants_shaping(**kwargs)


def test_pipeline_shaping_and_substitute():
    fl = base([step("a", "drop", columns=["city"]), step("b", "impute", strategy="mean")])
    fl2 = fl.pipeline_shaping(
        append=[step("c", "log1p", columns=["count"])],
        insert=(0, Step("z", "filter", {"column": "age", "op": "notnull"})),
    )
    assert [s.name for s in fl2.pipeline] == ["z", "a", "b", "c"]
    fl3 = fl2.pipeline_shaping(remove=["a"], insert=(1, step("i", "clip", columns=["bmi"], high=30)))
    assert [s.name for s in fl3.pipeline] == ["z", "i", "b", "c"]
    fl4 = fl3.pipeline_substitute("b", {"op": "impute", "params": {"strategy": "median"}})
    assert fl4.pipeline[2] == Step("b", "impute", {"strategy": "median"})
    fl5 = fl4.pipeline_substitute("b", Step("b2", "impute", {"strategy": "constant", "value": 0}))
    assert [s.name for s in fl5.pipeline] == ["z", "i", "b2", "c"]
    assert [e["operation"] for e in fl5.lineage()] == [
        "create",
        "pipeline_shaping",
        "pipeline_shaping",
        "pipeline_substitute",
        "pipeline_substitute",
    ]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda fl: fl.pipeline_shaping(), "nothing to change"),
        (lambda fl: fl.pipeline_shaping(remove=["zz"]), r"remove: unknown step 'zz'; steps: \['a', 'b'\]"),
        (lambda fl: fl.pipeline_shaping(remove=["a", "a"]), "lists a step more than once"),
        (
            lambda fl: fl.pipeline_shaping(append=[step("a", "log1p", columns=["x"])]),
            "step name 'a' is used more than once",
        ),
        (lambda fl: fl.pipeline_shaping(append=step("c", "log1p", columns=["x"])), "append must be a list of steps"),
        (
            lambda fl: fl.pipeline_shaping(insert=(3, step("c", "log1p", columns=["x"]))),
            r"insert.index must be in \[0, 2\]",
        ),
        (
            lambda fl: fl.pipeline_shaping(insert=step("c", "log1p", columns=["x"])),
            r"insert must be a pair \(index, step\)",
        ),
        (
            lambda fl: fl.pipeline_shaping(insert=(0, {"name": "c", "op": "log1p"})),
            r"insert.step.*params.columns is required",
        ),
        (
            lambda fl: fl.pipeline_shaping(append=[step("c", "drop", columns=["y"])]),
            "columns must not include the label 'y'",
        ),
        (lambda fl: fl.pipeline_substitute("zz", {"op": "log1p", "params": {"columns": ["x"]}}), "unknown step 'zz'"),
        (
            lambda fl: fl.pipeline_substitute("a", {"name": "b", "op": "log1p", "params": {"columns": ["x"]}}),
            "'b' is used more",
        ),
        (
            lambda fl: fl.pipeline_substitute("a", {"op": "log1p", "colour": 1}),
            "pipeline_substitute.step: unknown key 'colour'",
        ),
        (lambda fl: fl.rollback(2), r"rollback.version must be in \[0, 0\], got 2"),
        (lambda fl: fl.rollback(-1), r"rollback.version must be in \[0, 0\]"),
        (lambda fl: fl.diff("x"), "diff: other must be an FLData"),
        (lambda fl: fl.merge(None), "merge: other must be an FLData"),
    ],
)
def test_pipeline_and_tracking_errors(call, match):
    fl = base([step("a", "drop", columns=["city"]), step("b", "impute", strategy="mean")])
    with pytest.raises(InvalidParameterError, match=match):
        call(fl)


def test_rollback_and_freeze_lineage():
    fl = base().pipeline_shaping(append=[step("a", "drop", columns=["city"])]).participants_shaping(add={"lab-e": "t"})
    back = fl.rollback(1)
    assert back.participants == base().participants and back.pipeline == fl.pipeline
    again = back.rollback(2)  # a rollback can be rolled back
    assert again.fingerprint == fl.fingerprint
    frozen = again.freeze()
    assert frozen.frozen and frozen.fingerprint != again.fingerprint
    assert frozen.lineage()[-1] == {
        "version": 5,
        "operation": "freeze",
        "arguments": {},
        "fingerprint": frozen.fingerprint,
    }
    d = again.diff(frozen)
    assert d["frozen"] == {"from": False, "to": True} and not is_empty_diff(d)


# ---------------------------------------------------------------------- diff and merge


def test_diff_reports_each_kind_of_change():
    a = base(
        [
            step("a", "drop", columns=["city"]),
            step("b", "impute", strategy="mean"),
            step("c", "log1p", columns=["bmi"]),
        ],
        **{"hospital-a": "t", "hospital-b": "u"},
    )
    b = (
        a.participants_shaping(add={"lab-e": "v"}, remove=["hospital-a"], update={"hospital-b": {"seed": 2}})
        .pipeline_shaping(remove=["a"], append=[step("d", "clip", columns=["bmi"], low=0)])
        .pipeline_substitute("b", {"op": "impute", "params": {"strategy": "median"}})
        .pipeline_shaping(remove=["c"], insert=(0, step("c", "log1p", columns=["bmi"])))
    )
    d = a.diff(b)
    assert d["participants"] == {
        "added": {"lab-e": Participant("v").to_dict()},
        "removed": ["hospital-a"],
        "changed": {"hospital-b": {"from": Participant("u").to_dict(), "to": Participant("u", seed=2).to_dict()}},
    }
    assert d["label"] is None and d["frozen"] is None
    assert d["pipeline"]["added"] == [Step("d", "clip", {"columns": ["bmi"], "low": 0}).to_dict()]
    assert d["pipeline"]["removed"] == ["a"]
    assert [c["name"] for c in d["pipeline"]["changed"]] == ["b"]
    assert d["pipeline"]["changed"][0]["to"]["params"] == {"strategy": "median"}
    assert d["pipeline"]["order"] is True
    json.dumps(d)  # plain JSON values
    assert is_empty_diff(a.diff(a.rollback(0)))


def test_merge_examples():
    common = base(
        [step("a", "drop", columns=["city"]), step("b", "impute", strategy="mean")],
        **{"hospital-a": "t", "hospital-b": "u"},
    )
    # one side reorders, the other appends after 'a' and 'b' and adds a party
    left = common.pipeline_shaping(remove=["a"], append=[step("a", "drop", columns=["city"])])
    right = common.pipeline_shaping(append=[step("x", "log1p", columns=["bmi"])]).participants_shaping(
        add={"lab-e": "t"}
    )
    m = left.merge(right)
    assert [s.name for s in m.pipeline] == ["b", "a", "x"] and "lab-e" in m.participants
    assert right.merge(left).fingerprint == m.fingerprint
    # a step inserted between 'a' and 'b' has no place once the other side swaps them
    between = common.pipeline_shaping(insert=(1, step("x", "log1p", columns=["bmi"])))
    with pytest.raises(FLDataConflictError, match="pipeline order changed differently") as e:
        left.merge(between)
    assert e.value.conflicts == [
        "pipeline order changed differently on both sides (step 'x' comes after 'a' and before 'b' on one side, "
        "but the other side put 'b' before 'a')"
    ]
    with pytest.raises(FLDataConflictError, match="pipeline order changed differently"):
        between.merge(left)
    # both sides appending different steps at the end: runs ordered by first step name
    p = common.pipeline_shaping(append=[step("p", "log1p", columns=["bmi"])])
    q = common.pipeline_shaping(append=[step("c", "clip", columns=["bmi"], low=0)])
    assert [s.name for s in p.merge(q).pipeline] == ["a", "b", "c", "p"] == [s.name for s in q.merge(p).pipeline]
    # identical changes on both sides are no conflict
    same = common.participants_shaping(remove=["hospital-b"])
    assert same.merge(same).fingerprint == same.fingerprint
    # merging an ancestor changes nothing; merging a descendant fast-forwards the state
    assert common.merge(m).fingerprint == m.fingerprint and m.merge(common).fingerprint == m.fingerprint
    # both reorder differently: conflict on the order
    r1 = common.pipeline_shaping(remove=["a"], append=[step("a", "drop", columns=["city"])])
    r2 = common.pipeline_shaping(append=[step("z", "log1p", columns=["bmi"])]).pipeline_shaping(
        remove=["a", "b"], append=[step("b", "impute", strategy="mean"), step("a", "drop", columns=["city"])]
    )
    assert r1.merge(r2).fingerprint == r2.merge(r1).fingerprint  # same common order: fine
    r3 = common.pipeline_shaping(append=[step("z", "log1p", columns=["bmi"])])
    r3 = r3.pipeline_shaping(remove=["a"], insert=(1, step("a", "drop", columns=["city"])))  # b, a, z
    r4 = common.pipeline_shaping(append=[step("z", "log1p", columns=["bmi"])])
    r4 = r4.pipeline_shaping(remove=["z"], insert=(0, step("z", "log1p", columns=["bmi"])))  # z, a, b
    with pytest.raises(FLDataConflictError, match="pipeline order changed differently"):
        r3.merge(r4)


S1, S3, S4 = Step("s1", *PARAMS[4]), Step("s3", *PARAMS[9]), Step("s4", *PARAMS[6])


def test_merge_keeps_each_sides_order_when_the_other_side_moved_a_step():
    # As the merge property test draws them: a touches only PARTIES[:2] and s1, s2; b only PARTIES[2:] and s3..s5.
    common = FLData.create({"hub": "t"}, "y", [S4, S1])
    a = common.participants_shaping(add={PARTIES[0]: "t"}).pipeline_shaping(remove=["s1"], insert=(0, S1))
    b = common.participants_shaping(add={PARTIES[2]: "u"}).pipeline_shaping(remove=["s4"])
    b = b.pipeline_shaping(insert=(0, S4)).pipeline_shaping(append=[S3])
    assert [s.name for s in a.pipeline] == ["s1", "s4"] and [s.name for s in b.pipeline] == ["s4", "s1", "s3"]
    ab, ba = a.merge(b), b.merge(a)
    # s3 follows every step before it on b's side, not only the nearest one (s1, which a moved)
    assert [s.name for s in ab.pipeline] == ["s1", "s4", "s3"]
    assert ab.fingerprint == ba.fingerprint
    assert ab.participants == {**common.participants, PARTIES[0]: Participant("t"), PARTIES[2]: Participant("u")}


def test_merge_conflicts_when_a_step_was_added_between_steps_the_other_side_swapped():
    common = FLData.create({"hub": "t"}, "y", [S1, S4])
    a = common.pipeline_shaping(remove=["s1"], append=[S1])  # s4, s1
    b = common.pipeline_shaping(insert=(1, S3))  # s1, s3, s4
    # The states do not tell whether a moved s1 behind s4 or s4 in front of s1, and the two
    # put s3 on different sides of s4: an order conflict either way round.
    for x, y in ((a, b), (b, a)):
        with pytest.raises(FLDataConflictError) as e:
            x.merge(y)
        assert all(c.startswith("pipeline order changed differently") for c in e.value.conflicts)


def test_merge_needs_a_common_ancestor_and_no_frozen_side():
    a = base()
    b = FLData.create({"hospital-a": "other"}, "y")
    with pytest.raises(InvalidParameterError, match="no common lineage ancestor"):
        a.merge(b)
    with pytest.raises(InvalidParameterError, match="other is frozen"):
        a.merge(a.freeze())
    # a merged FLData exports and imports like any other
    m = a.participants_shaping(add={"lab-e": "t"}).merge(
        a.pipeline_shaping(append=[step("c", "log1p", columns=["bmi"])])
    )
    assert FLData.from_json(m.to_json()) == m


# ---------------------------------------------------------------------- export / import


def test_json_format_example():
    fl = base([step("f", "filter", column="age", op=">", value=18)]).participants_shaping(add={"lab-e": "t"})
    d = json.loads(fl.to_json(indent=2))
    assert d["format"] == "confide.fldata" and d["version"] == 1
    assert d["state"] == fl.state() and len(d["lineage"]) == 2
    assert d["lineage"][1]["arguments"] == {
        "add": {"lab-e": {"dataset": "t", "fraction": 1.0, "test_fraction": 0.2, "seed": 0}},
        "remove": [],
        "update": {},
    }


def _export():
    fl = base([step("f", "filter", column="age", op=">", value=18)])
    return fl.participants_shaping(add={"lab-e": "t"}).pipeline_substitute(
        "f", {"op": "log1p", "params": {"columns": ["a"]}}
    )


def _tamper(path, value):
    d = _export().to_dict()
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return d


@pytest.mark.parametrize(
    "data, match",
    [
        (_tamper(["lineage", 1, "arguments", "add", "lab-e", "seed"], 7), r"lineage\[1\].fingerprint does not match"),
        (_tamper(["lineage", 2, "fingerprint"], "0" * 64), r"lineage\[2\].fingerprint does not match"),
        (_tamper(["state", "label"], "z"), "state is not the state the lineage produces"),
        (_tamper(["state", "frozen"], True), "state is not the state the lineage produces"),
        (_tamper(["lineage", 1, "version"], 5), r"lineage\[1\].version must be 1"),
        (_tamper(["lineage", 1, "operation"], "create"), r"lineage\[1\] \('create'\).*only be the first entry"),
        (_tamper(["lineage", 1, "operation"], "teleport"), r"lineage\[1\].*operation must be one of"),
        (_tamper(["lineage", 0, "operation"], "freeze"), r"lineage\[0\].*first entry must be 'create'"),
        (_tamper(["lineage", 0, "extra"], 1), r"lineage\[0\]: unknown key 'extra'"),
        (_tamper(["lineage"], []), "lineage must be a non-empty list"),
        (_tamper(["format"], "other"), "format must be 'confide.fldata'"),
        (_tamper(["version"], 2), "version must be 1"),
        (_tamper(["lineage", 2, "arguments", "step", "op"], "union"), r"lineage\[2\].*op must be one of"),
        ({"format": "confide.fldata"}, "FLData export.version is required"),
    ],
)
def test_import_rejects_tampered_exports(data, match):
    with pytest.raises(InvalidParameterError, match=match):
        FLData.from_dict(data)


def test_import_rejects_bad_json():
    with pytest.raises(InvalidParameterError, match="not valid JSON"):
        FLData.from_json("{")
    with pytest.raises(InvalidParameterError, match="must be str or bytes"):
        FLData.from_json(3)
    with pytest.raises(InvalidParameterError, match="FLData export must be a mapping"):
        FLData.from_json("[]")


def test_merge_entry_tampering_is_rejected():
    a = base()
    m = a.participants_shaping(add={"lab-e": "t"}).merge(a.participants_shaping(add={"lab-f": "t"}))
    d = m.to_dict()
    d["lineage"][-1]["arguments"]["state"]["participants"]["lab-g"] = {"dataset": "t"}
    with pytest.raises(InvalidParameterError, match=r"lineage\[2\].fingerprint does not match"):
        FLData.from_dict(d)
    d = m.to_dict()
    d["lineage"][-1]["arguments"]["ancestor"] = 9
    with pytest.raises(InvalidParameterError, match=r"merge.ancestor must be in \[0, 1\]"):
        FLData.from_dict(d)


# ---------------------------------------------------------------------- provisioning: ops


def test_provision_basic_shapes_and_split():
    fl = base(CLEAN, **{"hospital-a": {"dataset": "t", "test_fraction": 0.3, "seed": 4}})
    out = fl.provision("hospital-a", small_table())
    assert isinstance(out, Provisioned)
    assert out.feature_names == ["age", "bmi", "count"]
    assert out.X.shape == (7, 3) and out.X_test.shape == (3, 3) and out.y_test.shape == (3,)
    assert out.X.dtype == np.float64 and out.y.dtype == np.float64
    # train and test together are the table's rows, each once, in table order within each
    all_rows = {tuple(r) for r in np.vstack([out.X, out.X_test])}
    assert len(all_rows) == 10
    assert list(out.X[:, 2]) == sorted(out.X[:, 2]) and list(out.X_test[:, 2]) == sorted(out.X_test[:, 2])


def test_fraction_sampling_uses_seed_and_party_index():
    fl = FLData.create(
        {
            "a-party": {"dataset": "t", "fraction": 0.5, "test_fraction": 0},
            "b-party": {"dataset": "t", "fraction": 0.5, "test_fraction": 0},
        },
        "y",
        CLEAN,
    )
    t = small_table()
    a, b = fl.provision("a-party", t), fl.provision("b-party", t)
    assert a.X.shape == (5, 3)
    rows = np.sort(np.random.default_rng([0, 0]).choice(10, size=5, replace=False))
    np.testing.assert_array_equal(a.X[:, 2], t.column("count")[rows])
    rows_b = np.sort(np.random.default_rng([0, 1]).choice(10, size=5, replace=False))
    np.testing.assert_array_equal(b.X[:, 2], t.column("count")[rows_b])


def test_filter_ops():
    def kept(column, op, value=None):
        params = {"column": column, "op": op} if value is None else {"column": column, "op": op, "value": value}
        return list(run([step("f", "filter", **params), *CLEAN]).X[:, 2])  # the 'count' column, 1..10

    assert kept("age", ">", 50) == [4, 7, 8]
    assert kept("age", ">=", 50) == [3, 4, 7, 8]
    assert kept("age", "<", 35) == [1, 5]
    assert kept("age", "<=", 35) == [1, 5, 9]
    assert kept("age", "==", 40) == [6]
    assert kept("age", "!=", 40) == [1, 3, 4, 5, 7, 8, 9, 10]  # the missing age never passes
    assert kept("age", "notnull") == [1, 3, 4, 5, 6, 7, 8, 9, 10]
    assert kept("count", "<", 3) == [1, 2]
    assert kept("city", "==", "a") == [1, 4, 7, 10]
    assert kept("city", "!=", "a") == [2, 5, 6, 8, 9]  # row 3 (missing city) never passes
    assert kept("city", "notnull") == [1, 2, 4, 5, 6, 7, 8, 9, 10]
    assert kept("y", "==", 1) == [2, 4, 5, 7, 9]


def test_select_drop_keep_the_label():
    out = run([step("s", "select", columns=["bmi", "age", "y"]), step("f", "impute", strategy="constant", value=-1)])
    assert out.feature_names == ["bmi", "age"] and out.X[1, 1] == -1.0
    assert list(out.y) == [0, 1, 0, 1, 1, 0, 1, 0, 1, 0]
    out = run([step("d", "drop", columns=["city", "age"])])
    assert out.feature_names == ["bmi", "count"]


def test_impute_strategies():
    assert run([*CLEAN[:1], step("i", "impute", strategy="median")]).X[1, 0] == 45.0
    mean = np.nanmean(small_table().column("age"))
    assert run([*CLEAN[:1], step("i", "impute", strategy="mean")]).X[1, 0] == pytest.approx(mean)
    assert run([*CLEAN[:1], step("i", "impute", columns=["age"], strategy="constant", value=7)]).X[1, 0] == 7.0


def test_scale_methods():
    out = run([*CLEAN, step("s", "scale", method="standard")])
    np.testing.assert_allclose(out.X.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(out.X.std(axis=0), 1.0)
    assert list(out.y) == [0, 1, 0, 1, 1, 0, 1, 0, 1, 0]  # the label is not scaled by default
    out = run([*CLEAN, step("s", "scale", method="minmax")])
    assert out.X.min(axis=0).tolist() == [0, 0, 0] and out.X.max(axis=0).tolist() == [1, 1, 1]
    out = run([*CLEAN, step("s", "scale", method="minmax", columns=["bmi"], bounds={"bmi": [10, 60]})])
    np.testing.assert_allclose(out.X[:, 1], (small_table().column("bmi") - 10) / 50)
    assert out.X[:, 2].tolist() == list(range(1, 11))  # other columns untouched
    # bounds for some columns, local statistics for the rest; a constant column becomes 0
    t = Table({"a": [5.0, 5.0], "b": [0.0, 2.0], "y": [0, 1]})
    out = run([step("s", "scale", method="minmax", bounds={"b": [0, 4]})], table=t)
    assert out.X.tolist() == [[0.0, 0.0], [0.0, 0.5]]
    out = run([step("s", "scale", method="standard")], table=t)
    assert out.X.tolist() == [[0.0, -1.0], [0.0, 1.0]]


def test_clip_and_log1p():
    out = run([*CLEAN, step("c", "clip", columns=["bmi", "count"], low=22, high=30)])
    assert out.X[:, 1].min() == 22 and out.X[:, 1].max() == 30 and set(out.X[:, 2]) == {22.0}
    out = run([*CLEAN, step("c", "clip", columns=["count"], high=3)])
    assert out.X[:, 2].tolist() == [1, 2] + [3] * 8
    out = run([*CLEAN, step("l", "log1p", columns=["count"])])
    np.testing.assert_allclose(out.X[:, 2], np.log1p(np.arange(1, 11)))


def test_provision_no_test_split_when_zero():
    out = run(CLEAN)
    assert out.X_test is None and out.y_test is None and out.X.shape == (10, 3)


# ---------------------------------------------------------------------- provisioning: errors


@pytest.mark.parametrize(
    "pipeline, match",
    [
        (
            [step("f", "filter", column="zz", op="notnull")],
            r"party 'hospital-a', step 'f' \(filter\): column 'zz' is not in the table",
        ),
        ([step("f", "filter", column="city", op=">", value=1)], r"step 'f' \(filter\): column 'city' is str"),
        ([step("f", "filter", column="age", op="==", value="a")], r"step 'f' \(filter\): column 'age' is float"),
        (
            [step("f", "filter", column="age", op=">", value=1000)],
            r"step 'f' \(filter\): no rows left after filtering on column 'age'",
        ),
        ([step("s", "select", columns=["zz"])], r"step 's' \(select\): column 'zz' is not in the table"),
        ([step("d", "drop", columns=["zz"])], r"step 'd' \(drop\): column 'zz'"),
        ([step("i", "impute", columns=["city"], strategy="mean")], r"step 'i' \(impute\): column 'city' is text"),
        (
            [step("s", "scale", method="standard", columns=["zz"])],
            r"step 's' \(scale\): column 'zz' is not in the table",
        ),
        (
            [step("s", "scale", method="minmax", bounds={"y": [0, 1]})],
            r"step 's' \(scale\): bounds column 'y' is not a numeric feature",
        ),
        ([step("c", "clip", columns=["city"], low=0)], r"step 'c' \(clip\): column 'city' is text"),
        (
            [
                step("l", "log1p", columns=["bmi"]),
                step("c", "clip", columns=["bmi"], high=-3),
                step("m", "log1p", columns=["bmi"]),
            ],
            r"step 'm' \(log1p\): column 'bmi' has values <= -1",
        ),
        (
            [step("d", "drop", columns=["city"])],
            r"party 'hospital-a', after the pipeline \(last step 'd'\): feature column 'age' has 1 missing values",
        ),
        (
            [step("i", "impute", strategy="mean")],
            r"after the pipeline \(last step 'i'\): feature column 'city' is text",
        ),
        ([], r"\(empty pipeline\): feature column 'age' has 1 missing"),
        ([step("s", "select", columns=["y"])], "no feature columns are left"),
    ],
)
def test_provision_errors_name_party_step_and_column(pipeline, match):
    with pytest.raises(InvalidParameterError, match=match):
        run(pipeline)


def test_provision_other_errors():
    fl = base(CLEAN)
    with pytest.raises(
        InvalidParameterError, match=r"party 'lab-z' is not a participant; participants: \['hospital-a'\]"
    ):
        fl.provision("lab-z", small_table())
    with pytest.raises(InvalidParameterError, match="table must be a confide.data.Table"):
        fl.provision("hospital-a", {"age": [1]})
    with pytest.raises(InvalidParameterError, match="label column 'y' is not in the table"):
        base().provision("hospital-a", Table({"a": [1.0]}))
    with pytest.raises(InvalidParameterError, match="label column 'y' is text"):
        run([], table=Table({"a": [1.0], "y": ["x"]}))
    with pytest.raises(InvalidParameterError, match="label column 'y' has 1 missing"):
        run([], table=Table({"a": [1.0], "y": [np.nan]}))
    with pytest.raises(InvalidParameterError, match="dataset 't' has no rows"):
        run([], table=Table({"a": np.array([]), "y": np.array([])}))
    with pytest.raises(InvalidParameterError, match="1 rows are too few for test_fraction 0.5"):
        run([], table=Table({"a": [1.0], "y": [0]}), test_fraction=0.5)
    with pytest.raises(
        InvalidParameterError, match=r"step 'i' \(impute\): column 'a' has no values to compute the mean"
    ):
        run([step("i", "impute", strategy="mean")], table=Table({"a": [np.nan], "y": [0]}))
    with pytest.raises(InvalidParameterError, match=r"step 's' \(scale\): column 'a' has no values"):
        run([step("s", "scale", method="minmax")], table=Table({"a": [np.nan], "y": [0]}))


def test_provision_breast_cancer_end_to_end():
    from confide.data import Catalog

    cat = Catalog.from_mapping({"datasets": {"bc": {"source": "breast_cancer", "shard": 0, "of": 3}}})
    fl = FLData.create(
        {"hospital-a": {"dataset": "bc", "test_fraction": 0.25}},
        "diagnosis",
        [step("log", "log1p", columns=["mean_area"]), step("sc", "scale", method="standard")],
    )
    out = fl.provision("hospital-a", cat.table(fl.datasets()["hospital-a"]))
    assert out.X.shape[1] == 30 and out.X.shape[0] + out.X_test.shape[0] == cat.table("bc").rows
    assert set(np.unique(out.y)) == {0.0, 1.0}
