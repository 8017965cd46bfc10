"""FL_Data for vertical jobs: each party's columns, record ids out of the pipeline, steps where their columns are."""

from __future__ import annotations

import numpy as np
import pytest

from confide.data import FLData, Table
from confide.data.fldata import localize_step
from confide.data.schemas import check_schemas
from confide.errors import DataProblemError, InvalidParameterError
from confide.spec import parse_job

PIPELINE = [
    {"name": "site", "op": "encode", "params": {"columns": ["site"], "categories": {"site": ["a", "b"]}}},
    {"name": "adults", "op": "filter", "params": {"column": "age", "op": ">=", "value": 18}},
    {"name": "fill", "op": "impute", "params": {"strategy": "median"}},
]


def fl_data(pipeline=PIPELINE) -> FLData:
    return FLData.create({"clinic": "visits", "lab": "panel"}, label="outcome", pipeline=pipeline)


def clinic_table() -> Table:
    return Table(
        {
            "id": np.array(["p1", "p2", "p3", "p4"], dtype=object),
            "outcome": np.array([0, 1, 1, 0]),
            "site": np.array(["a", "b", "a", "b"], dtype=object),
            "age": np.array([30.0, 12.0, 50.0, np.nan]),
        }
    )


def lab_table() -> Table:
    return Table({"id": np.array([4, 3, 9]), "crp": np.array([1.0, np.nan, 3.0]), "wbc": np.array([5.0, 6.0, 7.0])})


def test_the_guest_gets_ids_label_and_its_localized_steps():
    rows = fl_data().provision_columns("clinic", clinic_table(), id_column="id", with_label=True)
    # the filter keeps age >= 18 (NaN fails it); the ids follow the rows the steps keep
    assert rows.ids.tolist() == ["p1", "p3"]
    assert rows.feature_names == ["site=a", "site=b", "age"]
    assert rows.X.tolist() == [[1.0, 0.0, 30.0], [1.0, 0.0, 50.0]]
    assert rows.y.tolist() == [0.0, 1.0]


def test_a_host_runs_only_the_steps_on_its_columns_and_has_no_label():
    rows = fl_data().provision_columns("lab", lab_table(), id_column="id", with_label=False)
    assert rows.ids.dtype == np.int64 and rows.ids.tolist() == [4, 3, 9]  # the id is never imputed or scaled
    assert rows.y is None
    assert rows.feature_names == ["crp", "wbc"]
    assert rows.X[:, 0].tolist() == [1.0, 2.0, 3.0]  # the lab's own median fills its gap


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (np.array([1.0, 2.5, 3.0]), "integers or text"),
        (np.array([1, 1, 2]), "repeats ids"),
        (np.array(["x", None, "z"], dtype=object), "missing ids"),
        (np.array([1.0, np.nan, 3.0]), "missing ids"),
    ],
)
def test_bad_record_ids_name_the_column(ids, message):
    table = Table({"key": ids, "crp": np.array([1.0, 2.0, 3.0])})
    with pytest.raises(DataProblemError, match=f"party 'lab': id column 'key'.*{message}"):
        fl_data([]).provision_columns("lab", table, id_column="key", with_label=False)


def test_missing_id_or_label_column_and_nan_features_are_named():
    with pytest.raises(DataProblemError, match="id column 'mrn' is not in the table"):
        fl_data([]).provision_columns("lab", lab_table(), id_column="mrn", with_label=False)
    with pytest.raises(DataProblemError, match="label column 'outcome' is not in the table"):
        fl_data([]).provision_columns("lab", lab_table(), id_column="id", with_label=True)
    with pytest.raises(DataProblemError, match="feature column 'crp' has 1 missing values"):
        fl_data([]).provision_columns("lab", lab_table(), id_column="id", with_label=False)


def test_localize_step_restricts_lists_and_bounds():
    step = FLData.create({"a": "d"}, "y", [{"name": "s", "op": "scale", "params": {
        "method": "minmax", "columns": ["u", "v"], "bounds": {"u": [0, 1], "v": [0, 2]}}}]).pipeline[0]  # fmt: skip
    local = localize_step(step, {"v", "w"})
    assert local.params == {"method": "minmax", "columns": ["v"], "bounds": {"v": [0.0, 2.0]}}
    assert localize_step(step, {"w"}) is None
    assert localize_step(step, {"u", "v"}) is step


SCHEMAS = {
    "clinic": [
        {"name": "id", "dtype": "str"},
        {"name": "outcome", "dtype": "int"},
        {"name": "site", "dtype": "str", "categories": ["a", "b"]},
        {"name": "age", "dtype": "float", "missing": True},
    ],
    "lab": [{"name": "id", "dtype": "int"}, {"name": "crp", "dtype": "float", "missing": True}],
}


def test_schema_check_of_a_vertical_job():
    assert check_schemas(fl_data(), SCHEMAS, vertical=("clinic", "id")) == []
    # horizontally, the lab would lack the label and the site column
    assert {p.column for p in check_schemas(fl_data(), SCHEMAS)} >= {"outcome", "site"}
    typo = fl_data([{"name": "fill", "op": "impute", "params": {"strategy": "median", "columns": ["cpr"]}}])
    problems = [p.text() for p in check_schemas(typo, SCHEMAS, vertical=("clinic", "id"))]
    assert any("'cpr' is held by no party" in t for t in problems), problems
    problems = [p.text() for p in check_schemas(fl_data(), SCHEMAS, vertical=("lab", "id"))]
    assert any("lab/panel: fl_data.label: column 'outcome' is not in the dataset" in t for t in problems), problems
    problems = [p.text() for p in check_schemas(fl_data(), SCHEMAS, vertical=("clinic", "mrn"))]
    assert sum("column 'mrn' is not in the dataset" in t for t in problems) == 2


def vertical_job(**extra) -> dict:
    return {
        "job_id": "v",
        "parties": ["clinic", "lab"],
        "model": {"algorithm": "secureboost"},
        "fl_data": fl_data().to_dict(),
        "protection": {"mode": "paillier"},
        **extra,
    }


def test_a_vertical_job_over_fl_data_names_its_id_column():
    job = vertical_job()
    with pytest.raises(InvalidParameterError, match="data.id_column"):
        parse_job(job)
    spec = parse_job({**job, "data": {"guest": "clinic", "id_column": "id"}})
    assert spec.vertical_layout() == ("clinic", "id")


def test_the_psi_join_is_the_last_step_of_a_vertical_jobs_fl_data():
    job = vertical_job(data={"guest": "clinic", "id_column": "id"})
    spec = parse_job(job)
    joined = spec.fl_data_object()
    # One more lineage entry: the session's FL_Data says how its rows were aligned.
    assert joined.version == fl_data().version + 1
    assert joined.lineage()[-1]["operation"] == "pipeline_shaping"
    assert joined.pipeline[-1].to_dict() == {
        "name": "psi-join",
        "op": "join",
        "params": {"by": "id", "protocol": "ecdh-psi-ristretto255"},
    }
    assert joined.join_column == "id"
    # Idempotent: re-parsing the stored specification adds nothing.
    again = parse_job(spec.model_dump(mode="json"))
    assert again.fl_data_object().version == joined.version
    # The join alone names the id column; the two must agree when both are given.
    assert parse_job({**job, "fl_data": joined.to_dict(), "data": {"guest": "clinic"}}).data.id_column == "id"
    with pytest.raises(InvalidParameterError, match="data.id_column 'mrn' differs from the fl_data join's by 'id'"):
        parse_job({**job, "fl_data": joined.to_dict(), "data": {"guest": "clinic", "id_column": "mrn"}})
    # Provisioning skips it (PSI runs it, together), and checks it against the job's id column.
    rows = joined.provision_columns("clinic", clinic_table(), id_column="id", with_label=True)
    assert rows.ids.tolist() == ["p1", "p3"] and len(rows.fitted) == len(joined.pipeline)
    with pytest.raises(InvalidParameterError, match="joins by 'id' but the job's id column is 'mrn'"):
        joined.provision_columns("clinic", clinic_table(), id_column="mrn", with_label=True)
    assert check_schemas(joined, SCHEMAS, vertical=("clinic", "id")) == []


def test_join_steps_are_checked():
    join = {"name": "j", "op": "join", "params": {"by": "id"}}
    with pytest.raises(InvalidParameterError, match="as the last step"):
        fl_data([join, *PIPELINE])
    with pytest.raises(InvalidParameterError, match="as the last step"):
        fl_data([*PIPELINE, join, {**join, "name": "k"}])
    with pytest.raises(InvalidParameterError, match="by must not be the label"):
        fl_data([{"name": "j", "op": "join", "params": {"by": "outcome"}}])
    with pytest.raises(InvalidParameterError, match="protocol must be 'ecdh-psi-ristretto255'"):
        fl_data([{"name": "j", "op": "join", "params": {"by": "id", "protocol": "plain"}}])
    with pytest.raises(InvalidParameterError, match=r"step 'j'.*by"):
        fl_data([{"name": "j", "op": "join", "params": {}}])
    joined = fl_data([*PIPELINE, join])
    # A horizontal job cannot hold one, at submit or at a party.
    horizontal = {"job_id": "h", "fl_data": joined.to_dict(), "protection": {"mode": "secagg"}}
    with pytest.raises(InvalidParameterError, match=r"step 'j' \(join\) aligns the records of a vertical job"):
        parse_job(horizontal)
    with pytest.raises(InvalidParameterError, match="a horizontal job's FL_Data cannot hold one"):
        joined.provision("clinic", clinic_table())
    assert localize_step(joined.pipeline[-1], {"id"}) is None
