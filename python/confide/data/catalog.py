"""A party's local datasets: named column tables whose rows never leave the party.

A :class:`Catalog` says which datasets one party holds and where each comes from; it is
described by a small YAML or JSON document::

    datasets:
      breast-cancer: {source: breast_cancer, shard: 0, of: 3, split: iid, skew: 0.8, seed: 0}
      synthetic:     {source: synthetic, shard: 0, of: 3, samples: 1000, features: 20, seed: 0}
      visits:        {source: csv, path: visits.csv}   # relative to the catalog file's directory

Tables are built lazily, on first use, and cached. :meth:`Catalog.metadata` gives what may
leave the party: names, schemas, row counts, descriptions and source kinds, never values.

Sources
-------
``breast_cancer``
    The raw (unscaled) 30 feature columns of scikit-learn's Wisconsin diagnostic breast cancer
    data (names with spaces replaced by ``_``, e.g. ``mean_radius``) and the int column
    ``diagnosis`` (0 = malignant, 1 = benign), restricted to the training rows that
    :func:`~confide.data.breast_cancer_federation` deals to party ``shard`` of ``of``, with
    the same ``split``, ``skew``, ``test_fraction`` and ``seed``. Min-max scaling these
    columns with :func:`~confide.data.breast_cancer_feature_ranges` (clipped to [0, 1]) gives
    exactly that function's ``parts[shard]``; this is checked every time the table is built.
``synthetic``
    The dense training rows of :func:`~confide.data.synthetic_lr` for party ``shard`` of
    ``of``, as float columns ``x0`` .. ``x{d-1}`` and the int column ``label``.
``digits``
    scikit-learn's digits images dealt as :func:`~confide.data.digits_federation` deals them to
    party ``shard`` of ``of``: 64 pixel columns ``p0`` .. ``p63`` (row-major, in [0, 1]) and the int
    column ``digit``. A network restores the image with a ``Reshape`` layer to ``[8, 8, 1]``.
``csv``
    A comma separated file with a header row, read by pyarrow. A numeric column becomes float
    (an empty cell is NaN); any other column is str (an empty cell is missing, ``None``).
``parquet``
    A Parquet file or a directory of partitioned Parquet files, read by pyarrow; numeric
    columns become float, string columns str. With ``partitioned: true`` the directory is never
    read into one process: each file is a partition that the party's compute engine reads and
    holds where it runs (:mod:`confide.compute`); the catalog's metadata is built one file at a
    time.
``npz``
    A numpy archive with arrays ``x`` (n, ...) and ``y`` (n,): ``x`` flattened into float
    columns ``x0`` .. (C order), ``y`` as the int column ``label``.
``images``
    A folder with one sub-folder per class (the class is the index of its name in sorted
    order); every image file is read with Pillow, converted to ``mode`` (``L`` or ``RGB``),
    resized to ``size: [height, width]`` (default [32, 32]) and scaled to [0, 1], giving pixel
    columns ``p0`` .. (row, column, channel order) and the int column ``label``.

Image datasets are tables of pixel columns, so FL_Data provisions them like any table (lineage,
grants, schema checks at submit) and a Keras network reshapes the row back into an image.
"""

from __future__ import annotations

import codecs
import csv
import json
import math
import numbers
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from confide._checks import check_int
from confide.errors import InvalidParameterError

__all__ = ["Catalog", "Table", "column_profiles"]

#: Cells read as missing in a CSV unless the catalog entry lists its own ``missing`` markers.
MISSING_MARKERS = ("", "NA", "N/A", "n/a", "NaN", "nan", "NULL", "null", "None")
#: Delimiters a CSV's dialect is detected among (``delimiter: auto``, the default).
DELIMITERS = (",", ";", "\t", "|")
#: A str column's categories are published only when it has at most this many distinct values,
#: each in at least MIN_CATEGORY_ROWS rows (rarer values stay at the party: an encoding treats
#: them as unknown).
MAX_PUBLISHED_CATEGORIES = 64
MIN_CATEGORY_ROWS = 5
#: Where a dataset's rows may come from.
SOURCES = ("breast_cancer", "digits", "synthetic", "csv", "parquet", "npz", "images")
_DATASET_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
_MAX_COLUMN_NAME = 256
_MAX_SYNTHETIC_FEATURES = 10_000
_MAX_SYNTHETIC_ENTRIES = 100_000_000


# ---------------------------------------------------------------------- Table


def _column_kind(arr: np.ndarray) -> str:
    if arr.dtype.kind == "f":
        return "float"
    if arr.dtype.kind in "iu":
        return "int"
    return "str"


class Table:
    """Named columns of equal length: float64 (NaN = missing), int64 or str (``None`` = missing).

    Parameters
    ----------
    columns : mapping of str to array-like
        At least one column. Float arrays become float64, int and bool arrays int64, str and
        object arrays object arrays of ``str`` (``None`` or NaN cells become ``None``). The
        arrays are copied and made read-only.

    Raises
    ------
    InvalidParameterError
        No columns, a bad column name, a column that is not 1-D, of another dtype, or of
        another length than the first.
    """

    __slots__ = ("_columns", "_rows")

    def __init__(self, columns: Mapping[str, Any]) -> None:
        if not isinstance(columns, Mapping) or not columns:
            raise InvalidParameterError("Table columns must be a non-empty mapping of name to array")
        out: dict[str, np.ndarray] = {}
        rows: int | None = None
        for name, values in columns.items():
            if not isinstance(name, str) or not 1 <= len(name) <= _MAX_COLUMN_NAME:
                raise InvalidParameterError(
                    f"Table column names must be str of 1..{_MAX_COLUMN_NAME} characters, got {name!r}"
                )
            arr = _as_column(name, values)
            if rows is None:
                rows = arr.shape[0]
            elif arr.shape[0] != rows:
                raise InvalidParameterError(
                    f"Table column {name!r} has {arr.shape[0]} rows, expected {rows} "
                    "(all columns must have the same length)"
                )
            out[name] = arr
        self._columns = out
        self._rows = int(rows or 0)

    @property
    def rows(self) -> int:
        """Number of rows."""
        return self._rows

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """A new dict of the (read-only) column arrays, in table order."""
        return dict(self._columns)

    @property
    def names(self) -> list[str]:
        """Column names, in order."""
        return list(self._columns)

    def column(self, name: str) -> np.ndarray:
        """The read-only array of column ``name``."""
        try:
            return self._columns[name]
        except KeyError:
            raise InvalidParameterError(f"Table has no column {name!r}; columns: {self.names}") from None

    def schema(self) -> list[dict[str, str]]:
        """``[{"name": ..., "dtype": "float" | "int" | "str"}, ...]`` in column order."""
        return [{"name": n, "dtype": _column_kind(a)} for n, a in self._columns.items()]

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return f"Table(rows={self._rows}, columns={len(self._columns)})"


def _as_column(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InvalidParameterError(f"Table column {name!r} must be 1-D, got shape {arr.shape}")
    kind = arr.dtype.kind
    if kind == "f":
        out = arr.astype(np.float64, copy=True)
    elif kind in "iub":
        out = arr.astype(np.int64, copy=True)
    elif kind in "USO":
        out = np.empty(arr.shape[0], dtype=object)
        for i, v in enumerate(arr.tolist()):
            if v is None or (isinstance(v, float) and math.isnan(v)):
                out[i] = None
            elif isinstance(v, bytes):
                out[i] = v.decode("utf-8", errors="replace")
            elif isinstance(v, str):
                out[i] = v
            else:
                raise InvalidParameterError(
                    f"Table column {name!r}: object cells must be str or None, got {type(v).__name__} at row {i}"
                )
    else:
        raise InvalidParameterError(f"Table column {name!r}: dtype {arr.dtype} is not float, int or str")
    out.flags.writeable = False
    return out


# ---------------------------------------------------------------------- validation helpers


def _keys(where: str, entry: Mapping[str, Any], required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    for key in entry:
        if key not in required and key not in optional:
            allowed = ", ".join(sorted((*required, *optional)))
            raise InvalidParameterError(f"{where}: unknown key {key!r}; allowed keys: {allowed}")
    for key in required:
        if key not in entry:
            raise InvalidParameterError(f"{where}.{key} is required")


def _real(where: str, value: Any, low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise InvalidParameterError(f"{where} must be a finite real number, got {value!r}")
    value = float(value)
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        raise InvalidParameterError(
            f"{where} must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}, got {value}"
        )
    return value


def _str(where: str, value: Any, max_len: int = 4096) -> str:
    if not isinstance(value, str) or len(value) > max_len:
        raise InvalidParameterError(f"{where} must be a str of at most {max_len} characters, got {value!r}")
    return value


def check_dataset_name(where: str, name: Any) -> str:
    """``name`` if it is 1..64 characters of ``[a-z0-9_-]``, else :class:`InvalidParameterError`."""
    if not isinstance(name, str) or not _DATASET_NAME.match(name):
        raise InvalidParameterError(f"{where} must be 1..64 characters of [a-z0-9_-], got {name!r}")
    return name


# ---------------------------------------------------------------------- sources


_COMMON = ("source", "description")


def _parse_entry(name: str, entry: Any, base_dir: Path) -> dict[str, Any]:
    where = f"datasets.{name}"
    if not isinstance(entry, Mapping):
        raise InvalidParameterError(f"{where} must be a mapping, got {type(entry).__name__}")
    if "source" not in entry:
        raise InvalidParameterError(f"{where}.source is required ({', '.join(SOURCES)})")
    source = entry["source"]
    spec: dict[str, Any] = {"source": source, "description": _str(f"{where}.description", entry.get("description", ""))}
    if source in ("breast_cancer", "digits"):
        _keys(where, entry, ("shard", "of"), (*_COMMON, "split", "skew", "test_fraction", "seed"))
        spec["of"] = check_int(f"{where}.of", entry["of"], 2, 50)
        spec["shard"] = check_int(f"{where}.shard", entry["shard"], 0, spec["of"] - 1)
        split = entry.get("split", "iid")
        if split not in ("iid", "label_skew"):
            raise InvalidParameterError(f"{where}.split must be 'iid' or 'label_skew', got {split!r}")
        spec["split"] = split
        spec["skew"] = _real(f"{where}.skew", entry.get("skew", 0.8), 0.5, 1.0, high_open=True)
        spec["test_fraction"] = _real(
            f"{where}.test_fraction", entry.get("test_fraction", 0.2), 0.0, 0.5, low_open=True
        )
        spec["seed"] = check_int(f"{where}.seed", entry.get("seed", 0), 0)
    elif source == "synthetic":
        _keys(
            where,
            entry,
            ("shard", "of", "samples", "features"),
            (*_COMMON, "alpha", "beta", "seed", "test_fraction"),
        )
        spec["of"] = check_int(f"{where}.of", entry["of"], 1, 100_000)
        spec["shard"] = check_int(f"{where}.shard", entry["shard"], 0, spec["of"] - 1)
        spec["features"] = check_int(f"{where}.features", entry["features"], 1, _MAX_SYNTHETIC_FEATURES)
        spec["samples"] = check_int(f"{where}.samples", entry["samples"], 10 * spec["of"], 1_000_000_000)
        if (spec["samples"] // spec["of"] + spec["of"]) * spec["features"] > _MAX_SYNTHETIC_ENTRIES:
            raise InvalidParameterError(
                f"{where}: samples // of * features must be <= {_MAX_SYNTHETIC_ENTRIES}, got "
                f"{spec['samples'] // spec['of']} * {spec['features']}"
            )
        spec["alpha"] = _real(f"{where}.alpha", entry.get("alpha", 1.0), 0.0, 1e6)
        spec["beta"] = _real(f"{where}.beta", entry.get("beta", 1.0), 0.0, 1e6)
        spec["seed"] = check_int(f"{where}.seed", entry.get("seed", 0), 0)
        spec["test_fraction"] = _real(f"{where}.test_fraction", entry.get("test_fraction", 0.1), 0.0, 0.5)
    elif source in ("parquet", "npz", "images"):
        optional = {"parquet": ("partitioned",), "npz": (), "images": ("size", "mode")}[source]
        _keys(where, entry, ("path",), (*_COMMON, *optional))
        spec["path"] = _path(where, entry["path"], base_dir, directory=source in ("parquet", "images"))
        if source == "parquet":
            partitioned = entry.get("partitioned", False)
            if not isinstance(partitioned, bool):
                raise InvalidParameterError(f"{where}.partitioned must be true or false, got {partitioned!r}")
            spec["partitioned"] = partitioned
        if source == "images":
            size = entry.get("size", [32, 32])
            if not (
                isinstance(size, list | tuple)
                and len(size) == 2
                and all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 4096 for d in size)
            ):
                raise InvalidParameterError(f"{where}.size must be [height, width] in 1..4096, got {size!r}")
            mode = entry.get("mode", "L")
            if mode not in ("L", "RGB"):
                raise InvalidParameterError(f"{where}.mode must be 'L' (grey) or 'RGB', got {mode!r}")
            spec["size"], spec["mode"] = tuple(size), mode
    elif source == "csv":
        _keys(where, entry, ("path",), (*_COMMON, "delimiter", "missing", "encoding"))
        spec["path"] = _path(where, entry["path"], base_dir)
        delimiter = entry.get("delimiter", "auto")
        if delimiter != "auto" and (not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '\r\n"'):
            raise InvalidParameterError(
                f"{where}.delimiter must be 'auto' or one character (not a quote or newline), got {delimiter!r}"
            )
        spec["delimiter"] = delimiter
        missing = entry.get("missing", list(MISSING_MARKERS))
        if isinstance(missing, str) or not isinstance(missing, list | tuple) or len(missing) > 64:
            raise InvalidParameterError(f"{where}.missing must be a list of at most 64 strings, got {missing!r}")
        if not all(isinstance(m, str) and len(m) <= 64 for m in missing):
            raise InvalidParameterError(f"{where}.missing: every marker must be a string of at most 64 characters")
        spec["missing"] = list(missing)
        encoding = entry.get("encoding", "utf-8")
        try:
            codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise InvalidParameterError(f"{where}.encoding: unknown text encoding {encoding!r}") from None
        spec["encoding"] = encoding
    else:
        raise InvalidParameterError(f"{where}.source must be one of {', '.join(SOURCES)}, got {source!r}")
    return spec


def _path(where: str, raw: Any, base_dir: Path, *, directory: bool = False) -> Path:
    if not isinstance(raw, str) or not raw:
        raise InvalidParameterError(f"{where}.path must be a non-empty str, got {raw!r}")
    path = Path(raw)
    if not path.is_absolute():
        path = base_dir / path
    if not (path.is_file() or (directory and path.is_dir())):
        raise InvalidParameterError(f"{where}.path: no such file {str(path)!r}")
    return path


def _load_breast_cancer(name: str, spec: Mapping[str, Any]) -> Table:
    from confide.data import datasets

    # Validates the arguments (label_skew limits included) and deals the rows: this party's
    # shard is exactly its part of breast_cancer_federation, served raw (unscaled).
    fed = datasets.breast_cancer_federation(
        spec["of"], split=spec["split"], skew=spec["skew"], test_fraction=spec["test_fraction"], seed=spec["seed"]
    )
    data = datasets._load_breast_cancer()
    raw = np.asarray(data.data, dtype=np.float64)
    y = np.asarray(data.target, dtype=np.int64)
    rows = fed.part_rows[spec["shard"]]
    columns = {str(f).replace(" ", "_"): raw[rows, j] for j, f in enumerate(data.feature_names)}
    columns["diagnosis"] = y[rows]
    return Table(columns)


def _load_synthetic(spec: Mapping[str, Any]) -> Table:
    from confide.data.datasets import synthetic_lr

    X, y, _, _ = synthetic_lr(
        spec["shard"],
        spec["of"],
        samples=spec["samples"],
        features=spec["features"],
        alpha=spec["alpha"],
        beta=spec["beta"],
        seed=spec["seed"],
        test_fraction=spec["test_fraction"],
    )
    X = np.asarray(X, dtype=np.float64)
    columns: dict[str, Any] = {f"x{j}": X[:, j] for j in range(X.shape[1])}
    columns["label"] = np.asarray(y, dtype=np.int64)
    return Table(columns)


def _from_arrow(where: str, table: Any) -> Table:
    """A :class:`Table` from a pyarrow table: numeric columns float64 (null -> NaN), others str."""
    import pyarrow as pa

    columns: dict[str, Any] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_null, pa.types.is_boolean)
        if any(test(kind) for test in numeric):
            values = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
            columns[name] = np.where(np.isnan(values), np.nan, values) if values.size else values.astype(np.float64)
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind):
            cells = column.cast(pa.string()).to_pylist() if not pa.types.is_dictionary(kind) else column.to_pylist()
            col = np.empty(len(cells), dtype=object)
            col[:] = [None if c is None or not str(c).strip() else str(c).strip() for c in cells]
            columns[name] = col
        else:
            raise InvalidParameterError(f"{where}: column {name!r} has type {kind}, not a number or a string")
    return Table(columns)


def _sniff_delimiter(where: str, path: Path, encoding: str) -> str:
    """The delimiter of the header line among DELIMITERS, or an error naming the catalog key."""
    try:
        with path.open(newline="", encoding=encoding) as f:
            sample = f.read(65536)
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidParameterError(f"{where}: cannot read the file ({type(e).__name__}); check encoding") from None
    header = sample.splitlines()[0] if sample.splitlines() else ""
    try:
        return csv.Sniffer().sniff(sample, delimiters="".join(DELIMITERS)).delimiter
    except csv.Error:
        pass
    counts = {d: header.count(d) for d in DELIMITERS}
    best = max(counts, key=counts.get)
    if counts[best] == 0:
        return ","  # one column
    if sorted(counts.values())[-2] == counts[best]:
        raise InvalidParameterError(
            f"{where}: cannot tell the delimiter (the header has as many of {sorted(d for d in counts if counts[d])}); "
            "set 'delimiter' in the catalog entry"
        )
    return best


def _load_csv(name: str, spec: Mapping[str, Any]) -> Table:
    """Read with pyarrow: a header row, then cells; numbers become float, missing markers missing.

    Error messages name the file, the row number and the column, never a cell's value (they may
    travel to the developer in a failure report).
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path: Path = spec["path"]
    where = f"datasets.{name} ({path.name})"
    encoding = spec.get("encoding", "utf-8")
    delimiter = spec["delimiter"]
    if delimiter == "auto":
        delimiter = _sniff_delimiter(where, path, encoding)
    try:
        with path.open(newline="", encoding=encoding) as f:
            first = next(csv.reader(f, delimiter=delimiter), None)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InvalidParameterError(f"{where}: cannot read the file ({type(e).__name__}); check encoding") from None
    if not first:
        raise InvalidParameterError(f"{where}: the file is empty, a header row is required")
    header = [h.strip().lstrip("\ufeff") for h in first]
    if len(header) == 1:
        other = [d for d in DELIMITERS if d != delimiter and d in header[0]]
        if other:
            raise InvalidParameterError(
                f"{where}: the header is one column containing {other[0]!r}; the file looks {other[0]!r}-separated, "
                f"not {delimiter!r}: set 'delimiter: \"{other[0]}\"' (or 'auto') in the catalog entry"
            )
    seen: set[str] = set()
    for number, h in enumerate(header):
        if not 1 <= len(h) <= _MAX_COLUMN_NAME:
            raise InvalidParameterError(
                f"{where}: header names must be 1..{_MAX_COLUMN_NAME} characters (column {number + 1} is not)"
            )
        if h in seen:
            raise InvalidParameterError(f"{where}: duplicate column {h!r} in the header")
        seen.add(h)
    bad: list[Any] = []

    def invalid(row: Any) -> str:
        bad.append(row)
        return "error"

    markers = list(spec.get("missing", MISSING_MARKERS))
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=header, skip_rows=1, encoding=encoding),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, invalid_row_handler=invalid),
            convert_options=pacsv.ConvertOptions(strings_can_be_null=True, null_values=markers),
        )
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as e:
        if bad:
            row = bad[0]
            raise InvalidParameterError(
                f"{where}: a data row has {row.actual_columns} cells, the header has {row.expected_columns}"
                f"{_row_number(path, delimiter, len(header), encoding)}"
            ) from None
        # pyarrow's message may quote a row: say only what kind of problem it is.
        raise InvalidParameterError(f"{where}: cannot read the file ({type(e).__name__})") from None
    return _from_arrow(where, table)


def _row_number(path: Path, delimiter: str, width: int, encoding: str = "utf-8") -> str:
    """`` (data row i)`` of the first row whose cell count differs (error path only)."""
    with path.open(newline="", encoding=encoding) as f:
        rows = [row for row in csv.reader(f, delimiter=delimiter) if row][1:]
    for i, row in enumerate(rows):
        if len(row) != width:
            return f" (data row {i + 1})"
    return ""


def _load_parquet(name: str, spec: Mapping[str, Any]) -> Table:
    """A Parquet file (or a directory of partitioned files) through pyarrow, read where it lives."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = f"datasets.{name} ({spec['path'].name})"
    try:
        table = pq.read_table(spec["path"])
    except (pa.ArrowException, OSError) as e:
        raise InvalidParameterError(f"{where}: cannot read the Parquet data: {e}") from None
    return _from_arrow(where, table)


def _tensor_columns(X: np.ndarray, y: np.ndarray, prefix: str) -> Table:
    flat = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
    columns: dict[str, Any] = {f"{prefix}{j}": flat[:, j] for j in range(flat.shape[1])}
    columns["label"] = np.asarray(y, dtype=np.int64)
    return Table(columns)


def _load_npz(name: str, spec: Mapping[str, Any]) -> Table:
    """Arrays ``x`` (n, ...) and ``y`` (n,) of an ``.npz``: ``x`` flattened into ``x0..``, ``y`` as ``label``."""
    where = f"datasets.{name} ({spec['path'].name})"
    try:
        with np.load(spec["path"], allow_pickle=False) as npz:
            if "x" not in npz.files or "y" not in npz.files:
                raise InvalidParameterError(f"{where}: needs arrays 'x' and 'y', has {sorted(npz.files)}")
            X, y = npz["x"], npz["y"]
    except (OSError, ValueError) as e:
        raise InvalidParameterError(f"{where}: cannot read the archive: {e}") from None
    if X.ndim < 2 or y.shape != (len(X),) or X.dtype.kind not in "biuf" or y.dtype.kind not in "biu":
        raise InvalidParameterError(
            f"{where}: x must be numeric (n, ...) and y integer (n,), got x {X.shape} {X.dtype}, y {y.shape} {y.dtype}"
        )
    return _tensor_columns(X, y, "x")


def _load_images(name: str, spec: Mapping[str, Any]) -> Table:
    """A folder with one sub-folder per class of images (PNG, JPEG, ...), read with Pillow.

    Classes are the sub-folder names in sorted order (``label`` is the index); every image is
    converted to ``mode`` (L: grey, RGB) and resized to ``size`` (height, width); pixels scaled to
    [0, 1] become columns ``p0..`` in (row, column, channel) order.
    """
    from PIL import Image, UnidentifiedImageError

    root: Path = spec["path"]
    where = f"datasets.{name} ({root.name})"
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise InvalidParameterError(f"{where}: needs one sub-folder per class, found none")
    height, width = spec["size"]
    images, labels = [], []
    for label, folder in enumerate(classes):
        for file in sorted((root / folder).iterdir()):
            if not file.is_file() or file.name.startswith("."):
                continue
            try:
                with Image.open(file) as image:
                    pixels = np.asarray(image.convert(spec["mode"]).resize((width, height)), dtype=np.float64)
            except (UnidentifiedImageError, OSError) as e:
                raise InvalidParameterError(f"{where}: {folder}/{file.name} is not a readable image: {e}") from None
            images.append(pixels / 255.0)
            labels.append(label)
    if not images:
        raise InvalidParameterError(f"{where}: the class folders hold no images")
    return _tensor_columns(np.stack(images), np.array(labels), "p")


def _load_digits(spec: Mapping[str, Any]) -> Table:
    from confide.data.datasets import digits_federation

    fed = digits_federation(
        spec["of"], split=spec["split"], skew=spec["skew"], test_fraction=spec["test_fraction"], seed=spec["seed"]
    )
    X, y = fed.parts[spec["shard"]]
    table = _tensor_columns(X, y, "p")
    columns = table.columns
    columns["digit"] = columns.pop("label")
    return Table(columns)


# ---------------------------------------------------------------------- Catalog


class Catalog:
    """The datasets one party holds; see the module docstring for the format.

    Build one with :meth:`from_mapping` or :meth:`load`. Entries are validated when the
    catalog is built; tables are built on first use and cached.
    """

    __slots__ = ("_specs", "_tables")

    def __init__(self, specs: Mapping[str, dict[str, Any]]) -> None:
        self._specs = dict(specs)
        self._tables: dict[str, Table] = {}

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], base_dir: str | Path | None = None) -> Catalog:
        """Validate ``{"datasets": {name: entry, ...}}``; relative csv paths resolve against ``base_dir``.

        ``base_dir`` defaults to the current directory.

        Raises
        ------
        InvalidParameterError
            The message names the offending key (``datasets.<name>.<key>``) and its limit.
        """
        if not isinstance(mapping, Mapping):
            raise InvalidParameterError(
                f"catalog must be a mapping with a 'datasets' key, got {type(mapping).__name__}"
            )
        _keys("catalog", mapping, ("datasets",), ())
        datasets = mapping["datasets"]
        if not isinstance(datasets, Mapping):
            raise InvalidParameterError(f"datasets must be a mapping of name to entry, got {type(datasets).__name__}")
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        specs = {}
        for name, entry in datasets.items():
            check_dataset_name("dataset name", name)
            specs[name] = _parse_entry(name, entry, base)
        return cls(specs)

    @classmethod
    def load(cls, path: str | Path) -> Catalog:
        """Read a YAML (or, for ``.json`` files, JSON) catalog; csv paths are relative to its directory."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidParameterError(f"catalog {str(path)!r}: cannot read the file: {e}") from None
        try:
            if path.suffix.lower() == ".json":
                mapping = json.loads(text)
            else:
                import yaml

                mapping = yaml.safe_load(text)
        except ValueError as e:  # json.JSONDecodeError
            raise InvalidParameterError(f"catalog {str(path)!r}: not valid JSON: {e}") from None
        except Exception as e:  # yaml.YAMLError
            raise InvalidParameterError(f"catalog {str(path)!r}: not valid YAML: {e}") from None
        return cls.from_mapping(mapping, base_dir=path.resolve().parent)

    @property
    def names(self) -> list[str]:
        """Dataset names, sorted."""
        return sorted(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Catalog({self.names})"

    def table(self, name: str) -> Table:
        """The table of dataset ``name`` (built on first use, then cached)."""
        if name not in self._specs:
            raise InvalidParameterError(f"dataset {name!r} is not in the catalog; available: {self.names}")
        table = self._tables.get(name)
        if table is None:
            spec = self._specs[name]
            if spec.get("partitioned"):
                raise InvalidParameterError(
                    f"dataset {name!r} is partitioned: it is read one partition at a time by the party's "
                    "compute engine, never as one table"
                )
            loaders = {
                "breast_cancer": lambda: _load_breast_cancer(name, spec),
                "digits": lambda: _load_digits(spec),
                "synthetic": lambda: _load_synthetic(spec),
                "csv": lambda: _load_csv(name, spec),
                "parquet": lambda: _load_parquet(name, spec),
                "npz": lambda: _load_npz(name, spec),
                "images": lambda: _load_images(name, spec),
            }
            table = loaders[spec["source"]]()
            self._tables[name] = table
        return table

    def partitions(self, name: str) -> list | None:
        """The partitions of dataset ``name`` (``parquet`` with ``partitioned: true``); None for any other."""
        if name not in self._specs:
            raise InvalidParameterError(f"dataset {name!r} is not in the catalog; available: {self.names}")
        spec = self._specs[name]
        if not spec.get("partitioned"):
            return None
        from confide.data.partitions import list_partitions

        return list_partitions(spec["path"], f"datasets.{name}")

    def metadata(self) -> list[dict[str, Any]]:
        """What may leave the party: ``[{"name", "schema", "rows", "description", "source"}, ...]``.

        Sorted by name. ``schema`` is :func:`column_profiles`: names, dtypes, whether a column has
        missing cells, and the categories of low-cardinality text columns. No row, no file path.
        """
        out = []
        for name in self.names:
            spec = self._specs[name]
            partitions = self.partitions(name)
            if partitions is None:
                table = self.table(name)
                schema, rows = column_profiles(table), table.rows
            else:
                schema = _partitioned_profiles(name, partitions)
                rows = sum(p.rows for p in partitions)
            out.append(
                {
                    "name": name,
                    "schema": schema,
                    "rows": rows,
                    "description": spec["description"],
                    "source": spec["source"],
                }
            )
        return out


def table_from_arrow(where: str, table: Any) -> Table:
    """A :class:`Table` from a pyarrow table (numeric columns float, string columns str)."""
    return _from_arrow(where, table)


def _partitioned_profiles(name: str, partitions: list) -> list[dict[str, Any]]:
    """:func:`column_profiles` of a partitioned dataset, reading one file at a time.

    Missing cells are flagged if any file has them; categories count the rows of every file (a
    column with more than MAX_PUBLISHED_CATEGORIES distinct values stops being counted, so an id
    column never fills memory). Every file must hold the same columns with the same types.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    profiles: dict[str, dict[str, Any]] = {}
    first_seen: dict[str, int] = {}
    counts: dict[str, dict[str, int] | None] = {}
    for partition in partitions:
        where = f"datasets.{name}, partition {partition.index} ({Path(partition.path).name})"
        try:
            table = _from_arrow(where, pq.read_table(partition.path))
        except (pa.ArrowException, OSError) as e:
            raise InvalidParameterError(f"{where}: cannot read the Parquet data: {e}") from None
        if profiles and set(table.names) != set(profiles):
            missing, extra = sorted(set(profiles) - set(table.names)), sorted(set(table.names) - set(profiles))
            raise InvalidParameterError(
                f"{where}: every file must hold the same columns; this one lacks {missing[:5]} and adds {extra[:5]}"
            )
        for column in table.schema():
            values = table.column(column["name"])
            known = profiles.setdefault(column["name"], {**column, "missing": False})
            first_seen.setdefault(column["name"], partition.index)
            if known["dtype"] != column["dtype"]:
                raise InvalidParameterError(
                    f"{where}: column {column['name']!r} is {column['dtype']} here and {known['dtype']} in "
                    f"partition {first_seen[column['name']]}; every file must hold the same columns"
                )
            if column["dtype"] == "float":
                known["missing"] |= bool(np.isnan(values).any())
            elif column["dtype"] == "str":
                known["missing"] |= any(v is None for v in values)
                tally = counts.setdefault(column["name"], {})
                if tally is None:
                    continue
                for value in values:
                    if value is not None:
                        tally[str(value)] = tally.get(str(value), 0) + 1
                if len(tally) > MAX_PUBLISHED_CATEGORIES:
                    counts[column["name"]] = None  # too many to publish: stop counting
    for column, tally in counts.items():
        if tally is not None:
            profiles[column]["categories"] = sorted(
                v for v, k in tally.items() if k >= MIN_CATEGORY_ROWS and len(v) <= 128
            )
    return list(profiles.values())


def column_profiles(table: Table) -> list[dict[str, Any]]:
    """What a party publishes about each column of ``table``.

    Per column: ``name``, ``dtype``, ``missing`` (has missing cells) and, for a str column with at
    most MAX_PUBLISHED_CATEGORIES distinct values, ``categories``: the values found in at least
    MIN_CATEGORY_ROWS rows, sorted (what lets parties agree on an encoding without exchanging rows).
    """
    out = []
    for column in table.schema():
        values = table.column(column["name"])
        if column["dtype"] == "float":
            missing = bool(np.isnan(values).any())
        else:
            missing = column["dtype"] == "str" and any(v is None for v in values)
        profile: dict[str, Any] = {**column, "missing": missing}
        if column["dtype"] == "str":
            present = [v for v in values if v is not None]
            names, counts = (
                np.unique(np.array(present, dtype=object).astype(str), return_counts=True) if present else ([], [])
            )
            if len(names) <= MAX_PUBLISHED_CATEGORIES:
                profile["categories"] = sorted(
                    str(n) for n, k in zip(names, counts, strict=True) if k >= MIN_CATEGORY_ROWS and len(str(n)) <= 128
                )
        out.append(profile)
    return out
