"""Submit-time checks of an FL_Data pipeline against the schemas the parties published.

The controller never sees a row, but it holds every dataset's published profile (column names,
dtypes, whether a column has missing cells, the categories of low-cardinality text columns;
``confide.data.catalog.column_profiles``). :func:`check_schemas` runs the job's pipeline over
those profiles the way each party will run it over its rows, and reports every column a step or
the model needs that is absent, of an unusable type, or still missing values where nothing
imputes them. So "column `sex` is text" is caught at ``job submit``, before any process starts,
instead of as a failed party an hour later.

:func:`agree_categories` fills the categories of ``encode`` steps that do not list them: the
sorted union of what the participants published, so every party encodes a column into the same
columns in the same order without any party revealing a row.

Both work on profiles only; what a profile cannot know (a value outside the published categories,
a filter that keeps no row) is still checked at the party, and reported back as a failure report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from confide.data.fldata import FLData, localize_step
from confide.data.flops import ID_HINT, TEXT_HINT

__all__ = ["SchemaProblem", "agree_categories", "check_schemas"]

NUMERIC = ("float", "int")


@dataclass(frozen=True)
class SchemaProblem:
    """One mismatch: where (party, step) and which column, with the next step to take."""

    party: str
    dataset: str
    step: str | None
    column: str | None
    problem: str
    hint: str
    label: bool = False

    def text(self) -> str:
        """One line: ``hospital-c/records, step 'scaled': column 'sex' is text; add an encode step or drop it``."""
        where = f"{self.party}/{self.dataset}" + (f", step {self.step!r}" if self.step else "")
        what = f"column {self.column!r} {self.problem}" if self.column else self.problem
        if self.label:
            what = f"fl_data.label: {what}"
        return f"{where}: {what}; {self.hint}"


def _simulate(
    party: str, dataset: str, fl_data: FLData, schema: list[dict], *, label: str | None, id_column: str | None
) -> list[SchemaProblem]:
    """Run the pipeline over the schema (a vertical job's steps localized to this party's columns)."""
    cols = {
        c["name"]: {"dtype": c["dtype"], "missing": bool(c.get("missing", False)), "categories": "categories" in c}
        for c in schema
    }
    problems: list[SchemaProblem] = []
    if id_column is not None:  # a vertical job's record ids: taken out before the pipeline
        ids = cols.pop(id_column, None)
        if ids is None:
            problems.append(
                SchemaProblem(
                    party, dataset, None, id_column, "is not in the dataset", "set data.id_column to the id column"
                )
            )
        elif ids["missing"]:
            problems.append(
                SchemaProblem(party, dataset, None, id_column, "has missing ids", "every record needs its id")
            )

    def problem(step, column, what, hint):
        problems.append(SchemaProblem(party, dataset, step, column, what, hint, label=column == label))

    def need(step, names, numeric):
        ok = []
        for c in names:
            if c not in cols:
                problem(step, c, "is not in the dataset", f"its columns are {sorted(cols)[:30]}")
            elif numeric and cols[c]["dtype"] not in NUMERIC:
                problem(step, c, "is text", "add an encode step before this one, or drop the column")
            else:
                ok.append(c)
        return ok

    for original in fl_data.pipeline:
        step = localize_step(original, set(cols)) if id_column is not None else original
        if step is None:
            continue
        p = step.params
        name = step.name
        if step.op == "filter":
            value = p.get("value")
            present = need(name, [p["column"]], numeric=not isinstance(value, str) and p["op"] != "notnull")
            for c in present:
                cols[c]["missing"] = False  # a missing value never passes a filter
        elif step.op == "select":
            keep = need(name, p["columns"], numeric=False)
            cols = {c: v for c, v in cols.items() if c in keep or c == label}
        elif step.op == "drop":
            for c in need(name, p["columns"], numeric=False):
                cols.pop(c, None)
        elif step.op == "encode":
            for c in p["columns"]:
                if c not in cols:
                    problem(name, c, "is not in the dataset", f"its columns are {sorted(cols)[:30]}")
                    continue
                if c == label:
                    problem(name, c, "is the label", "encode feature columns only")
                    continue
                categories = (p.get("categories") or {}).get(c)
                if not categories:
                    problem(
                        name,
                        c,
                        "has no agreed categories",
                        "list them in params.categories (no party published any for it)",
                    )
                    continue
                missing = cols[c]["missing"]
                del cols[c]
                if p["method"] == "onehot":
                    for category in categories:
                        cols[f"{c}={category}"] = {"dtype": "float", "missing": False}
                else:
                    cols[c] = {"dtype": "float", "missing": missing}
        else:  # impute, scale, clip, log1p
            names = p.get("columns") or [c for c, v in cols.items() if c != label and v["dtype"] in NUMERIC]
            for c in need(name, names, numeric=True):
                if step.op == "impute":
                    cols[c]["missing"] = False
    if label is None:
        pass
    elif label not in cols:
        problem(None, label, "is not in the dataset", f"its columns are {sorted(cols)[:30]}")
    elif cols[label]["dtype"] not in NUMERIC:
        problem(None, label, "is text", "the label must be a number (0/1 for binary jobs)")
    elif cols[label]["missing"]:
        problem(None, label, "has missing values", "add a filter step {op: notnull} on it")
    for c, v in cols.items():
        if c == label:
            continue
        if v["dtype"] not in NUMERIC:
            # a published text column without categories has more distinct values than a profile lists
            problem(None, c, "is text", TEXT_HINT if v.get("categories", True) else ID_HINT)
        elif v["missing"]:
            problem(None, c, "has missing values and no step imputes them", "add an impute step (or a notnull filter)")
    return problems


def check_schemas(
    fl_data: FLData,
    schemas: Mapping[str, list[dict]],
    *,
    vertical: tuple[str, str] | None = None,
    scoring: bool = False,
) -> list[SchemaProblem]:
    """Every problem of ``fl_data`` over the published ``schemas`` ({party: columns}); empty when it fits.

    ``vertical``: ``(guest, id_column)`` for a vertical job: only the guest holds the label, every
    party holds the id column (not a feature; present and never missing). ``scoring``: new records
    to score, which may come without the label.
    """
    datasets = fl_data.datasets()
    out: list[SchemaProblem] = []
    for party in sorted(schemas):
        label = fl_data.label if vertical is None or party == vertical[0] else None
        if scoring and label not in {c["name"] for c in schemas[party]}:
            label = None
        id_column = vertical[1] if vertical is not None else None
        out += _simulate(party, datasets[party], fl_data, schemas[party], label=label, id_column=id_column)
    if vertical is not None:  # each step runs where its columns are; a column nobody holds is a typo
        held = {c["name"] for schema in schemas.values() for c in schema}
        for step in fl_data.pipeline:
            p = step.params
            named = [p["column"]] if step.op == "filter" else list(p.get("columns") or [])
            for column in named:
                if column not in held and not any(column.startswith(f"{h}=") for h in held):
                    guest = vertical[0]
                    out.append(
                        SchemaProblem(
                            guest, datasets.get(guest, "?"), step.name, column, "is held by no party",
                            "check the column name against the published schemas",
                        )
                    )  # fmt: skip
    return out


def agree_categories(fl_data: FLData, schemas: Mapping[str, list[dict]]) -> FLData:
    """``fl_data`` with every ``encode`` step's missing categories filled from the published schemas.

    A column's categories are the sorted union of what the participants published for it. Steps
    that already list a column's categories keep them. Returns ``fl_data`` itself if nothing is
    missing (no lineage entry).
    """
    published: dict[str, set[str]] = {}
    for columns in schemas.values():
        for column in columns:
            if column.get("categories"):
                published.setdefault(column["name"], set()).update(column["categories"])
    out = fl_data
    for step in fl_data.pipeline:
        if step.op != "encode":
            continue
        params = step.params
        categories = dict(params.get("categories") or {})
        added = {c: sorted(published[c]) for c in params["columns"] if c not in categories and published.get(c)}
        if added:
            out = out.pipeline_substitute(
                step.name, {"op": "encode", "params": {**params, "categories": {**categories, **added}}}
            )
    return out
