"""The fitted FL_Data pipeline as an ONNX graph: on raw records it gives ``transform``'s features, step by step.

Each case fits a pipeline on training rows (``FLData.provision``), then prepares new records
that hold missing values, unseen categories and rows a filter drops, once with ``transform``
(what ``confide model predict`` runs) and once in onnxruntime from the raw columns.
"""

from __future__ import annotations

import numpy as np
import pytest

from confide.data.catalog import Table
from confide.data.fldata import FLData, transform
from confide.data.onnx_graph import pipeline_model, text_columns
from confide.errors import InvalidParameterError

onnxruntime = pytest.importorskip("onnxruntime", reason="the 'export' extra is not installed")

NAN = np.nan
TRAIN = {
    "age": np.array([61.0, NAN, 70.0, 55.0, 48.0, 80.0, 66.0, 59.0]),
    "kappa": np.array([1.2, 0.4, NAN, 2.5, 1.7, 2.1, 0.9, 1.1]),
    "dose": np.array([0.0, 3.0, 1.0, 9.0, 2.0, 4.0, 5.0, 7.0]),
    "sex": np.array(["F", "M", "M", None, "F", "M", "F", "F"], dtype=object),
    "site": np.array(["north", "south", "east", "north", "south", "east", "north", "south"], dtype=object),
    "death": np.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]),
}
NEW = {
    "age": np.array([NAN, 90.0, 45.0, 61.0, 30.0]),
    "kappa": np.array([0.5, NAN, 3.0, 1.0, 0.2]),
    "dose": np.array([8.0, 0.5, 12.0, NAN, 3.0]),
    "sex": np.array(["M", None, "X", "F", "F"], dtype=object),  # a missing and an unseen category
    "site": np.array(["east", "north", "west", "south", "south"], dtype=object),
}
AGREED = {"sex": ["F", "M"], "site": ["east", "north", "south"]}

STEPS = {
    "impute_median": [{"name": "fill", "op": "impute", "params": {"strategy": "median"}}],
    "impute_mean_columns": [{"name": "fill", "op": "impute", "params": {"strategy": "mean", "columns": ["kappa"]}}],
    "impute_constant": [{"name": "fill", "op": "impute", "params": {"strategy": "constant", "value": -1.5}}],
    "scale_standard": [{"name": "s", "op": "scale", "params": {"method": "standard"}}],
    "scale_minmax": [{"name": "s", "op": "scale", "params": {"method": "minmax", "columns": ["age", "dose"]}}],
    "scale_bounds": [
        {"name": "s", "op": "scale", "params": {"method": "minmax", "bounds": {"age": [0, 120], "dose": [0, 10]}}}
    ],
    "clip": [{"name": "c", "op": "clip", "params": {"columns": ["dose", "age"], "low": 1.0, "high": 6.5}}],
    "clip_high": [{"name": "c", "op": "clip", "params": {"columns": ["kappa"], "high": 2.0}}],
    "log1p": [{"name": "l", "op": "log1p", "params": {"columns": ["kappa", "dose"]}}],
    "onehot": [{"name": "e", "op": "encode", "params": {"columns": ["sex", "site"], "categories": AGREED}}],
    "ordinal": [
        {"name": "e", "op": "encode", "params": {"columns": ["site", "sex"], "method": "ordinal", "categories": AGREED}}
    ],
    "filter_number": [{"name": "f", "op": "filter", "params": {"column": "age", "op": ">=", "value": 50}}],
    "filter_not_equal": [{"name": "f", "op": "filter", "params": {"column": "dose", "op": "!=", "value": 3}}],
    "filter_text": [{"name": "f", "op": "filter", "params": {"column": "site", "op": "!=", "value": "east"}}],
    "filter_text_equal": [{"name": "f", "op": "filter", "params": {"column": "sex", "op": "==", "value": "F"}}],
    "filter_notnull": [{"name": "f", "op": "filter", "params": {"column": "kappa", "op": "notnull"}}],
    "filter_notnull_text": [{"name": "f", "op": "filter", "params": {"column": "sex", "op": "notnull"}}],
    "select": [{"name": "keep", "op": "select", "params": {"columns": ["age", "dose"]}}],
    "drop": [{"name": "d", "op": "drop", "params": {"columns": ["kappa"]}}],
}
#: Every case ends with the steps that make the features numbers without gaps.
FINISH = [
    {"name": "finish_encode", "op": "encode", "params": {"columns": ["sex", "site"], "categories": AGREED}},
    {"name": "finish_fill", "op": "impute", "params": {"strategy": "mean"}},
]


def _table(columns: dict) -> Table:
    return Table({name: values.copy() for name, values in columns.items()})


def _pipeline(case: str) -> list[dict]:
    steps = list(STEPS[case])
    encoded = {c for s in steps if s["op"] == "encode" for c in s["params"]["columns"]}
    dropped = {c for s in steps if s["op"] == "drop" for c in s["params"]["columns"]}
    selected = next((set(s["params"]["columns"]) for s in steps if s["op"] == "select"), None)
    left = [c for c in ("sex", "site") if c not in encoded | dropped and (selected is None or c in selected)]
    finish = [{**FINISH[0], "params": {**FINISH[0]["params"], "columns": left}}] if left else []
    return steps + finish + [FINISH[1]]


def _run(pipeline: list[dict]):
    fl = FLData.create({"a": {"dataset": "records", "test_fraction": 0.0}}, "death", pipeline)
    provisioned = fl.provision("a", _table(TRAIN))
    new = _table(NEW)
    X, rows = transform(fl.pipeline, fl.label, provisioned.fitted, new, provisioned.feature_names)
    steps = [s.to_dict() for s in fl.pipeline]
    model = pipeline_model(
        steps, provisioned.fitted, provisioned.feature_names, "death", opset=17, ml_opset=3, ir_version=8
    )
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    text = text_columns(steps)
    feeds = {}
    for column in session.get_inputs():
        raw = NEW[column.name]
        if column.name in text:
            feeds[column.name] = np.array(["" if v is None else v for v in raw], dtype=object).reshape(-1, 1)
        else:
            feeds[column.name] = raw.astype(np.float64).reshape(-1, 1)
    features, kept = session.run(["features", "kept"], feeds)
    return X, rows, features, kept, provisioned


@pytest.mark.parametrize("case", sorted(STEPS))
def test_every_step_gives_the_features_predict_prepares(case):
    X, rows, features, kept, provisioned = _run(_pipeline(case))
    assert features.dtype == np.float32 and features.shape == (len(NEW["age"]), len(provisioned.feature_names))
    assert np.flatnonzero(kept).tolist() == rows.tolist()
    np.testing.assert_allclose(features[kept], X.astype(np.float32), rtol=1e-6, atol=1e-7)


def test_a_pipeline_of_every_step_in_a_row():
    pipeline = [
        {"name": "adults", "op": "filter", "params": {"column": "age", "op": ">", "value": 40}},
        {"name": "logs", "op": "log1p", "params": {"columns": ["kappa"]}},
        {"name": "fill", "op": "impute", "params": {"strategy": "median"}},
        {"name": "cap", "op": "clip", "params": {"columns": ["dose"], "high": 8}},
        {"name": "enc", "op": "encode", "params": {"columns": ["sex", "site"], "categories": AGREED}},
        {"name": "no_north", "op": "drop", "params": {"columns": ["site=north"]}},
        {"name": "scaled", "op": "scale", "params": {"method": "standard"}},
    ]
    X, rows, features, kept, _ = _run(pipeline)
    assert rows.tolist() == [1, 2, 3]  # the first record has no age and the last is 30
    np.testing.assert_allclose(features[kept], X.astype(np.float32), rtol=1e-6, atol=1e-7)


def test_what_the_graph_cannot_express_is_named():
    pipeline = [
        {"name": "fill", "op": "impute", "params": {"strategy": "constant", "value": 0, "columns": ["dose"]}},
        {"name": "codes", "op": "encode", "params": {"columns": ["dose"], "categories": {"dose": ["0", "1"]}}},
    ]
    steps = [dict(s) for s in pipeline]
    fitted = [{"columns": {"dose": {"fill": 0.0}}}, {"categories": {"dose": ["0", "1"]}}]
    with pytest.raises(
        InvalidParameterError, match=r"step 'fill' \(impute\): takes column 'dose' as a number, and another"
    ):
        pipeline_model(steps, fitted, ["dose=0"], None, opset=17, ml_opset=3, ir_version=8)
    with pytest.raises(InvalidParameterError, match=r"step 'gone' \(select\): column 'kappa' is not there"):
        pipeline_model(
            [
                {"name": "d", "op": "drop", "params": {"columns": ["kappa"]}},
                {"name": "gone", "op": "select", "params": {"columns": ["kappa"]}},
            ],
            [{}, {}],
            ["kappa"],
            None,
            opset=17,
            ml_opset=3,
            ir_version=8,
        )
    with pytest.raises(InvalidParameterError, match="no fitted mean and standard deviation for column 'age'"):
        pipeline_model(
            [{"name": "s", "op": "scale", "params": {"method": "standard", "columns": ["age"]}}],
            [{"columns": {}}],
            ["age"],
            None,
            opset=17,
            ml_opset=3,
            ir_version=8,
        )


def test_new_records_are_scaled_by_the_bounds_training_used():
    pipeline = STEPS["scale_bounds"] + [FINISH[0], FINISH[1]]
    fl = FLData.create({"a": {"dataset": "records", "test_fraction": 0.0}}, "death", pipeline)
    provisioned = fl.provision("a", _table(TRAIN))
    again, _ = transform(fl.pipeline, fl.label, provisioned.fitted, _table(TRAIN), provisioned.feature_names)
    np.testing.assert_allclose(again, provisioned.X)
    assert again[:, provisioned.feature_names.index("dose")].max() == pytest.approx(0.9)  # 9 in [0, 10]
