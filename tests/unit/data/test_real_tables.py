"""Real tables: missing-value markers, CSV dialects, categorical encodings, fitted statistics, schema checks."""

from __future__ import annotations

import numpy as np
import pytest

from confide.data.catalog import Catalog, Table, column_profiles
from confide.data.fldata import FLData, transform
from confide.data.schemas import agree_categories, check_schemas
from confide.errors import DataProblemError, InvalidParameterError

ROWS = [
    ("age", "sex", "kappa", "death"),
    ("61", "F", "1.2", "0"),
    ("NA", "M", "NULL", "1"),
    ("70", "M", "0.9", "0"),
    ("55", "F", "", "1"),
    ("48", "F", "1.7", "0"),
    ("80", "M", "2.1", "1"),
]


def _csv(tmp_path, rows=ROWS, delimiter=",", name="t.csv"):
    path = tmp_path / name
    path.write_text("\n".join(delimiter.join(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _catalog(tmp_path, **entry):
    return Catalog.from_mapping({"datasets": {"records": {"source": "csv", **entry}}}, base_dir=tmp_path)


def test_common_missing_markers_are_missing_not_text(tmp_path):
    _csv(tmp_path)
    table = _catalog(tmp_path, path="t.csv").table("records")
    assert [c["dtype"] for c in table.schema()] == ["float", "str", "float", "float"]
    assert (
        np.isnan(table.column("age")[1]) and np.isnan(table.column("kappa")[1]) and np.isnan(table.column("kappa")[3])
    )


def test_own_missing_markers(tmp_path):
    rows = [("a", "b"), ("1", "?"), ("2", "3")]
    _csv(tmp_path, rows)
    assert _catalog(tmp_path, path="t.csv").table("records").schema()[1]["dtype"] == "str"
    table = _catalog(tmp_path, path="t.csv", missing=["?"]).table("records")
    assert table.schema()[1]["dtype"] == "float" and np.isnan(table.column("b")[0])


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_the_delimiter_is_detected(tmp_path, delimiter):
    _csv(tmp_path, delimiter=delimiter)
    table = _catalog(tmp_path, path="t.csv").table("records")
    assert table.names == ["age", "sex", "kappa", "death"] and table.rows == 6


def test_a_wrong_explicit_delimiter_is_a_clear_error(tmp_path):
    _csv(tmp_path, delimiter=";")
    with pytest.raises(InvalidParameterError, match="looks ';'-separated.*set 'delimiter"):
        _catalog(tmp_path, path="t.csv", delimiter=",").table("records")


def test_read_errors_name_the_row_never_its_values(tmp_path):
    rows = [*ROWS[:3], ("secret-value-1", "secret-value-2"), *ROWS[3:]]
    _csv(tmp_path, rows)
    with pytest.raises(InvalidParameterError) as raised:
        _catalog(tmp_path, path="t.csv").table("records")
    assert "data row 3" in str(raised.value) and "secret" not in str(raised.value)


def test_profiles_publish_categories_of_frequent_values_only():
    sex = np.array(["F"] * 6 + ["M"] * 5 + ["X"] * 2 + [None], dtype=object)
    names = np.array([f"patient {i}" for i in range(14)], dtype=object)
    table = Table({"sex": sex, "name": names, "age": np.arange(14.0)})
    profiles = {p["name"]: p for p in column_profiles(table)}
    assert profiles["sex"] == {"name": "sex", "dtype": "str", "missing": True, "categories": ["F", "M"]}
    assert profiles["name"]["categories"] == []  # every value rarer than 5 rows: none published
    assert profiles["age"] == {"name": "age", "dtype": "float", "missing": False}


def _fl(pipeline, parties=("a", "b")):
    return FLData.create({p: {"dataset": "records", "test_fraction": 0.0} for p in parties}, "death", pipeline)


def _table(tmp_path):
    _csv(tmp_path)
    return _catalog(tmp_path, path="t.csv").table("records")


def test_onehot_and_ordinal_encodings(tmp_path):
    table = _table(tmp_path)
    onehot = _fl(
        [
            {"name": "enc", "op": "encode", "params": {"columns": ["sex"], "categories": {"sex": ["F", "M", "U"]}}},
            {"name": "fill", "op": "impute", "params": {"strategy": "median"}},
        ]
    ).provision("a", table)
    assert onehot.feature_names == ["age", "sex=F", "sex=M", "sex=U", "kappa"]
    assert onehot.X[:, 1].tolist() == [1, 0, 0, 1, 1, 0] and onehot.X[:, 3].tolist() == [0] * 6
    ordinal = _fl(
        [
            {
                "name": "enc",
                "op": "encode",
                "params": {"columns": ["sex"], "method": "ordinal", "categories": {"sex": ["M", "F"]}},
            },
            {"name": "fill", "op": "impute", "params": {"strategy": "mean"}},
        ]
    ).provision("a", table)
    assert ordinal.X[:, 1].tolist() == [1, 0, 0, 1, 1, 0]


def test_encode_without_agreed_categories_names_the_way_out(tmp_path):
    with pytest.raises(DataProblemError, match="categories of column 'sex' are not agreed") as raised:
        _fl([{"name": "enc", "op": "encode", "params": {"columns": ["sex"]}}]).provision("a", _table(tmp_path))
    assert raised.value.step == "enc"


def test_transform_reproduces_training_with_the_fitted_statistics(tmp_path):
    table = _table(tmp_path)
    fl = _fl(
        [
            {"name": "enc", "op": "encode", "params": {"columns": ["sex"], "categories": {"sex": ["F", "M"]}}},
            {"name": "fill", "op": "impute", "params": {"strategy": "median"}},
            {"name": "scaled", "op": "scale", "params": {"method": "standard"}},
        ]
    )
    provisioned = fl.provision("a", table)
    fill = provisioned.fitted[1]["columns"]
    assert fill["age"]["fill"] == 61.0 and set(provisioned.fitted[2]["columns"]) == set(provisioned.feature_names)
    X, rows = transform(fl.pipeline, fl.label, provisioned.fitted, table, provisioned.feature_names)
    np.testing.assert_allclose(X, provisioned.X)
    assert rows.tolist() == list(range(6))
    # New records: one row alone is prepared with the training statistics, not its own.
    one = Table({"age": np.array([np.nan]), "sex": np.array(["M"], dtype=object), "kappa": np.array([1.2])})
    X1, _ = transform(fl.pipeline, fl.label, provisioned.fitted, one, provisioned.feature_names)
    age = provisioned.fitted[2]["columns"]["age"]
    assert X1[0][0] == pytest.approx((61.0 - age["mean"]) / age["std"])


def test_schema_check_follows_the_pipeline():
    schema = [
        {"name": "age", "dtype": "float", "missing": True},
        {"name": "sex", "dtype": "str", "missing": False, "categories": ["F", "M"]},
        {"name": "death", "dtype": "int", "missing": False},
    ]
    bare = _fl([])
    texts = [p.text() for p in check_schemas(bare, {"a": schema})]
    assert sorted(texts) == [
        "a/records: column 'age' has missing values and no step imputes them; add an impute step (or a notnull filter)",
        "a/records: column 'sex' is text; add an encode step for it, or drop it",
    ]
    fixed = agree_categories(
        _fl(
            [
                {"name": "enc", "op": "encode", "params": {"columns": ["sex"]}},
                {"name": "fill", "op": "impute", "params": {"strategy": "mean"}},
            ]
        ),
        {"a": schema, "b": schema},
    )
    assert check_schemas(fixed, {"a": schema, "b": schema}) == []
    assert fixed.pipeline[0].params["categories"] == {"sex": ["F", "M"]}
    assert fixed.lineage()[-1]["operation"] == "pipeline_substitute"


def test_new_records_outside_what_training_saw_are_counted_never_shown(tmp_path):
    from confide.data.flsteps import raw_ranges, record_warnings

    table = _table(tmp_path)
    fl = _fl(
        [
            {"name": "enc", "op": "encode", "params": {"columns": ["sex"], "categories": {"sex": ["F", "M"]}}},
            {"name": "fill", "op": "impute", "params": {"strategy": "median"}},
        ]
    )
    provisioned = fl.provision("a", table)
    assert provisioned.ranges == raw_ranges(table, "death") == {"age": [48.0, 80.0], "kappa": [0.9, 2.1]}
    steps = [s.to_dict() for s in fl.pipeline]
    new = Table(
        {
            "age": np.array([30.0, 60.0, np.nan, 99.0]),
            "sex": np.array(["F", "x", None, "M"], dtype=object),
            "kappa": np.array([1.0, 1.0, 5.0, 1.0]),
        }
    )
    warnings = record_warnings(steps, provisioned.fitted, provisioned.ranges, new)
    assert warnings == [
        "column 'sex': 1 record(s) hold a category the model never saw (known: 2); "
        "they score as none of the categories",
        "column 'age': 2 record(s) outside the training range (1 below, 1 above); the model extrapolates there",
        "column 'kappa': 1 record(s) outside the training range (0 below, 1 above); the model extrapolates there",
    ]
    assert record_warnings(steps, provisioned.fitted, None, new)[1:] == []  # an artifact without ranges


def test_a_record_id_left_among_the_features_is_called_an_id_not_a_category():
    schema = [
        {"name": "patient", "dtype": "str", "missing": False},  # no categories: too many distinct values
        {"name": "sex", "dtype": "str", "missing": False, "categories": ["F", "M"]},
        {"name": "death", "dtype": "int", "missing": False},
    ]
    texts = sorted(p.text() for p in check_schemas(_fl([]), {"a": schema}))
    assert texts[0].startswith("a/records: column 'patient' is text; it holds too many distinct values to encode")
    assert "drop it, or, in a vertical job, name it as the id" in texts[0]
    assert texts[1] == "a/records: column 'sex' is text; add an encode step for it, or drop it"
    rows = 80
    table = Table(
        {
            "patient": np.array([f"P-{i:04d}" for i in range(rows)], dtype=object),
            "age": np.arange(rows, dtype=np.float64),
            "death": np.arange(rows, dtype=np.float64) % 2,
        }
    )
    with pytest.raises(DataProblemError, match="feature column 'patient' is text") as raised:
        _fl([]).provision("a", table)
    assert "too many distinct values to encode (a record id or free text)" in raised.value.hint
