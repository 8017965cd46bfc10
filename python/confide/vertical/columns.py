"""A vertical party's partitioned columns: ids, features and bins held where the engine runs.

A SecureBoost host whose dataset is partitioned Parquet (``partitioned: true``) never reads it
in the party process. One :class:`ColumnRows` holder per file reads the file and provisions its
columns (:meth:`confide.data.fldata.FLData.provision_columns`, row-local steps only) and then
does, on its own rows, every step of the job that touches them:

1. **PSI**: it hashes and blinds its ids with the intersection's scalar
   (:meth:`ColumnRows.psi_points`); the party process concatenates the points in partition order
   and checks that no id repeats across files.
2. **Views**: after PSI the party names, for the training rows and for the test rows, which
   aligned row is which local row (:meth:`PartitionedColumns.view`).
3. **Binning**: the exact quantiles of :class:`confide.vertical.binning.Binner`, found across
   holders without moving a value: per cut level, a bisection over the float64 order in which
   each round asks every holder how many of its values lie at or below a candidate, 64 rounds at
   most. The cut points are the ones ``Binner.fit`` gives on all rows together, bit for bit
   (test).
4. **Histograms, split directions, predictions**: each holder answers for its rows (its
   encrypted histograms are multiplied in the party process, as in
   :mod:`confide.vertical.histograms`).

What the party process holds for N aligned rows: the blinded points of PSI (32 bytes a row, what
it sends anyway) and, per view, two int32/int64 arrays mapping an aligned row to its holder.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from confide.compute.partitions import Partition, PartitionTask, read_partition
from confide.errors import InvalidParameterError, ProtocolError
from confide.vertical.histograms import combine_histograms, node_histograms, received_gradients

__all__ = ["ColumnRows", "ColumnView", "PartitionedColumns"]

_MAGNITUDE = np.int64(0x7FFFFFFFFFFFFFFF)


def _keys(values: np.ndarray) -> np.ndarray:
    """int64 keys in the order of the float64 ``values`` (no NaN; -0.0 counted as 0.0)."""
    bits = (np.asarray(values, dtype=np.float64) + 0.0).view(np.int64)
    return bits ^ ((bits >> 63) & _MAGNITUDE)


def _values(keys: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_keys`."""
    keys = np.asarray(keys, dtype=np.int64)
    return (keys ^ ((keys >> 63) & _MAGNITUDE)).view(np.float64)


class ColumnRows:
    """One partition of a vertical party's columns, held where the engine runs it.

    Built from a :class:`PartitionTask` and a :class:`Partition` (a restarted worker reads the
    file again). What it learns later (views, bins, gradients) is gone after a restart: it says
    so with a :class:`ProtocolError` naming what is missing, and :class:`ColumnView` sends them
    again and asks once more.
    """

    def __init__(self, task: PartitionTask, partition: Partition, id_column: str) -> None:
        from confide.data.fldata import FLData

        self.index, self.party = partition.index, task.party
        self.error: Exception | None = None
        self.views: dict[str, dict[str, Any]] = {}
        table, self.error = read_partition(task, partition)
        if self.error is not None:
            return
        try:
            fl_data = FLData.from_dict(task.fl_data)
            fl_data.check_partitionable(task.party, list(table.columns))
            rows = fl_data.provision_columns(task.party, table, id_column=id_column, with_label=False)
        except InvalidParameterError as error:
            # the same error (a data problem keeps its step, columns and hint), naming the file
            error.args = (f"partition {partition.index} ({os.path.basename(partition.path)}): {error}",)
            self.error = error
            return
        self.ids, self.X, self.features = rows.ids, rows.X, list(rows.feature_names)

    def pid(self) -> int:
        """The process id of the worker holding this partition."""
        return os.getpid()

    def shape(self) -> dict[str, Any]:
        """Rows and feature names (raises what provisioning raised)."""
        if self.error is not None:
            raise self.error
        return {"rows": int(self.X.shape[0]), "features": self.features}

    def psi_points(self, scalar: bytes, session: str) -> dict[str, Any]:
        """k·H(id) of this partition's ids, in row order, with the id type; or the reason they are unusable."""
        from confide._native import PsiKey
        from confide.vertical import psi

        try:
            kind, encoded = psi.canonical_ids(self.ids)
        except psi.BadIds as error:  # sent back as text: the exception does not survive pickling
            return {"error": f"partition {self.index}: {error}", "public": error.public}
        data, offsets = psi.flat_ids(encoded)
        points = PsiKey.from_bytes(scalar).hash_and_blind(psi.domain_tag(session, kind), data, offsets, 1)
        return {"kind": kind, "points": points}

    def view(self, name: str, rows: np.ndarray) -> int:
        """Keep ``rows`` (local row numbers, in the order of the aligned rows this holder serves) as view ``name``."""
        self.views[name] = {"rows": np.asarray(rows, dtype=np.int64)}
        return len(rows)

    def _view(self, name: str, *needs: str) -> dict[str, Any]:
        view = self.views.get(name)
        missing = [n for n in needs if view is None or n not in view]
        if view is None or missing:
            raise ProtocolError(
                f"partition {self.index} holds no {', '.join(missing) or 'rows'} for view {name!r} "
                "(its worker restarted)"
            )
        return view

    def value_range(self, name: str) -> list[tuple[int, int, int]]:
        """Per feature, the count, lowest and highest order key of the view's non-missing values."""
        view = self._view(name)
        X = self.X[view["rows"]]
        if np.isinf(X).any():
            column = int(np.argwhere(np.isinf(X))[0][1])
            raise InvalidParameterError(
                f"{self.party}: column {column} holds an infinite value (only NaN means missing)"
            )
        view["sorted"] = [np.sort(_keys(column[~np.isnan(column)])) for column in X.T]
        return [(len(k), int(k[0]) if len(k) else 0, int(k[-1]) if len(k) else 0) for k in view["sorted"]]

    def count_at_most(self, name: str, keys: np.ndarray) -> np.ndarray:
        """For each feature j and candidate key, how many of the view's values have an order key <= it."""
        view = self._view(name, "sorted")
        keys = np.asarray(keys, dtype=np.int64)
        return np.stack([np.searchsorted(s, keys[j], side="right") for j, s in enumerate(view["sorted"])])

    def bin(self, name: str, binner: dict) -> int:
        """Bin the view's rows with the party's cut points (``Binner.to_dict``)."""
        from confide.vertical.binning import Binner

        view = self._view(name)
        view.pop("sorted", None)
        fitted = Binner.from_dict(binner)
        rows = view["rows"]
        # a holder may serve none of the view's rows (all of its records outside the intersection)
        view["bins"] = (
            fitted.transform(self.X[rows], party=self.party) if len(rows) else np.zeros((fitted.features, 0), np.uint8)
        )
        return view["bins"].shape[1]

    def set_gradients(self, name: str, public_key: bytes, gh: bytes) -> int:
        """Keep the tree's encrypted gradients of the view's rows (``gh``: theirs, in view order)."""
        view = self._view(name, "bins")
        view["gh"] = received_gradients(view, public_key, gh, len(view["rows"]), f"partition {self.index}")
        view["gh_block"] = gh
        return len(view["gh"])

    def layer(
        self, name: str, node_of_row: np.ndarray, nodes: list[int], n_bins: int
    ) -> tuple[list[bytes], np.ndarray]:
        """Encrypted histogram and row counts per (feature, bin) of each node over the view's rows."""
        from confide.vertical.secureboost import counts_histogram

        view = self._view(name, "bins", "gh")
        bins = view["bins"]
        hists, members = node_histograms(
            view["gh"], bins, node_of_row, nodes, n_bins, view.get("key"), view.get("gh_block")
        )
        counts = np.stack([counts_histogram(bins, rows, n_bins) for rows in members]).astype(np.int64)
        return hists, counts

    def lefts(self, name: str, node_of_row: np.ndarray, decisions: np.ndarray) -> list[np.ndarray]:
        """Per (node, feature, bin) decision: whether each of the node's rows here goes left."""
        bins = self._view(name, "bins")["bins"]
        return [
            bins[f, np.flatnonzero(node_of_row == node)] <= b for node, f, b in np.asarray(decisions).reshape(-1, 3)
        ]

    def below(self, name: str, queries: list[tuple[np.ndarray, int, float]]) -> list[np.ndarray]:
        """Per (positions in the view, feature, threshold): x < threshold (NaN: False, goes right)."""
        rows = self._view(name)["rows"]
        return [self.X[rows[positions], feature] < threshold for positions, feature, threshold in queries]


class PartitionedColumns:
    """The party-process side of a partitioned vertical dataset: holders, row counts, PSI."""

    def __init__(self, holders, shapes: list[dict[str, Any]], engine: dict[str, Any], files=None) -> None:
        self.holders = holders
        self.files = list(files) if files is not None else [f"partition {i}" for i in range(len(shapes))]
        self.counts = np.array([s["rows"] for s in shapes], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])
        self.features = shapes[0]["features"]
        for index, shape in enumerate(shapes):
            if shape["features"] != self.features:
                raise InvalidParameterError(
                    f"partition {index} has feature columns {shape['features']}, partition 0 has {self.features}: "
                    "every file of a partitioned dataset must give the same columns"
                )
        self.engine = engine

    @classmethod
    def open(cls, engine, task: PartitionTask, partitions: list[Partition], id_column: str) -> PartitionedColumns:
        """One :class:`ColumnRows` per partition on ``engine``."""
        holders = engine.hold(ColumnRows, [(task, partition, id_column) for partition in partitions])
        try:
            shapes = holders.call("shape")
            where = {**engine.describe(), "partitions": holders.count, "holder_pids": holders.pids()}
            return cls(holders, shapes, where, [os.path.basename(p.path) for p in partitions])
        except BaseException:
            holders.close()
            raise

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def psi_points(self, scalar: bytes, session: str) -> tuple[str, bytes]:
        """Every row's k·H(id), in partition order, and the id type; raises ``psi.BadIds`` for unusable ids."""
        from confide.vertical import psi

        if len(self) > psi.MAX_IDS:
            raise psi.BadIds(f"ids: at most {psi.MAX_IDS:,} ids per party, got {len(self):,}", "too many ids")
        parts = self.holders.call("psi_points", scalar, session)
        for part in parts:
            if "error" in part:
                raise psi.BadIds(part["error"], part["public"])
        kinds = {part["kind"] for part in parts}
        if len(kinds) > 1:
            raise psi.BadIds(f"ids: the partitions hold ids of different types {sorted(kinds)}", "mixed id types")
        points = b"".join(part["points"] for part in parts)
        # equal points are equal ids: first by a 64-bit prefix, then exactly
        prefix = np.frombuffer(points, dtype=np.uint64)[:: psi.POINT_BYTES // 8]
        if len(np.unique(prefix)) != len(prefix):
            whole = np.frombuffer(points, dtype=np.dtype((np.void, psi.POINT_BYTES)))
            unique, first, counts = np.unique(whole, return_index=True, return_counts=True)
            if (counts > 1).any():
                repeated = int(np.sort(first[counts > 1])[0])
                where = int(np.searchsorted(self.offsets, repeated, side="right") - 1)
                raise psi.BadIds(
                    f"ids: an id of partition {where} ({self.files[where]}, row {repeated - int(self.offsets[where])}) "
                    "repeats in another row; ids must be distinct across the files",
                    "duplicate ids",
                )
        return kinds.pop(), points

    def view(self, name: str, rows: np.ndarray) -> ColumnView:
        """The aligned rows ``rows`` (indices into the partitions' rows in order) as view ``name``."""
        rows = np.asarray(rows, dtype=np.int64)
        owner = (np.searchsorted(self.offsets, rows, side="right") - 1).astype(np.int32)
        rank = np.empty(len(rows), dtype=np.int64)
        members = []
        for p in range(self.holders.count):
            mine = np.flatnonzero(owner == p)
            rank[mine] = np.arange(len(mine))
            members.append(mine)
        local = [(name, rows[m] - self.offsets[p]) for p, m in enumerate(members)]
        self.holders.call_each("view", local)
        return ColumnView(self, name, owner, rank, members, local)

    def close(self) -> None:
        """Release the holders."""
        self.holders.close()


class ColumnView:
    """Aligned rows of a partitioned host, as SecureBoost's host side uses them.

    The same operations as an in-memory matrix (``confide.vertical.secureboost.MatrixRows``):
    fit the bins, take the tree's gradients, answer a layer, split directions and predictions.
    """

    def __init__(self, columns: PartitionedColumns, name: str, owner, rank, members: list[np.ndarray], local) -> None:
        self.columns, self.name = columns, name
        self.owner, self.rank, self.members = owner, rank, members
        self.rows, self.features = len(owner), len(columns.features)
        self.binner = None
        self._local = local
        self._gradients: list[tuple] = []

    def _call_each(self, method: str, arguments: list[tuple]) -> list[Any]:
        """``call_each``; a restarted holder gets its view, bins and gradients again, and is asked again."""
        holders = self.columns.holders
        try:
            return holders.call_each(method, arguments)
        except ProtocolError:
            holders.call_each("view", self._local)
            if self.binner is not None:
                holders.call("bin", self.name, self.binner.to_dict())
            if self._gradients and method != "set_gradients":
                holders.call_each("set_gradients", self._gradients)
            return holders.call_each(method, arguments)

    def _call(self, method: str, *args: Any) -> list[Any]:
        """The same call on every holder, with :meth:`_call_each`'s recovery."""
        return self._call_each(method, [args] * self.columns.holders.count)

    def fit(self, n_bins: int, party: str):
        """Exact quantile cut points over the view's rows, as ``Binner.fit`` gives; the holders bin their rows."""
        from confide.vertical.binning import MAX_BINS, MIN_BINS, Binner

        if not isinstance(n_bins, int) or not MIN_BINS <= n_bins <= MAX_BINS:
            raise InvalidParameterError(f"n_bins must be an int in {MIN_BINS}..{MAX_BINS}, got {n_bins!r}")
        if self.rows == 0:
            raise InvalidParameterError(f"{party}: has no rows")
        ranges = self._call("value_range", self.name)
        counts = np.array([[c for c, _, _ in r] for r in ranges], dtype=np.int64).sum(axis=0)
        present = [[(lo, hi) for c, lo, hi in r if c] for r in zip(*ranges, strict=True)]
        levels = np.arange(1, n_bins - 1) / (n_bins - 1)
        # np.quantile's "linear" method: h = (n-1)q, interpolate between order statistics floor(h), floor(h)+1
        targets, lows, highs = [], [], []
        for j, n in enumerate(counts):
            h = (n - 1) * levels
            previous = np.floor(h)
            after = np.minimum(previous + 1, n - 1).astype(np.int64)
            previous = np.where(h >= n - 1, n - 1, previous).astype(np.int64)
            after = np.where(h >= n - 1, n - 1, after)
            targets.append(np.concatenate([previous, after]) if n else np.zeros(0, dtype=np.int64))
            lows.append(min((lo for lo, _ in present[j]), default=0))
            highs.append(max((hi for _, hi in present[j]), default=0))
        keys = self._order_statistics(targets, lows, highs)
        cuts = []
        for j, n in enumerate(counts):
            if n == 0:
                cuts.append(np.zeros(0))
                continue
            h = (n - 1) * levels
            gamma = h - np.where(h >= n - 1, -1.0, np.floor(h))
            half = len(levels)
            a, b = _values(keys[j][:half]), _values(keys[j][half:])
            diff = b - a
            quantiles = a + diff * gamma
            upper = gamma >= 0.5
            quantiles[upper] = (b - diff * (1 - gamma))[upper]
            points = np.unique(quantiles)
            cuts.append(points[points > _values(np.array([lows[j]]))[0]])
        self.binner = Binner(n_bins=n_bins, cuts=cuts)
        self._call("bin", self.name, self.binner.to_dict())
        return self.binner

    def _order_statistics(self, targets: list[np.ndarray], lows: list[int], highs: list[int]) -> list[np.ndarray]:
        """For each feature j and rank r in targets[j]: the order key of its r-th smallest value."""
        width = max(len(t) for t in targets)
        lo = [[lows[j]] * len(t) for j, t in enumerate(targets)]
        hi = [[highs[j]] * len(t) for j, t in enumerate(targets)]
        while any(a < b for row_lo, row_hi in zip(lo, hi, strict=True) for a, b in zip(row_lo, row_hi, strict=True)):
            mid = [
                [(a + b) // 2 for a, b in zip(row_lo, row_hi, strict=True)]
                for row_lo, row_hi in zip(lo, hi, strict=True)
            ]
            ask = np.zeros((len(targets), width), dtype=np.int64)
            for j, row in enumerate(mid):
                ask[j, : len(row)] = row
            try:
                answers = self.columns.holders.call("count_at_most", self.name, ask)
            except ProtocolError:  # a holder restarted: its view and sorted values again
                self.columns.holders.call_each("view", self._local)
                self.columns.holders.call("value_range", self.name)
                answers = self.columns.holders.call("count_at_most", self.name, ask)
            at_most = np.sum(answers, axis=0)
            for j, t in enumerate(targets):
                for i, rank in enumerate(t):
                    if lo[j][i] < hi[j][i]:
                        if at_most[j, i] >= rank + 1:
                            hi[j][i] = mid[j][i]
                        else:
                            lo[j][i] = mid[j][i] + 1
        return [np.array(row, dtype=np.int64) for row in lo]

    def set_gradients(self, key, gh, block: bytes | None = None) -> None:
        """Each holder gets the ciphertexts of its own rows of the view (``block``: unused, the holders re-slice)."""
        public = key.to_bytes()
        self._gradients = [(self.name, public, gh.take(m.astype(np.uint32)).to_bytes()) for m in self.members]
        self._call_each("set_gradients", self._gradients)

    def layer(self, node_of_row: np.ndarray, nodes: list[int], n_bins: int, key, threads: int = 0):
        """The nodes' encrypted histograms (products over holders) and their row counts."""
        node_of_row = np.asarray(node_of_row, dtype=np.int32)
        args = [(self.name, node_of_row[m], list(nodes), n_bins) for m in self.members]
        parts = self._call_each("layer", args)
        hists = combine_histograms([p[0] for p in parts], key, len(nodes), threads)
        return hists, np.sum([p[1] for p in parts], axis=0)

    def lefts(self, node_of_row: np.ndarray, decisions: np.ndarray) -> list[np.ndarray]:
        """Per (node, feature, bin): whether each row of the node (in row order) goes left."""
        node_of_row = np.asarray(node_of_row, dtype=np.int32)
        decisions = np.asarray(decisions, dtype=np.int64).reshape(-1, 3)
        parts = self._call_each("lefts", [(self.name, node_of_row[m], decisions) for m in self.members])
        out = []
        for k, (node, _, _) in enumerate(decisions):
            rows = np.flatnonzero(node_of_row == node)
            left = np.empty(len(rows), dtype=bool)
            for m, part in zip(self.members, parts, strict=True):
                left[np.searchsorted(rows, m[node_of_row[m] == node])] = part[k]
            out.append(left)
        return out

    def below(self, queries: list[tuple[np.ndarray, int, float]]) -> list[np.ndarray]:
        """Per (rows of the view, feature, threshold): x < threshold."""
        per_holder: list[list] = [[] for _ in self.members]
        for rows, feature, threshold in queries:
            owner = self.owner[rows]
            for p in range(len(self.members)):
                per_holder[p].append((self.rank[rows[owner == p]], int(feature), float(threshold)))
        parts = self._call_each("below", [(self.name, q) for q in per_holder])
        out = []
        for k, (rows, _, _) in enumerate(queries):
            owner = self.owner[rows]
            result = np.empty(len(rows), dtype=bool)
            for p, part in enumerate(parts):
                result[owner == p] = part[k]
            out.append(result)
        return out

    def close(self) -> None:  # the holders belong to the PartitionedColumns
        """Nothing of its own to release."""
