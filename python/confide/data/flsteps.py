"""FL_Data's steps: what each operation takes (checked), and running them on a party's own table.

A :class:`Step` is one operation of the pipeline (``filter``, ``select``, ``drop``, ``impute``,
``scale``, ``clip``, ``log1p``, ``encode``, ``join``) with its parameters, checked when it is built
(:func:`_step_params`). :func:`transform` and the provisioning in :mod:`confide.data.fldata` run
the steps on one party's rows (:func:`_run_step`), fitting statistics that are recorded so the same
steps can be reapplied to new records. The format is described in ``docs/fldata.md``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from confide._checks import check_real
from confide.data.catalog import Table
from confide.errors import DataProblemError, InvalidParameterError

FORMAT = "confide.fldata"


FORMAT_VERSION = 1


OPS = ("filter", "select", "drop", "impute", "scale", "clip", "log1p", "encode", "join")


#: The record join of a vertical job (its ``join`` step): ECDH private set intersection.
JOIN_PROTOCOL = "ecdh-psi-ristretto255"


ENCODINGS = ("onehot", "ordinal")


#: At most this many categories per encoded column.
MAX_CATEGORIES = 1_000


COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


_PARTY_NAME = re.compile(r"^[a-z0-9-]{1,64}$")


_STEP_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


_MAX_COLUMN_NAME = 256


_MAX_COLUMNS = 10_000


_MAX_PARTIES = 10_000


_MAX_STEPS = 1_000


_MAX_TEST_FRACTION = 0.9


#: A hidden column carrying each row's number in the table through the steps.
ROW = "__row__"


def _keys(where: str, value: Any, required: Sequence[str], optional: Sequence[str] = ()) -> Mapping[str, Any]:
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


def _column(where: str, value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= _MAX_COLUMN_NAME:
        raise InvalidParameterError(
            f"{where} must be a column name (str of 1..{_MAX_COLUMN_NAME} characters), got {value!r}"
        )
    return value


def _columns(where: str, value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidParameterError(f"{where} must be a list of column names, got {value!r}")
    if not 1 <= len(value) <= _MAX_COLUMNS:
        raise InvalidParameterError(f"{where} must list 1..{_MAX_COLUMNS} columns, got {len(value)}")
    out = [_column(f"{where}[{i}]", v) for i, v in enumerate(value)]
    if len(set(out)) != len(out):
        dup = next(c for c in out if out.count(c) > 1)
        raise InvalidParameterError(f"{where} lists column {dup!r} more than once")
    return out


def _party_name(where: str, value: Any) -> str:
    if not isinstance(value, str) or not _PARTY_NAME.match(value):
        raise InvalidParameterError(f"{where} must be a party name of 1..64 characters of [a-z0-9-], got {value!r}")
    return value


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _sha256(value: Any) -> str:
    return hashlib.sha256(_canonical_json(value).encode("ascii")).hexdigest()


def _step_params(where: str, op: str, params: Any) -> dict[str, Any]:
    """Validate ``params`` of ``op`` and return them in canonical form (numbers as float)."""
    if op == "filter":
        p = _keys(where, params, ("column", "op"), ("value",))
        out: dict[str, Any] = {"column": _column(f"{where}.column", p["column"]), "op": p["op"]}
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
    if op == "select" or op == "drop" or op == "log1p":
        p = _keys(where, params, ("columns",))
        return {"columns": _columns(f"{where}.columns", p["columns"])}
    if op == "impute":
        p = _keys(where, params, ("strategy",), ("columns", "value"))
        strategy = p["strategy"]
        if strategy not in ("mean", "median", "constant"):
            raise InvalidParameterError(f"{where}.strategy must be mean, median or constant, got {strategy!r}")
        out = {"strategy": strategy}
        if "columns" in p and p["columns"] is not None:
            out["columns"] = _columns(f"{where}.columns", p["columns"])
        if strategy == "constant":
            if "value" not in p:
                raise InvalidParameterError(f"{where}.value is required for strategy 'constant'")
            out["value"] = check_real(f"{where}.value", p["value"])
        elif "value" in p:
            raise InvalidParameterError(f"{where}.value is only allowed with strategy 'constant'")
        return out
    if op == "scale":
        p = _keys(where, params, ("method",), ("columns", "bounds"))
        method = p["method"]
        if method not in ("standard", "minmax"):
            raise InvalidParameterError(f"{where}.method must be standard or minmax, got {method!r}")
        out = {"method": method}
        if "columns" in p and p["columns"] is not None:
            out["columns"] = _columns(f"{where}.columns", p["columns"])
        if "bounds" in p and p["bounds"] is not None:
            if method != "minmax":
                raise InvalidParameterError(f"{where}.bounds is only allowed with method 'minmax'")
            bounds = p["bounds"]
            if not isinstance(bounds, Mapping) or not bounds:
                raise InvalidParameterError(f"{where}.bounds must be a non-empty mapping of column to [low, high]")
            checked = {}
            for col, pair in bounds.items():
                col = _column(f"{where}.bounds key", col)
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
    if op == "clip":
        p = _keys(where, params, ("columns",), ("low", "high"))
        out = {"columns": _columns(f"{where}.columns", p["columns"])}
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
    if op == "encode":
        p = _keys(where, params, ("columns",), ("method", "categories"))
        out = {"columns": _columns(f"{where}.columns", p["columns"]), "method": p.get("method", "onehot")}
        if out["method"] not in ENCODINGS:
            raise InvalidParameterError(f"{where}.method must be onehot or ordinal, got {out['method']!r}")
        categories = p.get("categories")
        if categories is not None:
            if not isinstance(categories, Mapping):
                raise InvalidParameterError(f"{where}.categories must map each column to its list of categories")
            checked = {}
            for col, values in categories.items():
                col = _column(f"{where}.categories key", col)
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
    if op == "join":
        p = _keys(where, params, ("by",), ("protocol",))
        protocol = p.get("protocol", JOIN_PROTOCOL)
        if protocol != JOIN_PROTOCOL:
            raise InvalidParameterError(f"{where}.protocol must be {JOIN_PROTOCOL!r}, got {protocol!r}")
        return {"by": _column(f"{where}.by", p["by"]), "protocol": protocol}
    raise InvalidParameterError(f"{where}.op must be one of {', '.join(OPS)}, got {op!r}")


class Step:
    """One named transformation every party runs on its rows.

    Parameters
    ----------
    name : str
        Unique within the pipeline, 1..64 characters of ``[A-Za-z0-9_.-]``.
    op : str
        One of ``filter``, ``select``, ``drop``, ``impute``, ``scale``, ``clip``, ``log1p``, ``encode``.
    params : mapping
        The op's parameters (see ``docs/fldata.md``); validated and stored canonically
        (numbers as float). :attr:`params` returns a fresh copy.
    """

    __slots__ = ("_name", "_op", "_params")

    def __init__(self, name: str, op: str, params: Mapping[str, Any] | None = None) -> None:
        if not isinstance(name, str) or not _STEP_NAME.match(name):
            raise InvalidParameterError(f"step name must be 1..64 characters of [A-Za-z0-9_.-], got {name!r}")
        where = f"step {name!r}"
        if op not in OPS:
            raise InvalidParameterError(f"{where}: op must be one of {', '.join(OPS)}, got {op!r}")
        self._name = name
        self._op = op
        self._params = _step_params(f"{where} ({op}) params", op, {} if params is None else params)

    @property
    def name(self) -> str:
        """The step's name."""
        return self._name

    @property
    def op(self) -> str:
        """The step's op."""
        return self._op

    @property
    def params(self) -> dict[str, Any]:
        """A copy of the canonical parameters."""
        return copy.deepcopy(self._params)

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "op", "params"}``."""
        return {"name": self._name, "op": self._op, "params": self.params}

    @classmethod
    def from_value(cls, value: Any, where: str = "step", default_name: str | None = None) -> Step:
        """A Step from a Step or a mapping ``{"name", "op", "params"}`` (``name`` may default)."""
        if isinstance(value, Step):
            return value
        required = ("op",) if default_name is not None else ("name", "op")
        optional = ("name", "params") if default_name is not None else ("params",)
        value = _keys(where, value, required, optional)
        try:
            return cls(value.get("name", default_name), value["op"], value.get("params", {}))
        except InvalidParameterError as e:
            raise InvalidParameterError(f"{where}: {e}") from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Step):
            return NotImplemented
        return self._name == other._name and self._op == other._op and self._params == other._params

    def __hash__(self) -> int:
        return hash((self._name, self._op, _canonical_json(self._params)))

    def __repr__(self) -> str:
        return f"Step({self._name!r}, {self._op!r}, {self._params!r})"


def row_local(step: Step) -> bool:
    """Whether ``step``'s result for a row depends on that row alone (no statistic over all rows)."""
    params = step.params
    if step.op in ("filter", "select", "drop", "log1p", "clip", "join"):
        return True
    if step.op == "impute":
        return params["strategy"] == "constant"
    if step.op == "scale":
        columns = params.get("columns")
        bounds = params.get("bounds") or {}
        return params["method"] == "minmax" and columns is not None and set(columns) <= set(bounds)
    if step.op == "encode":
        categories = params.get("categories") or {}
        return set(params["columns"]) <= set(categories)
    return False


def localize_step(step: Step, present: set[str]) -> Step | None:
    """``step`` at one party of a vertical job: restricted to the columns the party holds.

    A filter on a column the party lacks, or a step whose listed columns it holds none of, does
    nothing there (None); steps without a column list (impute or scale every numeric feature)
    apply as they are. Whether every listed column is held by some party is checked at submit
    (:func:`confide.data.schemas.check_schemas` with ``vertical``).
    """
    params = step.params
    if step.op == "join":
        return None  # the parties run it together (PSI), after their own steps
    if step.op == "filter":
        return step if params["column"] in present else None
    if params.get("columns") is None:
        return step
    kept = [c for c in params["columns"] if c in present]
    if not kept:
        return None
    if kept == params["columns"]:
        return step
    params["columns"] = kept
    for key in ("bounds", "categories"):
        if params.get(key):
            params[key] = {c: v for c, v in params[key].items() if c in kept}
            if not params[key]:
                del params[key]
    return Step(step.name, step.op, params)


def _record_ids(where: str, name: str, values: np.ndarray) -> np.ndarray:
    """Record ids as int64 or str; missing, fractional or repeated ids are errors naming the column."""
    if values.dtype == object:
        if any(v is None for v in values):
            raise DataProblemError(f"{where}: id column {name!r} has missing ids", columns=[name])
        ids = values.astype(str)
    else:
        x = values.astype(np.float64)
        if np.isnan(x).any():
            raise DataProblemError(f"{where}: id column {name!r} has missing ids", columns=[name])
        if not np.all(x == np.rint(x)) or np.abs(x).max(initial=0) >= 2**53:
            raise DataProblemError(
                f"{where}: id column {name!r} must hold integers or text, not fractions",
                columns=[name],
                hint="ids are matched exactly; export them as integers or as text",
            )
        ids = x.astype(np.int64)
    if len(np.unique(ids)) != len(ids):
        raise DataProblemError(f"{where}: id column {name!r} repeats ids", columns=[name], hint="one row per record")
    return ids


def _kind(arr: np.ndarray) -> str:
    return "float" if arr.dtype.kind == "f" else "int" if arr.dtype.kind in "iu" else "str"


def _missing(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "f":
        return np.isnan(arr)
    if arr.dtype.kind in "iu":
        return np.zeros(arr.shape[0], dtype=bool)
    return np.array([v is None for v in arr], dtype=bool)


class _StepError:
    def __init__(self, party: str, step: Step) -> None:
        self.where = f"party {party!r}, step {step.name!r} ({step.op})"
        self.step = step.name

    def __call__(self, msg: str, column: str | None = None, hint: str | None = None) -> DataProblemError:
        return DataProblemError(f"{self.where}: {msg}", step=self.step, columns=[column] if column else [], hint=hint)


def _need(err: _StepError, cols: dict[str, np.ndarray], names: Sequence[str], numeric: bool) -> None:
    for c in names:
        if c not in cols:
            shown = [n for n in cols if n != ROW]
            raise err(
                f"column {c!r} is not in the table; columns: {shown[:50]}",
                c,
                "check the column name in the job's FL_Data against the dataset's published schema",
            )
        if numeric and _kind(cols[c]) == "str":
            raise err(
                f"column {c!r} is text, a numeric column is required",
                c,
                "add an encode step before this one, or drop it",
            )


def _run_step(
    party: str,
    step: Step,
    cols: dict[str, np.ndarray],
    label: str,
    fitted: dict | None = None,
    record: dict | None = None,
) -> dict[str, np.ndarray]:
    """Run one step on the columns.

    Statistics come from ``fitted`` when given (new records), else from these rows, and are
    written to ``record`` (training). Error messages name columns, never values.
    """
    err = _StepError(party, step)
    p = step._params
    op = step.op
    if op == "encode":
        return _encode(err, p, cols, label, fitted, record)
    if op == "filter":
        c = p["column"]
        _need(err, cols, [c], numeric=False)
        arr = cols[c]
        missing = _missing(arr)
        if p["op"] == "notnull":
            keep = ~missing
        else:
            value = p["value"]
            if isinstance(value, str):
                if _kind(arr) != "str":
                    raise err(f"column {c!r} is {_kind(arr)}, it cannot be compared with the str value {value!r}")
                eq = np.array([v == value for v in arr], dtype=bool)
                keep = eq if p["op"] == "==" else ~eq
            else:
                if _kind(arr) == "str":
                    raise err(f"column {c!r} is str, it cannot be compared with the number {value!r}")
                x = arr.astype(np.float64)
                with np.errstate(invalid="ignore"):
                    keep = {
                        "<": np.less,
                        "<=": np.less_equal,
                        ">": np.greater,
                        ">=": np.greater_equal,
                        "==": np.equal,
                        "!=": np.not_equal,
                    }[p["op"]](x, value)
            keep &= ~missing  # a missing value never passes a filter
        if not keep.any():
            raise err(f"no rows left after filtering on column {c!r}")
        return {k: v[keep] for k, v in cols.items()}
    if op == "select":
        _need(err, cols, p["columns"], numeric=False)
        keep = [c for c in p["columns"] if c != label]
        out = {c: cols[c] for c in keep}
        for kept in (label, ROW):  # the label, and the row numbers
            if kept in cols:
                out[kept] = cols[kept]
        return out
    if op == "drop":
        _need(err, cols, p["columns"], numeric=False)
        return {k: v for k, v in cols.items() if k not in p["columns"]}
    features = [c for c in cols if c != label and c != ROW]
    if op in ("impute", "scale"):
        names = p.get("columns") or [c for c in features if _kind(cols[c]) != "str"]
    else:
        names = p["columns"]
    _need(err, cols, names, numeric=True)
    if op == "scale" and "bounds" in p:
        _need(err, cols, list(p["bounds"]), numeric=True)
        for c in p["bounds"]:
            if c not in names:  # the default columns: the label, or a str column
                raise err(f"bounds column {c!r} is not a numeric feature")
    out = dict(cols)
    if fitted is not None and op in ("impute", "scale"):
        names = [c for c in fitted.get("columns", {}) if c in cols] if "columns" not in p else names
    stats = {}
    for c in names:
        x = cols[c].astype(np.float64)
        nan = np.isnan(x)
        known = (fitted or {}).get("columns", {}).get(c)
        if op == "impute":
            if p["strategy"] == "constant":
                fill = p["value"]
            elif known is not None:
                fill = known["fill"]
            elif fitted is not None or (nan.all() and nan.any()):
                raise err(f"column {c!r} has no values to compute the {p['strategy']} from")
            elif not nan.any():
                fill = float(np.mean(x) if p["strategy"] == "mean" else np.median(x))
            else:
                fill = float(np.mean(x[~nan]) if p["strategy"] == "mean" else np.median(x[~nan]))
            stats[c] = {"fill": fill}
            x = np.where(nan, fill, x)
        elif op == "scale":
            bounds = p.get("bounds", {})
            if c in bounds:
                lo, hi = bounds[c]
                x = (x - lo) / (hi - lo)
            else:
                if known is None and (fitted is not None or nan.all()):
                    raise err(f"column {c!r} has no values to compute scaling statistics from")
                present = x[~nan]
                if p["method"] == "minmax":
                    lo, hi = (known["low"], known["high"]) if known else (float(present.min()), float(present.max()))
                    stats[c] = {"low": lo, "high": hi}
                    x = (x - lo) / (hi - lo) if hi > lo else x - lo
                else:
                    mean, std = (
                        (known["mean"], known["std"]) if known else (float(present.mean()), float(present.std()))
                    )
                    stats[c] = {"mean": mean, "std": std}
                    x = (x - mean) / std if std > 0 else x - mean
        elif op == "clip":
            x = np.clip(x, p.get("low", -np.inf), p.get("high", np.inf))
        else:  # log1p
            if (x[~nan] <= -1.0).any():
                raise err(f"column {c!r} has values <= -1, log1p is undefined there")
            x = np.log1p(x)
        out[c] = x
    if record is not None:
        record["columns"] = stats
    return out


def _encode(err: _StepError, p: dict, cols: dict, label: str, fitted: dict | None, record: dict | None) -> dict:
    """One-hot (``c=category`` columns, in category order, in place of ``c``) or ordinal (index)."""
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
        text = np.array([None if v is None else str(v) for v in arr], dtype=object) if _kind(arr) == "str" else None
        if text is None:
            # A numeric code column (e.g. a stage 1..4): compare its canonical text.
            x = arr.astype(np.float64)
            text = np.array(
                [None if np.isnan(v) else (str(int(v)) if v == int(v) else repr(v)) for v in x], dtype=object
            )
        if p["method"] == "onehot":
            for cat in cats:
                out[f"{name}={cat}"] = np.array([v == cat for v in text], dtype=np.float64)
        else:
            index = {cat: float(i) for i, cat in enumerate(cats)}
            out[name] = np.array([index.get(v, np.nan) if v is not None else np.nan for v in text], dtype=np.float64)
    if record is not None:
        record["categories"] = {c: list(categories[c]) for c in p["columns"]}
    return out


def transform(pipeline: Sequence[Step], label: str, fitted: Sequence[dict], table: Table, features: Sequence[str]):
    """New records prepared exactly as training prepared the party's rows: ``(X, kept_rows)``.

    ``fitted``: :attr:`~confide.data.fldata.Provisioned.fitted` of the training run (imputation values, scaling,
    encodings). Filters still drop rows (``kept_rows`` gives the original row numbers that
    remain); the label column may be absent. Raises InvalidParameterError naming the step and
    the column when the records do not fit.
    """
    if len(fitted) != len(pipeline):
        raise InvalidParameterError(f"fitted statistics for {len(fitted)} steps, the pipeline has {len(pipeline)}")
    cols = dict(table.columns)
    cols[ROW] = np.arange(table.rows, dtype=np.int64)
    for step, stats in zip(pipeline, fitted, strict=True):
        if step.op != "join":  # the join aligned the training records across parties; new ones come aligned
            cols = _run_step("(new records)", step, cols, label, fitted=stats)
    missing = [c for c in features if c not in cols]
    if missing:
        raise InvalidParameterError(f"the records lack the model's feature columns {missing[:10]}")
    for c in features:
        if _kind(cols[c]) == "str":
            raise InvalidParameterError(f"feature column {c!r} is str after the pipeline; the model needs numbers")
        gaps = int(_missing(cols[c]).sum())
        if gaps:
            raise InvalidParameterError(f"feature column {c!r} has {gaps} missing values after the pipeline")
    X = np.column_stack([cols[c].astype(np.float64) for c in features]) if features else np.empty((0, 0))
    return X, cols[ROW].astype(np.int64)
