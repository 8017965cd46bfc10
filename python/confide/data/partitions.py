"""Partitioned Parquet data as the party process sees it: the files and their row counts, no rows.

A catalog ``parquet`` entry with ``partitioned: true`` names a directory of Parquet files; each
file is one partition, sorted by relative path so every run sees the same order. Listing reads
only the footers. Reading and holding the rows is the compute layer's
(:mod:`confide.compute.partitions`); this module sits below it so the catalog can list a
dataset without importing the compute engines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from confide.errors import InvalidParameterError

__all__ = ["Partition", "list_partitions", "partition_columns"]


@dataclass(frozen=True)
class Partition:
    """One Parquet file of a partitioned dataset."""

    index: int
    path: str
    rows: int


def list_partitions(path: str | os.PathLike, where: str) -> list[Partition]:
    """The Parquet files under ``path`` with their row counts (from the footers only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(path)
    files = sorted(p for p in root.rglob("*.parquet") if p.is_file()) if root.is_dir() else [root]
    if not files:
        raise InvalidParameterError(f"{where}: no .parquet files under {root}")
    out = []
    for file in files:
        try:
            rows = pq.ParquetFile(file).metadata.num_rows
        except (pa.ArrowException, OSError) as error:
            raise InvalidParameterError(f"{where}: cannot read the footer of {file.name}: {error}") from None
        if rows:  # writers such as Spark leave empty part files: nothing to hold
            out.append(Partition(len(out), str(file), int(rows)))
    if not out:
        raise InvalidParameterError(f"{where}: every .parquet file under {root} is empty")
    return out


def partition_columns(partition: Partition) -> list[str]:
    """The column names of one partition's file (from its footer only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return list(pq.ParquetFile(partition.path).schema_arrow.names)
    except (pa.ArrowException, OSError) as error:
        raise InvalidParameterError(
            f"partition {partition.index}: cannot read the footer of {partition.path}: {error}"
        ) from None
