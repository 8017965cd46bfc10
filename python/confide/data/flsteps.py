"""FL_Data's steps: what each operation takes (checked), and running them on a party's own table.

A :class:`Step` is one operation of the pipeline (``filter``, ``select``, ``drop``, ``impute``,
``scale``, ``clip``, ``log1p``, ``encode``, ``join``) with its parameters, checked when it is built
by the operation itself (:data:`confide.data.flops.OPERATIONS`). :func:`transform` and the
provisioning in :mod:`confide.data.fldata` run the steps on one party's rows (:func:`run_step`),
fitting statistics that are recorded so the same steps can be reapplied to new records. The
format is described in ``docs/fldata.md``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from confide.data.catalog import Table
from confide.data.flops import OPERATIONS, OPS, ROW, StepError, category_text, column_kind, keys, missing_mask
from confide.errors import DataProblemError, InvalidParameterError

FORMAT = "confide.fldata"
FORMAT_VERSION = 1
_PARTY_NAME = re.compile(r"^[a-z0-9-]{1,64}$")
_STEP_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_PARTIES = 10_000
MAX_STEPS = 1_000
MAX_TEST_FRACTION = 0.9


def party_name(where: str, value: Any) -> str:
    """``value`` as a party name (1..64 characters of [a-z0-9-])."""
    if not isinstance(value, str) or not _PARTY_NAME.match(value):
        raise InvalidParameterError(f"{where} must be a party name of 1..64 characters of [a-z0-9-], got {value!r}")
    return value


def canonical_json(value: Any) -> str:
    """The one JSON text of ``value`` (sorted keys, no spaces, ASCII): what its digest is taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def sha256_of(value: Any) -> str:
    """SHA-256 (hex) of :func:`canonical_json` of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("ascii")).hexdigest()


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
        self._params = OPERATIONS[op].check(f"{where} ({op}) params", {} if params is None else params)

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
        value = keys(where, value, required, optional)
        try:
            return cls(value.get("name", default_name), value["op"], value.get("params", {}))
        except InvalidParameterError as e:
            raise InvalidParameterError(f"{where}: {e}") from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Step):
            return NotImplemented
        return self._name == other._name and self._op == other._op and self._params == other._params

    def __hash__(self) -> int:
        return hash((self._name, self._op, canonical_json(self._params)))

    def __repr__(self) -> str:
        return f"Step({self._name!r}, {self._op!r}, {self._params!r})"


def row_local(step: Step) -> bool:
    """Whether ``step``'s result for a row depends on that row alone (no statistic over all rows)."""
    return OPERATIONS[step.op].row_local(step._params)


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


def take_ids(where: str, columns: dict, id_column: str, hint: str) -> np.ndarray:
    """The record ids, taken out of ``columns`` (no step sees them); a missing id column is named."""
    if id_column not in columns:
        raise DataProblemError(
            f"{where}: id column {id_column!r} is not in the table; columns: {list(columns)[:50]}",
            columns=[id_column],
            hint=hint,
        )
    return record_ids(where, id_column, columns.pop(id_column))


def record_ids(where: str, name: str, values: np.ndarray) -> np.ndarray:
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


def run_step(
    party: str,
    step: Step,
    cols: dict[str, np.ndarray],
    label: str,
    fitted: dict | None = None,
    record: dict | None = None,
) -> dict[str, np.ndarray]:
    """Run one step on one party's columns (:meth:`confide.data.flops.Operation.apply`).

    Statistics come from ``fitted`` when given (new records), else from these rows, and are
    written to ``record`` (training). Error messages name columns, never values.
    """
    err = StepError(party, step.name, step.op)
    return OPERATIONS[step.op].apply(err, step._params, cols, label, fitted, record)


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
            cols = run_step("(new records)", step, cols, label, fitted=stats)
    missing = [c for c in features if c not in cols]
    if missing:
        raise InvalidParameterError(f"the records lack the model's feature columns {missing[:10]}")
    for c in features:
        if column_kind(cols[c]) == "str":
            raise InvalidParameterError(f"feature column {c!r} is str after the pipeline; the model needs numbers")
        gaps = int(missing_mask(cols[c]).sum())
        if gaps:
            raise InvalidParameterError(f"feature column {c!r} has {gaps} missing values after the pipeline")
    X = np.column_stack([cols[c].astype(np.float64) for c in features]) if features else np.empty((0, 0))
    return X, cols[ROW].astype(np.int64)


def raw_ranges(table: Table, label: str | None) -> dict[str, list[float]]:
    """``{column: [lowest, highest]}`` of the table's numeric columns but the label (missing values left out).

    What the model was trained on, column by column: :func:`record_warnings` counts the new
    records outside it. It describes the party's rows, as the fitted statistics do, and stays
    with them.
    """
    out: dict[str, list[float]] = {}
    for name, values in table.columns.items():
        if name in (label, ROW) or column_kind(values) == "str":
            continue
        x = values.astype(np.float64)
        x = x[~np.isnan(x)]
        if x.size:
            out[name] = [float(x.min()), float(x.max())]
    return out


def read_columns(pipeline: Sequence[dict], fitted: Sequence[dict], features: Sequence[str]) -> set[str]:
    """Every column name new records may need for ``pipeline`` and ``features``: what a streaming reader reads.

    The names the steps' parameters and fitted statistics mention, and the features (names a step
    makes, such as ``sex=F``, are in it too; a reader keeps those its file has).
    """
    names = set(features)
    for step, stats in zip(pipeline, fitted, strict=True):
        params = step.get("params") or {}
        names.update(params.get("columns") or [])
        names.update(params.get("bounds") or {})
        names.update(params.get("categories") or {})
        if "column" in params:
            names.add(params["column"])
        names.update((stats or {}).get("columns") or {})
        names.update((stats or {}).get("categories") or {})
    return names


class RecordChecks:
    """What in new records the model never saw, counted over any number of tables (blocks of a file).

    Counts only, never a value: per ``encode`` column, the non-missing values outside its
    categories (they score as none of them); per raw numeric column with a training range
    (``ranges``: :func:`raw_ranges`; absent in artifacts older than it), the values below and
    above it.
    """

    def __init__(
        self, pipeline: Sequence[dict], fitted: Sequence[dict], ranges: Mapping[str, Sequence[float]] | None
    ) -> None:
        self.categories: dict[str, set[str]] = {}
        for step, stats in zip(pipeline, fitted, strict=True):
            if step["op"] == "encode":
                known = {**(step.get("params") or {}).get("categories", {}), **(stats or {}).get("categories", {})}
                for column in step["params"]["columns"]:
                    if column in known:
                        self.categories[column] = set(known[column])
        self.ranges = dict(ranges or {})
        self.unseen = dict.fromkeys(self.categories, 0)
        self.outside = {column: [0, 0] for column in self.ranges}

    def add(self, table: Table) -> RecordChecks:
        """Count ``table``'s records."""
        cols = table.columns
        for column, known in self.categories.items():
            if column in cols:
                self.unseen[column] += sum(1 for v in category_text(cols[column]) if v is not None and v not in known)
        for column, (low, high) in self.ranges.items():
            if column not in cols or column_kind(cols[column]) == "str":
                continue
            with np.errstate(invalid="ignore"):
                x = cols[column].astype(np.float64)
                self.outside[column][0] += int((x < low).sum())
                self.outside[column][1] += int((x > high).sum())
        return self

    def warnings(self) -> list[str]:
        """One line per column with something the model never saw."""
        out = [
            f"column {column!r}: {count} record(s) hold a category the model never saw "
            f"(known: {len(self.categories[column])}); they score as none of the categories"
            for column, count in self.unseen.items()
            if count
        ]
        out += [
            f"column {column!r}: {below + above} record(s) outside the training range "
            f"({below} below, {above} above); the model extrapolates there"
            for column, (below, above) in self.outside.items()
            if below or above
        ]
        return out


def record_warnings(
    pipeline: Sequence[dict], fitted: Sequence[dict], ranges: Mapping[str, Sequence[float]] | None, table: Table
) -> list[str]:
    """:class:`RecordChecks` of one table: what in new records the model never saw (counts, never a value)."""
    return RecordChecks(pipeline, fitted, ranges).add(table).warnings()
