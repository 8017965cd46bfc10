import json

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from confide.data import Catalog, Table, breast_cancer_feature_ranges, breast_cancer_federation, synthetic_lr
from confide.errors import InvalidParameterError

# ---------------------------------------------------------------------- Table


def test_table_dtypes_schema_and_read_only():
    t = Table(
        {
            "a": np.array([1.5, np.nan], dtype=np.float32),
            "b": [1, 2],
            "flag": np.array([True, False]),
            "s": np.array(["x", None], dtype=object),
            "u": np.array(["p", "q"]),
        }
    )
    assert t.rows == 2 and len(t) == 2
    assert t.schema() == [
        {"name": "a", "dtype": "float"},
        {"name": "b", "dtype": "int"},
        {"name": "flag", "dtype": "int"},
        {"name": "s", "dtype": "str"},
        {"name": "u", "dtype": "str"},
    ]
    assert t.column("a").dtype == np.float64 and np.isnan(t.column("a")[1])
    assert t.column("s")[1] is None and t.column("u")[0] == "p"
    with pytest.raises(ValueError):
        t.column("a")[0] = 3.0
    with pytest.raises(InvalidParameterError, match="no column 'zz'"):
        t.column("zz")
    assert "rows=2" in repr(t)


@pytest.mark.parametrize(
    "columns, match",
    [
        ({}, "non-empty mapping"),
        ({"a": [1, 2], "b": [1]}, "column 'b' has 1 rows, expected 2"),
        ({"a": [[1, 2]]}, "column 'a' must be 1-D"),
        ({"": [1]}, "column names"),
        ({"a": np.array([1 + 2j])}, "column 'a': dtype complex128"),
        ({"a": np.array([1, "x"], dtype=object)}, "column 'a': object cells must be str or None"),
    ],
)
def test_table_errors(columns, match):
    with pytest.raises(InvalidParameterError, match=match):
        Table(columns)


# ---------------------------------------------------------------------- breast cancer


@pytest.mark.parametrize(
    "of, split, seed",
    [(3, "iid", 0), (2, "iid", 5), (4, "label_skew", 3), (3, "label_skew", 1)],
)
def test_breast_cancer_shard_equals_federation_part(of, split, seed):
    fed = breast_cancer_federation(of, split=split, skew=0.7, seed=seed)
    names, lo, hi = breast_cancer_feature_ranges()
    entries = {
        f"s{i}": {"source": "breast_cancer", "shard": i, "of": of, "split": split, "skew": 0.7, "seed": seed}
        for i in range(of)
    }
    cat = Catalog.from_mapping({"datasets": entries})
    for i in range(of):
        t = cat.table(f"s{i}")
        assert t.names == [n.replace(" ", "_") for n in names] + ["diagnosis"]
        assert t.schema()[0] == {"name": "mean_radius", "dtype": "float"}
        assert t.schema()[-1] == {"name": "diagnosis", "dtype": "int"}
        raw = np.column_stack([t.column(n.replace(" ", "_")) for n in names])
        X, y = fed.parts[i]
        np.testing.assert_array_equal(np.clip((raw - lo) / (hi - lo), 0.0, 1.0), X)
        np.testing.assert_array_equal(t.column("diagnosis"), y)
    # the raw values are the data set's own (unscaled) rows
    data = load_breast_cancer()
    assert {r.tobytes() for r in raw} <= {r.tobytes() for r in np.asarray(data.data, dtype=np.float64)}


def test_breast_cancer_label_skew_limit_is_reported():
    cat = Catalog.from_mapping(
        {"datasets": {"bc": {"source": "breast_cancer", "shard": 0, "of": 50, "split": "label_skew"}}}
    )
    with pytest.raises(InvalidParameterError, match="parties must be <="):
        cat.table("bc")


# ---------------------------------------------------------------------- synthetic and csv


def test_synthetic_source_matches_generator():
    cat = Catalog.from_mapping(
        {"datasets": {"syn": {"source": "synthetic", "shard": 1, "of": 3, "samples": 300, "features": 4, "seed": 2}}}
    )
    t = cat.table("syn")
    X, y, _, _ = synthetic_lr(1, 3, samples=300, features=4, seed=2)
    assert t.names == ["x0", "x1", "x2", "x3", "label"]
    np.testing.assert_array_equal(np.column_stack([t.column(f"x{j}") for j in range(4)]), X.astype(np.float64))
    np.testing.assert_array_equal(t.column("label"), y)


def test_csv_source_types_missing_and_relative_path(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "visits.csv").write_text(
        "age, city ,visits,empty\n34,Paris,3,\n,Lyon,1.5,\n51,,2,\n\n", encoding="utf-8"
    )
    (tmp_path / "catalog.yaml").write_text(
        "datasets:\n  visits: {source: csv, path: data/visits.csv, description: clinic visits}\n", encoding="utf-8"
    )
    cat = Catalog.load(tmp_path / "catalog.yaml")
    t = cat.table("visits")
    assert t.schema() == [
        {"name": "age", "dtype": "float"},
        {"name": "city", "dtype": "str"},
        {"name": "visits", "dtype": "float"},
        {"name": "empty", "dtype": "float"},
    ]
    assert t.rows == 3
    np.testing.assert_array_equal(t.column("age"), [34.0, np.nan, 51.0])
    assert list(t.column("city")) == ["Paris", "Lyon", None]
    assert np.isnan(t.column("empty")).all()
    assert cat.table("visits") is t  # cached


def test_csv_errors(tmp_path):
    def table(text, name="f.csv"):
        (tmp_path / name).write_text(text, encoding="utf-8")
        return Catalog.from_mapping({"datasets": {"f": {"source": "csv", "path": name}}}, base_dir=tmp_path).table("f")

    with pytest.raises(InvalidParameterError, match="empty, a header row is required"):
        table("")
    with pytest.raises(InvalidParameterError, match="duplicate column 'a'"):
        table("a,a\n1,2\n")
    with pytest.raises(InvalidParameterError, match="has 1 cells, the header has 2 \\(data row 2\\)"):
        table("a,b\n1,2\n3\n")
    with pytest.raises(InvalidParameterError, match=r"datasets.f.path: no such file"):
        Catalog.from_mapping({"datasets": {"f": {"source": "csv", "path": "missing.csv"}}}, base_dir=tmp_path)


def test_load_json_and_all_sources(tmp_path):
    (tmp_path / "v.csv").write_text("x,label\n1,0\n2,1\n", encoding="utf-8")
    spec = {
        "datasets": {
            "breast-cancer": {"source": "breast_cancer", "shard": 0, "of": 3, "description": "bc shard"},
            "synthetic": {"source": "synthetic", "shard": 0, "of": 3, "samples": 60, "features": 3},
            "visits": {"source": "csv", "path": "v.csv"},
        }
    }
    (tmp_path / "cat.json").write_text(json.dumps(spec), encoding="utf-8")
    cat = Catalog.load(tmp_path / "cat.json")
    assert cat.names == ["breast-cancer", "synthetic", "visits"] and len(cat) == 3 and "visits" in cat
    assert cat._tables == {}  # lazy: nothing built yet
    meta = cat.metadata()
    assert [m["name"] for m in meta] == cat.names
    assert [m["source"] for m in meta] == ["breast_cancer", "synthetic", "csv"]
    assert meta[0]["description"] == "bc shard" and meta[0]["rows"] == cat.table("breast-cancer").rows
    assert meta[2] == {
        "name": "visits",
        "schema": [
            {"name": "x", "dtype": "float", "missing": False},
            {"name": "label", "dtype": "float", "missing": False},
        ],
        "rows": 2,
        "description": "",
        "source": "csv",
    }


def test_metadata_has_no_values_and_no_paths(tmp_path):
    (tmp_path / "secret.csv").write_text("name,score\nalice-smith,98765.4321\n", encoding="utf-8")
    cat = Catalog.from_mapping({"datasets": {"p": {"source": "csv", "path": "secret.csv"}}}, base_dir=tmp_path)
    meta = cat.metadata()
    text = json.dumps(meta)
    assert "alice" not in text and "98765" not in text and "secret" not in text
    assert set(meta[0]) == {"name", "schema", "rows", "description", "source"}


@pytest.mark.parametrize(
    "mapping, match",
    [
        ([], "catalog must be a mapping"),
        ({"datasets": {}, "party": "x"}, "catalog: unknown key 'party'"),
        ({}, "catalog.datasets is required"),
        ({"datasets": []}, "datasets must be a mapping"),
        ({"datasets": {"Bad Name": {"source": "csv", "path": "x"}}}, "dataset name must be 1..64 characters"),
        ({"datasets": {"a" * 65: {"source": "csv"}}}, "dataset name must be 1..64"),
        ({"datasets": {"d": "csv"}}, "datasets.d must be a mapping"),
        ({"datasets": {"d": {"shard": 0}}}, "datasets.d.source is required"),
        ({"datasets": {"d": {"source": "sql"}}}, "datasets.d.source must be"),
        ({"datasets": {"d": {"source": "breast_cancer", "shard": 0, "of": 3, "colour": 1}}}, "unknown key 'colour'"),
        ({"datasets": {"d": {"source": "breast_cancer", "of": 3}}}, "datasets.d.shard is required"),
        (
            {"datasets": {"d": {"source": "breast_cancer", "shard": 3, "of": 3}}},
            r"datasets.d.shard must be in \[0, 2\]",
        ),
        ({"datasets": {"d": {"source": "breast_cancer", "shard": 0, "of": 1}}}, r"datasets.d.of must be in \[2, 50\]"),
        (
            {"datasets": {"d": {"source": "breast_cancer", "shard": 0, "of": 3, "split": "x"}}},
            "datasets.d.split must be",
        ),
        (
            {"datasets": {"d": {"source": "breast_cancer", "shard": 0, "of": 3, "skew": 1.0}}},
            r"datasets.d.skew must be in \[0.5, 1.0\)",
        ),
        (
            {"datasets": {"d": {"source": "breast_cancer", "shard": 0, "of": 3, "seed": True}}},
            "datasets.d.seed must be an integer",
        ),
        (
            {"datasets": {"d": {"source": "synthetic", "shard": 0, "of": 3, "samples": 10, "features": 2}}},
            r"datasets.d.samples must be in \[30,",
        ),
        (
            {"datasets": {"d": {"source": "synthetic", "shard": 0, "of": 3, "samples": 30, "features": 0}}},
            r"datasets.d.features must be in \[1, 10000\]",
        ),
        (
            {
                "datasets": {
                    "d": {"source": "synthetic", "shard": 0, "of": 3, "samples": 30, "features": 2, "density": 1}
                }
            },
            "unknown key 'density'",
        ),
        ({"datasets": {"d": {"source": "csv"}}}, "datasets.d.path is required"),
        ({"datasets": {"d": {"source": "csv", "path": ""}}}, "datasets.d.path must be a non-empty str"),
        ({"datasets": {"d": {"source": "csv", "path": "x", "description": 3}}}, "datasets.d.description must be a str"),
    ],
)
def test_catalog_validation_errors_name_the_key(mapping, match):
    with pytest.raises(InvalidParameterError, match=match):
        Catalog.from_mapping(mapping)


def test_unknown_dataset_lists_available():
    cat = Catalog.from_mapping(
        {"datasets": {"syn": {"source": "synthetic", "shard": 0, "of": 1, "samples": 10, "features": 1}}}
    )
    with pytest.raises(InvalidParameterError, match=r"dataset 'nope' is not in the catalog; available: \['syn'\]"):
        cat.table("nope")
    assert repr(cat) == "Catalog(['syn'])"


def test_load_errors(tmp_path):
    with pytest.raises(InvalidParameterError, match="cannot read the file"):
        Catalog.load(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("datasets: [unclosed\n", encoding="utf-8")
    with pytest.raises(InvalidParameterError, match="not valid YAML"):
        Catalog.load(tmp_path / "bad.yaml")
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(InvalidParameterError, match="not valid JSON"):
        Catalog.load(tmp_path / "bad.json")
