"""A party's table (named columns of equal length) and the checks a catalog entry's fields go through."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from confide.errors import InvalidParameterError

_DATASET_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
MAX_COLUMN_NAME = 256
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
            if not isinstance(name, str) or not 1 <= len(name) <= MAX_COLUMN_NAME:
                raise InvalidParameterError(
                    f"Table column names must be str of 1..{MAX_COLUMN_NAME} characters, got {name!r}"
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


def entry_keys(where: str, entry: Mapping[str, Any], required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    """Refuse keys of ``entry`` outside ``required`` + ``optional``, and missing required ones."""
    for key in entry:
        if key not in required and key not in optional:
            allowed = ", ".join(sorted((*required, *optional)))
            raise InvalidParameterError(f"{where}: unknown key {key!r}; allowed keys: {allowed}")
    for key in required:
        if key not in entry:
            raise InvalidParameterError(f"{where}.{key} is required")


def real_in(
    where: str, value: Any, low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> float:
    """``value`` as a finite float in [low, high] (either end open when asked)."""
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


def text_value(where: str, value: Any, max_len: int = 4096) -> str:
    """``value`` as a str of at most ``max_len`` characters."""
    if not isinstance(value, str) or len(value) > max_len:
        raise InvalidParameterError(f"{where} must be a str of at most {max_len} characters, got {value!r}")
    return value


def check_dataset_name(where: str, name: Any) -> str:
    """``name`` if it is 1..64 characters of ``[a-z0-9_-]``, else :class:`InvalidParameterError`."""
    if not isinstance(name, str) or not _DATASET_NAME.match(name):
        raise InvalidParameterError(f"{where} must be 1..64 characters of [a-z0-9_-], got {name!r}")
    return name
