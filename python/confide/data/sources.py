"""Where a dataset's rows come from: each catalog entry checked, and one loader per source.

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
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from confide._checks import check_int
from confide.data.table import MAX_COLUMN_NAME, Table, entry_keys, real_in, text_value
from confide.errors import InvalidParameterError

#: Cells read as missing in a CSV unless the catalog entry lists its own ``missing`` markers.
MISSING_MARKERS = ("", "NA", "N/A", "n/a", "NaN", "nan", "NULL", "null", "None")
#: Delimiters a CSV's dialect is detected among (``delimiter: auto``, the default).
DELIMITERS = (",", ";", "\t", "|")
_MAX_SYNTHETIC_FEATURES = 10_000
_MAX_SYNTHETIC_ENTRIES = 100_000_000


# ---------------------------------------------------------------------- sources


_COMMON = ("source", "description")


def parse_entry(name: str, entry: Any, base_dir: Path) -> dict[str, Any]:
    """One catalog entry checked (keys, ranges, paths resolved against ``base_dir``), in canonical form."""
    where = f"datasets.{name}"
    if not isinstance(entry, Mapping):
        raise InvalidParameterError(f"{where} must be a mapping, got {type(entry).__name__}")
    if "source" not in entry:
        raise InvalidParameterError(f"{where}.source is required ({', '.join(SOURCES)})")
    source = entry["source"]
    spec: dict[str, Any] = {
        "source": source,
        "description": text_value(f"{where}.description", entry.get("description", "")),
    }
    if source in ("breast_cancer", "digits"):
        entry_keys(where, entry, ("shard", "of"), (*_COMMON, "split", "skew", "test_fraction", "seed"))
        spec["of"] = check_int(f"{where}.of", entry["of"], 2, 50)
        spec["shard"] = check_int(f"{where}.shard", entry["shard"], 0, spec["of"] - 1)
        split = entry.get("split", "iid")
        if split not in ("iid", "label_skew"):
            raise InvalidParameterError(f"{where}.split must be 'iid' or 'label_skew', got {split!r}")
        spec["split"] = split
        spec["skew"] = real_in(f"{where}.skew", entry.get("skew", 0.8), 0.5, 1.0, high_open=True)
        spec["test_fraction"] = real_in(
            f"{where}.test_fraction", entry.get("test_fraction", 0.2), 0.0, 0.5, low_open=True
        )
        spec["seed"] = check_int(f"{where}.seed", entry.get("seed", 0), 0)
    elif source == "synthetic":
        entry_keys(
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
        spec["alpha"] = real_in(f"{where}.alpha", entry.get("alpha", 1.0), 0.0, 1e6)
        spec["beta"] = real_in(f"{where}.beta", entry.get("beta", 1.0), 0.0, 1e6)
        spec["seed"] = check_int(f"{where}.seed", entry.get("seed", 0), 0)
        spec["test_fraction"] = real_in(f"{where}.test_fraction", entry.get("test_fraction", 0.1), 0.0, 0.5)
    elif source in ("parquet", "npz", "images"):
        optional = {"parquet": ("partitioned",), "npz": (), "images": ("size", "mode")}[source]
        entry_keys(where, entry, ("path",), (*_COMMON, *optional))
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
        entry_keys(where, entry, ("path",), (*_COMMON, "delimiter", "missing", "encoding"))
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


def from_arrow(where: str, table: Any) -> Table:
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


def _csv_layout(name: str, spec: Mapping[str, Any]) -> tuple[str, Path, str, str, list[str]]:
    """``(where, path, encoding, delimiter, header)`` of a CSV entry, its header checked."""
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
        if not 1 <= len(h) <= MAX_COLUMN_NAME:
            raise InvalidParameterError(
                f"{where}: header names must be 1..{MAX_COLUMN_NAME} characters (column {number + 1} is not)"
            )
        if h in seen:
            raise InvalidParameterError(f"{where}: duplicate column {h!r} in the header")
        seen.add(h)
    return where, path, encoding, delimiter, header


def _csv_options(
    spec: Mapping[str, Any],
    header: list[str],
    encoding: str,
    delimiter: str,
    invalid: Callable[[Any], str],
    *,
    column_types: dict | None = None,
    block_size: int | None = None,
) -> dict[str, Any]:
    """The read, parse and convert options of pyarrow for a CSV entry (header given, missing markers null)."""
    import pyarrow.csv as pacsv

    read = pacsv.ReadOptions(column_names=header, skip_rows=1, encoding=encoding)
    if block_size is not None:
        read.block_size = block_size
    return {
        "read_options": read,
        "parse_options": pacsv.ParseOptions(delimiter=delimiter, invalid_row_handler=invalid),
        "convert_options": pacsv.ConvertOptions(
            strings_can_be_null=True,
            null_values=list(spec.get("missing", MISSING_MARKERS)),
            column_types=column_types or {},
        ),
    }


def _load_csv(name: str, spec: Mapping[str, Any]) -> Table:
    """Read with pyarrow: a header row, then cells; numbers become float, missing markers missing.

    Error messages name the file, the row number and the column, never a cell's value (they may
    travel to the developer in a failure report).
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    where, path, encoding, delimiter, header = _csv_layout(name, spec)
    bad: list[Any] = []

    def invalid(row: Any) -> str:
        bad.append(row)
        return "error"

    try:
        table = pacsv.read_csv(path, **_csv_options(spec, header, encoding, delimiter, invalid))
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as e:
        raise _csv_error(where, path, delimiter, header, encoding, bad, e) from None
    return from_arrow(where, table)


def _csv_error(where, path, delimiter, header, encoding, bad, error) -> InvalidParameterError:
    if bad:
        row = bad[0]
        return InvalidParameterError(
            f"{where}: a data row has {row.actual_columns} cells, the header has {row.expected_columns}"
            f"{_row_number(path, delimiter, len(header), encoding)}"
        )
    # pyarrow's message may quote a row: say only what kind of problem it is.
    return InvalidParameterError(f"{where}: cannot read the file ({type(error).__name__})")


def iter_records(
    entry: Mapping[str, Any], columns: set[str], text_columns: set[str], block_bytes: int = 8 << 20
) -> Iterator[Table]:
    """A CSV or Parquet entry (:func:`parse_entry`'s form) as tables of consecutive rows, one block at a time.

    What ``confide model predict --stream`` reads: memory holds one block (about ``block_bytes``
    of CSV, or one Parquet row group), never the file, and only the file's ``columns`` among
    those named. In a CSV, those in ``text_columns`` are read as text and the others as numbers in
    every block, so that no block guesses a column's type differently from the one before (a cell
    that is not a number in a numeric column is an error naming the column).
    """
    import pyarrow as pa

    if entry["source"] == "parquet":
        import pyarrow.parquet as pq

        where = f"records ({entry['path'].name})"
        try:
            data = pq.ParquetFile(entry["path"])
            wanted = [name for name in data.schema_arrow.names if name in columns]
            for batch in data.iter_batches(columns=wanted):
                yield from_arrow(where, pa.Table.from_batches([batch]))
        except (pa.ArrowException, OSError) as e:
            raise InvalidParameterError(f"{where}: cannot read the Parquet data: {e}") from None
        return
    import pyarrow.csv as pacsv

    where, path, encoding, delimiter, header = _csv_layout("records", entry)
    bad: list[Any] = []

    def invalid(row: Any) -> str:
        bad.append(row)
        return "error"

    wanted = [name for name in header if name in columns]
    types = {name: pa.string() if name in text_columns else pa.float64() for name in wanted}
    options = _csv_options(entry, header, encoding, delimiter, invalid, column_types=types, block_size=block_bytes)
    options["convert_options"].include_columns = wanted
    try:
        with pacsv.open_csv(path, **options) as reader:
            for batch in reader:
                yield from_arrow(where, pa.Table.from_batches([batch]))
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as e:
        if not bad and "conversion error" in str(e).lower():
            # pyarrow's message quotes the cell: name only the column (#i counts the file's columns)
            found = re.search(r"column #(\d+)", str(e))
            column = header[int(found.group(1))] if found and int(found.group(1)) < len(header) else None
            raise InvalidParameterError(
                f"{where}: a cell of column {column!r} is not a number, and the model reads that column as one"
                if column
                else f"{where}: a cell is not a number where the model reads one"
            ) from None
        raise _csv_error(where, path, delimiter, header, encoding, bad, e) from None


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
    return from_arrow(where, table)


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


#: Each source's loader: (dataset name, its checked catalog entry) -> Table. A new source is a
#: loader here and its keys in :func:`parse_entry`.
LOADERS: dict[str, Callable[[str, Mapping[str, Any]], Table]] = {
    "breast_cancer": _load_breast_cancer,
    "digits": lambda name, spec: _load_digits(spec),
    "synthetic": lambda name, spec: _load_synthetic(spec),
    "csv": _load_csv,
    "parquet": _load_parquet,
    "npz": _load_npz,
    "images": _load_images,
}
#: Where a dataset's rows may come from.
SOURCES = tuple(LOADERS)


def load_table(name: str, spec: Mapping[str, Any]) -> Table:
    """The table of a dataset from its checked catalog entry (:func:`parse_entry`)."""
    return LOADERS[spec["source"]](name, spec)
