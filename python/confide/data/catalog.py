"""A party's local datasets: named column tables whose rows never leave the party.

A :class:`Catalog` says which datasets one party holds and where each comes from; it is
described by a small YAML or JSON document::

    datasets:
      breast-cancer: {source: breast_cancer, shard: 0, of: 3, split: iid, skew: 0.8, seed: 0}
      synthetic:     {source: synthetic, shard: 0, of: 3, samples: 1000, features: 20, seed: 0}
      visits:        {source: csv, path: visits.csv}   # relative to the catalog file's directory

Tables are built lazily, on first use, and cached. :meth:`Catalog.metadata` gives what may
leave the party: names, schemas, row counts, descriptions and source kinds, never values.

The sources (``breast_cancer``, ``synthetic``, ``digits``, ``csv``, ``parquet``, ``npz``, ``images``)
and what each gives are described in :mod:`confide.data.sources`; :class:`Table` and the
entry checks are :mod:`confide.data.table`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from confide.data.sources import MISSING_MARKERS, SOURCES, from_arrow, load_table, parse_entry
from confide.data.table import Table, check_dataset_name, entry_keys
from confide.errors import InvalidParameterError

__all__ = [
    "MISSING_MARKERS",
    "SOURCES",
    "Catalog",
    "Table",
    "check_dataset_name",
    "column_profiles",
    "table_from_arrow",
]
#: A str column's categories are published only when it has at most this many distinct values,
#: each in at least MIN_CATEGORY_ROWS rows (rarer values stay at the party: an encoding treats
#: them as unknown).
MAX_PUBLISHED_CATEGORIES = 64
MIN_CATEGORY_ROWS = 5
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
        entry_keys("catalog", mapping, ("datasets",), ())
        datasets = mapping["datasets"]
        if not isinstance(datasets, Mapping):
            raise InvalidParameterError(f"datasets must be a mapping of name to entry, got {type(datasets).__name__}")
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        specs = {}
        for name, entry in datasets.items():
            check_dataset_name("dataset name", name)
            specs[name] = parse_entry(name, entry, base)
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
            table = load_table(name, spec)
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
    return from_arrow(where, table)


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
            table = from_arrow(where, pq.read_table(partition.path))
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
