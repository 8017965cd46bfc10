"""FL_Data's operations: one class per operation, registered by name in :data:`OPERATIONS`.

Each :class:`Operation` knows three things about itself: which parameters it takes
(:meth:`~Operation.check`, run when a :class:`~confide.data.flsteps.Step` is built, returning
them in canonical form), how it changes a party's columns (:meth:`~Operation.apply`, fitting
the statistics it needs on training rows and reusing them on new records), and whether a row's
result depends on that row alone (:meth:`~Operation.row_local`). A new operation is a subclass
added to :data:`OPERATIONS`; nothing else dispatches on the name. The format is described in
``docs/fldata.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from confide._checks import check_real
from confide.errors import DataProblemError, InvalidParameterError

__all__ = [
    "COMPARISONS",
    "ENCODINGS",
    "JOIN_PROTOCOL",
    "MAX_CATEGORIES",
    "OPERATIONS",
    "OPS",
    "ROW",
    "Operation",
    "StepError",
    "ID_HINT",
    "TEXT_HINT",
    "category_text",
    "column_kind",
    "column_name",
    "column_names",
    "keys",
    "missing_mask",
]

#: The record join of a vertical job (its ``join`` step): ECDH private set intersection.
JOIN_PROTOCOL = "ecdh-psi-ristretto255"
ENCODINGS = ("onehot", "ordinal")
#: At most this many categories per encoded column.
MAX_CATEGORIES = 1_000
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
#: A hidden column carrying each row's number in the table through the steps.
ROW = "__row__"
MAX_COLUMN_NAME = 256
MAX_COLUMNS = 10_000


# -- parameter checks --------------------------------------------------------------------------------
def keys(where: str, value: Any, required: Sequence[str], optional: Sequence[str] = ()) -> Mapping[str, Any]:
    """``value`` as a mapping with every ``required`` key and no key outside ``required`` + ``optional``."""
    if not isinstance(value, Mapping):
        raise InvalidParameterError(f"{where} must be a mapping, got {type(value).__name__}")
    for key in value:
        if key not in required and key not in optional:
            allowed = ", ".join(sorted((*required, *optional))) or "none"
            raise InvalidParameterError(f"{where}: unknown key {key!r}; allowed keys: {allowed}")
    for key in required:
        if key not in value:
            raise InvalidParameterError(f"{where}.{key} is required")
    return value


def column_name(where: str, value: Any) -> str:
    """``value`` as a column name (a str of 1..MAX_COLUMN_NAME characters)."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_COLUMN_NAME:
        raise InvalidParameterError(
            f"{where} must be a column name (str of 1..{MAX_COLUMN_NAME} characters), got {value!r}"
        )
    return value


def column_names(where: str, value: Any) -> list[str]:
    """``value`` as a list of 1..MAX_COLUMNS distinct column names."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidParameterError(f"{where} must be a list of column names, got {value!r}")
    if not 1 <= len(value) <= MAX_COLUMNS:
        raise InvalidParameterError(f"{where} must list 1..{MAX_COLUMNS} columns, got {len(value)}")
    out = [column_name(f"{where}[{i}]", v) for i, v in enumerate(value)]
    if len(set(out)) != len(out):
        dup = next(c for c in out if out.count(c) > 1)
        raise InvalidParameterError(f"{where} lists column {dup!r} more than once")
    return out


# -- columns -----------------------------------------------------------------------------------------
def column_kind(arr: np.ndarray) -> str:
    """``float``, ``int`` or ``str``: how a step treats the column."""
    return "float" if arr.dtype.kind == "f" else "int" if arr.dtype.kind in "iu" else "str"


def missing_mask(arr: np.ndarray) -> np.ndarray:
    """Which rows of the column hold no value (NaN or None; an int column has none missing)."""
    if arr.dtype.kind == "f":
        return np.isnan(arr)
    if arr.dtype.kind in "iu":
        return np.zeros(arr.shape[0], dtype=bool)
    return np.array([v is None for v in arr], dtype=bool)


#: What a text feature needs: an encoding, unless it has too many distinct values to encode.
TEXT_HINT = "add an encode step for it, or drop it"
ID_HINT = (
    "it holds too many distinct values to encode (a record id or free text): drop it, or, in a vertical job, "
    "name it as the id the join step matches records on"
)
#: More distinct values than a published profile lists categories for (catalog.MAX_PUBLISHED_CATEGORIES).
ID_LIKE_DISTINCT = 64


def text_hint(distinct: int) -> str:
    """The hint for a text column that reaches a step or the features, by its number of distinct values."""
    return ID_HINT if distinct > ID_LIKE_DISTINCT else TEXT_HINT


def category_text(arr: np.ndarray) -> np.ndarray:
    """A column as the text ``encode`` compares with its categories (None where missing).

    A numeric code column (a stage 1..4) gives its canonical text: ``"3"``, ``"2.5"``.
    """
    if column_kind(arr) == "str":
        return np.array([None if v is None else str(v) for v in arr], dtype=object)
    x = arr.astype(np.float64)
    return np.array([None if np.isnan(v) else (str(int(v)) if v == int(v) else repr(v)) for v in x], dtype=object)


class StepError:
    """Builds a step's :class:`DataProblemError`: party and step named, columns named, never values."""

    def __init__(self, party: str, name: str, op: str) -> None:
        self.where = f"party {party!r}, step {name!r} ({op})"
        self.step = name

    def __call__(self, msg: str, column: str | None = None, hint: str | None = None) -> DataProblemError:
        """The error for ``msg`` about ``column``, with a ``hint`` for the data owner."""
        return DataProblemError(f"{self.where}: {msg}", step=self.step, columns=[column] if column else [], hint=hint)


def _need(err: StepError, cols: dict[str, np.ndarray], names: Sequence[str], numeric: bool) -> None:
    for c in names:
        if c not in cols:
            shown = [n for n in cols if n != ROW]
            raise err(
                f"column {c!r} is not in the table; columns: {shown[:50]}",
                c,
                "check the column name in the job's FL_Data against the dataset's published schema",
            )
        if numeric and column_kind(cols[c]) == "str":
            raise err(
                f"column {c!r} is text, a numeric column is required",
                c,
                "add an encode step before this one, or drop it",
            )


# -- the operations ----------------------------------------------------------------------------------
class Operation:
    """One FL_Data operation. Subclasses set :attr:`name` and implement :meth:`check` and :meth:`apply`."""

    name: ClassVar[str]

    def check(self, where: str, params: Any) -> dict[str, Any]:
        """``params`` validated, in canonical form (numbers as float); errors name ``where``."""
        raise NotImplementedError

    def apply(
        self, err: StepError, p: dict, cols: dict[str, np.ndarray], label: str, fitted: dict | None, record: dict | None
    ) -> dict[str, np.ndarray]:
        """The columns after this step.

        Statistics come from ``fitted`` when given (new records), else from these rows, and are
        written to ``record`` (training).
        """
        raise NotImplementedError

    def row_local(self, p: dict) -> bool:
        """Whether a row's result depends on that row alone (no statistic over all rows)."""
        return True


class Filter(Operation):
    """Keep the rows whose column compares true with a value (or holds any value: ``notnull``)."""

    name = "filter"
    _COMPARE: ClassVar[dict] = {
        "<": np.less,
        "<=": np.less_equal,
        ">": np.greater,
        ">=": np.greater_equal,
        "==": np.equal,
        "!=": np.not_equal,
    }

    def check(self, where, params):
        p = keys(where, params, ("column", "op"), ("value",))
        out: dict[str, Any] = {"column": column_name(f"{where}.column", p["column"]), "op": p["op"]}
        if p["op"] == "notnull":
            if "value" in p:
                raise InvalidParameterError(f"{where}.value must be absent for op 'notnull'")
            return out
        if p["op"] not in COMPARISONS:
            raise InvalidParameterError(
                f"{where}.op must be one of {', '.join(COMPARISONS)} or notnull, got {p['op']!r}"
            )
        if "value" not in p:
            raise InvalidParameterError(f"{where}.value is required for op {p['op']!r}")
        value = p["value"]
        if isinstance(value, str) and p["op"] in ("==", "!="):
            if len(value) > 4096:
                raise InvalidParameterError(f"{where}.value must be at most 4096 characters")
            out["value"] = value
        else:
            out["value"] = check_real(f"{where}.value", value)
        return out

    def apply(self, err, p, cols, label, fitted, record):
        c = p["column"]
        _need(err, cols, [c], numeric=False)
        arr = cols[c]
        missing = missing_mask(arr)
        if p["op"] == "notnull":
            keep = ~missing
        else:
            value = p["value"]
            if isinstance(value, str):
                if column_kind(arr) != "str":
                    raise err(f"column {c!r} is {column_kind(arr)}, it cannot be compared with the str value {value!r}")
                eq = np.array([v == value for v in arr], dtype=bool)
                keep = eq if p["op"] == "==" else ~eq
            else:
                if column_kind(arr) == "str":
                    raise err(f"column {c!r} is str, it cannot be compared with the number {value!r}")
                with np.errstate(invalid="ignore"):
                    keep = self._COMPARE[p["op"]](arr.astype(np.float64), value)
            keep &= ~missing  # a missing value never passes a filter
        if not keep.any():
            raise err(f"no rows left after filtering on column {c!r}")
        return {k: v[keep] for k, v in cols.items()}


class _ColumnList(Operation):
    """An operation whose only parameter is ``columns``."""

    def check(self, where, params):
        p = keys(where, params, ("columns",))
        return {"columns": column_names(f"{where}.columns", p["columns"])}


class Select(_ColumnList):
    """Keep only the listed feature columns (the label and the row numbers stay)."""

    name = "select"

    def apply(self, err, p, cols, label, fitted, record):
        _need(err, cols, p["columns"], numeric=False)
        out = {c: cols[c] for c in p["columns"] if c != label}
        for kept in (label, ROW):
            if kept in cols:
                out[kept] = cols[kept]
        return out


class Drop(_ColumnList):
    """Remove the listed columns."""

    name = "drop"

    def apply(self, err, p, cols, label, fitted, record):
        _need(err, cols, p["columns"], numeric=False)
        return {k: v for k, v in cols.items() if k not in p["columns"]}


class _ColumnWise(Operation):
    """A numeric operation applied column by column, each column with its own fitted statistics.

    ``all_numeric``: without ``columns`` it applies to every numeric feature (and, on new
    records, to the columns it was fitted on).
    """

    all_numeric: ClassVar[bool] = False

    def apply(self, err, p, cols, label, fitted, record):
        features = [c for c in cols if c != label and c != ROW]
        if self.all_numeric:
            names = p.get("columns") or [c for c in features if column_kind(cols[c]) != "str"]
        else:
            names = p["columns"]
        _need(err, cols, names, numeric=True)
        self.check_columns(err, p, cols, names)
        if fitted is not None and self.all_numeric and "columns" not in p:
            names = [c for c in self.fitted_columns(p, fitted) if c in cols]
        out = dict(cols)
        stats: dict[str, dict] = {}
        for c in names:
            x = cols[c].astype(np.float64)
            known = (fitted or {}).get("columns", {}).get(c)
            out[c] = self.column(err, p, c, x, np.isnan(x), known, fitted is not None, stats)
        if record is not None:
            record["columns"] = stats
        return out

    def fitted_columns(self, p: dict, fitted: dict) -> list[str]:
        """The columns this step changes on new records when its params name none: those it was fitted on."""
        return list(fitted.get("columns") or {})

    def check_columns(self, err: StepError, p: dict, cols: dict, names: list[str]) -> None:
        """Further checks of the columns before any is changed."""

    def column(
        self, err: StepError, p: dict, c: str, x: np.ndarray, nan: np.ndarray, known, refit: bool, stats: dict
    ) -> np.ndarray:
        """Column ``c`` (as float64 ``x``) after the step; fitted statistics go to ``stats[c]``."""
        raise NotImplementedError


class Impute(_ColumnWise):
    """Fill missing values with the column's mean or median, or a constant."""

    name = "impute"
    all_numeric = True

    def check(self, where, params):
        p = keys(where, params, ("strategy",), ("columns", "value"))
        strategy = p["strategy"]
        if strategy not in ("mean", "median", "constant"):
            raise InvalidParameterError(f"{where}.strategy must be mean, median or constant, got {strategy!r}")
        out: dict[str, Any] = {"strategy": strategy}
        if "columns" in p and p["columns"] is not None:
            out["columns"] = column_names(f"{where}.columns", p["columns"])
        if strategy == "constant":
            if "value" not in p:
                raise InvalidParameterError(f"{where}.value is required for strategy 'constant'")
            out["value"] = check_real(f"{where}.value", p["value"])
        elif "value" in p:
            raise InvalidParameterError(f"{where}.value is only allowed with strategy 'constant'")
        return out

    def row_local(self, p):
        return p["strategy"] == "constant"

    def column(self, err, p, c, x, nan, known, refit, stats):
        if p["strategy"] == "constant":
            fill = p["value"]
        elif known is not None:
            fill = known["fill"]
        elif refit or (nan.all() and nan.any()):
            raise err(f"column {c!r} has no values to compute the {p['strategy']} from")
        elif not nan.any():
            fill = float(np.mean(x) if p["strategy"] == "mean" else np.median(x))
        else:
            fill = float(np.mean(x[~nan]) if p["strategy"] == "mean" else np.median(x[~nan]))
        stats[c] = {"fill": fill}
        return np.where(nan, fill, x)


class Scale(_ColumnWise):
    """Standardize (mean 0, std 1) or min-max scale, from the rows or from agreed ``bounds``."""

    name = "scale"
    all_numeric = True

    def check(self, where, params):
        p = keys(where, params, ("method",), ("columns", "bounds"))
        method = p["method"]
        if method not in ("standard", "minmax"):
            raise InvalidParameterError(f"{where}.method must be standard or minmax, got {method!r}")
        out: dict[str, Any] = {"method": method}
        if "columns" in p and p["columns"] is not None:
            out["columns"] = column_names(f"{where}.columns", p["columns"])
        if "bounds" in p and p["bounds"] is not None:
            if method != "minmax":
                raise InvalidParameterError(f"{where}.bounds is only allowed with method 'minmax'")
            bounds = p["bounds"]
            if not isinstance(bounds, Mapping) or not bounds:
                raise InvalidParameterError(f"{where}.bounds must be a non-empty mapping of column to [low, high]")
            checked = {}
            for col, pair in bounds.items():
                col = column_name(f"{where}.bounds key", col)
                bw = f"{where}.bounds[{col!r}]"
                if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
                    raise InvalidParameterError(f"{bw} must be [low, high], got {pair!r}")
                low, high = check_real(f"{bw}[0]", pair[0]), check_real(f"{bw}[1]", pair[1])
                if not low < high:
                    raise InvalidParameterError(f"{bw} must have low < high, got [{low}, {high}]")
                checked[col] = [low, high]
            if "columns" in out and not set(checked) <= set(out["columns"]):
                extra = sorted(set(checked) - set(out["columns"]))
                raise InvalidParameterError(f"{where}.bounds names columns not in {where}.columns: {extra}")
            out["bounds"] = checked
        return out

    def row_local(self, p):
        columns, bounds = p.get("columns"), p.get("bounds") or {}
        return p["method"] == "minmax" and columns is not None and set(columns) <= set(bounds)

    def fitted_columns(self, p, fitted):
        # the bounds columns fit no statistic, but training scaled them: new records are scaled too
        return [
            *super().fitted_columns(p, fitted),
            *(c for c in p.get("bounds") or {} if c not in fitted.get("columns", {})),
        ]

    def check_columns(self, err, p, cols, names):
        if "bounds" in p:
            _need(err, cols, list(p["bounds"]), numeric=True)
            for c in p["bounds"]:
                if c not in names:  # the default columns: the label, or a str column
                    raise err(f"bounds column {c!r} is not a numeric feature")

    def column(self, err, p, c, x, nan, known, refit, stats):
        bounds = p.get("bounds", {})
        if c in bounds:
            lo, hi = bounds[c]
            return (x - lo) / (hi - lo)
        if known is None and (refit or nan.all()):
            raise err(f"column {c!r} has no values to compute scaling statistics from")
        present = x[~nan]
        if p["method"] == "minmax":
            lo, hi = (known["low"], known["high"]) if known else (float(present.min()), float(present.max()))
            stats[c] = {"low": lo, "high": hi}
            return (x - lo) / (hi - lo) if hi > lo else x - lo
        mean, std = (known["mean"], known["std"]) if known else (float(present.mean()), float(present.std()))
        stats[c] = {"mean": mean, "std": std}
        return (x - mean) / std if std > 0 else x - mean


class Clip(_ColumnWise):
    """Limit the listed columns to ``[low, high]`` (either bound may be absent)."""

    name = "clip"

    def check(self, where, params):
        p = keys(where, params, ("columns",), ("low", "high"))
        out: dict[str, Any] = {"columns": column_names(f"{where}.columns", p["columns"])}
        low = None if p.get("low") is None else check_real(f"{where}.low", p["low"])
        high = None if p.get("high") is None else check_real(f"{where}.high", p["high"])
        if low is None and high is None:
            raise InvalidParameterError(f"{where}: at least one of low and high is required")
        if low is not None and high is not None and low > high:
            raise InvalidParameterError(f"{where}.low must be <= {where}.high, got low={low}, high={high}")
        if low is not None:
            out["low"] = low
        if high is not None:
            out["high"] = high
        return out

    def column(self, err, p, c, x, nan, known, refit, stats):
        return np.clip(x, p.get("low", -np.inf), p.get("high", np.inf))


class Log1p(_ColumnWise, _ColumnList):
    """``log(1 + x)`` of the listed columns (values must be above -1)."""

    name = "log1p"

    def column(self, err, p, c, x, nan, known, refit, stats):
        if (x[~nan] <= -1.0).any():
            raise err(f"column {c!r} has values <= -1, log1p is undefined there")
        return np.log1p(x)


class Encode(Operation):
    """One-hot (``c=category`` columns, in category order, in place of ``c``) or ordinal (index)."""

    name = "encode"

    def check(self, where, params):
        p = keys(where, params, ("columns",), ("method", "categories"))
        out: dict[str, Any] = {
            "columns": column_names(f"{where}.columns", p["columns"]),
            "method": p.get("method", "onehot"),
        }
        if out["method"] not in ENCODINGS:
            raise InvalidParameterError(f"{where}.method must be onehot or ordinal, got {out['method']!r}")
        categories = p.get("categories")
        if categories is not None:
            if not isinstance(categories, Mapping):
                raise InvalidParameterError(f"{where}.categories must map each column to its list of categories")
            checked = {}
            for col, values in categories.items():
                col = column_name(f"{where}.categories key", col)
                if col not in out["columns"]:
                    raise InvalidParameterError(f"{where}.categories names column {col!r}, not in {where}.columns")
                cw = f"{where}.categories[{col!r}]"
                if (
                    isinstance(values, str)
                    or not isinstance(values, Sequence)
                    or not 1 <= len(values) <= MAX_CATEGORIES
                ):
                    raise InvalidParameterError(f"{cw} must list 1..{MAX_CATEGORIES} categories")
                if not all(isinstance(v, str) and 1 <= len(v) <= 128 for v in values):
                    raise InvalidParameterError(f"{cw}: every category must be a string of 1..128 characters")
                if len(set(values)) != len(values):
                    raise InvalidParameterError(f"{cw} lists a category more than once")
                checked[col] = list(values)
            out["categories"] = checked
        return out

    def row_local(self, p):
        return set(p["columns"]) <= set(p.get("categories") or {})

    def apply(self, err, p, cols, label, fitted, record):
        categories = dict(p.get("categories") or {})
        if fitted is not None:
            categories.update(fitted.get("categories", {}))
        out: dict[str, np.ndarray] = {}
        for c in p["columns"]:
            if c not in cols:
                raise err(f"column {c!r} is not in the table; columns: {list(cols)}")
            if c == label:
                raise err(f"column {c!r} is the label; encode features only")
            if c not in categories:
                raise err(
                    f"the categories of column {c!r} are not agreed: list them in params.categories, or submit "
                    "through the controller, which agrees them from the parties' published schemas"
                )
        for name, arr in cols.items():
            if name not in p["columns"]:
                out[name] = arr
                continue
            cats = categories[name]
            text = category_text(arr)
            if p["method"] == "onehot":
                for cat in cats:
                    out[f"{name}={cat}"] = np.array([v == cat for v in text], dtype=np.float64)
            else:
                index = {cat: float(i) for i, cat in enumerate(cats)}
                out[name] = np.array(
                    [index.get(v, np.nan) if v is not None else np.nan for v in text], dtype=np.float64
                )
        if record is not None:
            record["categories"] = {c: list(categories[c]) for c in p["columns"]}
        return out


class Join(Operation):
    """The record join of a vertical job: every party's rows aligned on an id column by PSI.

    The parties run it together after their own steps (:mod:`confide.vertical.psi`); it never
    runs on one party's columns.
    """

    name = "join"

    def check(self, where, params):
        p = keys(where, params, ("by",), ("protocol",))
        protocol = p.get("protocol", JOIN_PROTOCOL)
        if protocol != JOIN_PROTOCOL:
            raise InvalidParameterError(f"{where}.protocol must be {JOIN_PROTOCOL!r}, got {protocol!r}")
        return {"by": column_name(f"{where}.by", p["by"]), "protocol": protocol}

    def apply(self, err, p, cols, label, fitted, record):
        raise err("a join runs across the parties (PSI), not on one party's columns")


#: Every operation by name, in the order the documentation lists them.
OPERATIONS: dict[str, Operation] = {
    op.name: op() for op in (Filter, Select, Drop, Impute, Scale, Clip, Log1p, Encode, Join)
}
OPS = tuple(OPERATIONS)
