"""Catalog sources for the formats hospitals hold: digits, Parquet, .npz, image folders (pyarrow, Pillow)."""

import numpy as np
import pytest

from confide.data import Catalog, digits_federation
from confide.errors import InvalidParameterError


def catalog(tmp_path, **datasets):
    return Catalog.from_mapping({"datasets": datasets}, base_dir=tmp_path)


def test_digits_source_serves_the_federation_shard_as_pixel_columns(tmp_path):
    table = catalog(tmp_path, d={"source": "digits", "shard": 1, "of": 3}).table("d")
    X, y = digits_federation(3).parts[1]
    assert table.names[:2] == ["p0", "p1"] and table.names[-1] == "digit" and len(table.names) == 65
    pixels = np.column_stack([table.column(f"p{j}") for j in range(64)])
    np.testing.assert_array_equal(pixels, X.reshape(len(X), -1).astype(np.float64))
    np.testing.assert_array_equal(table.column("digit"), y)


def test_parquet_file_and_partitioned_directory_through_pyarrow(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = pa.table({"age": [34, None, 51], "city": ["Paris", "Lyon", None], "visits": [3.0, 1.5, 2.0]})
    pq.write_table(data, tmp_path / "visits.parquet")
    (tmp_path / "parts").mkdir()
    pq.write_table(data.slice(0, 2), tmp_path / "parts" / "part-0.parquet")
    pq.write_table(data.slice(2, 1), tmp_path / "parts" / "part-1.parquet")
    cat = catalog(
        tmp_path, one={"source": "parquet", "path": "visits.parquet"}, many={"source": "parquet", "path": "parts"}
    )
    for name in ("one", "many"):
        table = cat.table(name)
        assert table.schema() == [
            {"name": "age", "dtype": "float"},
            {"name": "city", "dtype": "str"},
            {"name": "visits", "dtype": "float"},
        ]
        np.testing.assert_array_equal(table.column("age"), [34.0, np.nan, 51.0])
        assert list(table.column("city")) == ["Paris", "Lyon", None]
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InvalidParameterError, match=r"datasets.b \(broken.parquet\): cannot read the Parquet data"):
        catalog(tmp_path, b={"source": "parquet", "path": "broken.parquet"}).table("b")


def test_npz_arrays_become_feature_columns_and_a_label(tmp_path):
    x = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    np.savez(tmp_path / "scans.npz", x=x, y=np.array([1, 0]))
    table = catalog(tmp_path, s={"source": "npz", "path": "scans.npz"}).table("s")
    assert table.names == [f"x{j}" for j in range(6)] + ["label"]
    np.testing.assert_array_equal(table.column("x5"), x.reshape(2, -1)[:, 5])
    np.savez(tmp_path / "nolabel.npz", x=x)
    with pytest.raises(InvalidParameterError, match=r"needs arrays 'x' and 'y', has \['x'\]"):
        catalog(tmp_path, s={"source": "npz", "path": "nolabel.npz"}).table("s")


def test_image_folder_one_subfolder_per_class(tmp_path):
    from PIL import Image

    for label, shade in (("benign", 30), ("malignant", 220)):
        (tmp_path / "scans" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (16, 12), color=shade + i).save(tmp_path / "scans" / label / f"{i}.png")
    table = catalog(tmp_path, x={"source": "images", "path": "scans", "size": [4, 6]}).table("x")
    assert len(table.names) == 4 * 6 + 1 and table.rows == 6
    np.testing.assert_array_equal(table.column("label"), [0, 0, 0, 1, 1, 1])
    assert table.column("p0")[3] == pytest.approx(220 / 255)
    rgb = catalog(tmp_path, x={"source": "images", "path": "scans", "size": [2, 2], "mode": "RGB"}).table("x")
    assert len(rgb.names) == 2 * 2 * 3 + 1
    (tmp_path / "scans" / "benign" / "notes.txt").write_text("not an image")
    with pytest.raises(InvalidParameterError, match=r"benign/notes.txt is not a readable image"):
        catalog(tmp_path, x={"source": "images", "path": "scans"}).table("x")
    with pytest.raises(InvalidParameterError, match=r"size must be \[height, width\]"):
        catalog(tmp_path, x={"source": "images", "path": "scans", "size": [0, 3]})
    with pytest.raises(InvalidParameterError, match="source must be one of breast_cancer, digits"):
        catalog(tmp_path, x={"source": "dicom", "path": "scans"})
