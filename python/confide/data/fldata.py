"""FL_Data: a federated dataset described by its participants and its transformation pipeline.

After the ``FL_Data`` abstraction of Jupiter (Sci China Inf Sci, §3.4, Table 1). An
:class:`FLData` never holds rows. It says which party contributes which of its datasets
(:class:`Participant`), which column is the label, and which steps (:class:`Step`) every
party runs on its own rows. Each party turns it into training arrays with
:meth:`FLData.provision`, on its own table only. Because the description fully determines
what each party computes, exchanging an ``FLData`` is as good as exchanging the data set.

An ``FLData`` is an immutable value. Every operation returns a new one whose lineage has
one more entry, so any earlier version can be restored (:meth:`~FLData.rollback`), two
versions compared (:meth:`~FLData.diff`) and two branches merged (:meth:`~FLData.merge`).
The format and semantics are described in ``docs/fldata.md``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from confide.data.catalog import Table
from confide.data.flops import ROW, column_kind, keys, missing_mask, text_hint
from confide.data.flsteps import (
    FORMAT,
    FORMAT_VERSION,
    Step,
    localize_step,
    raw_ranges,
    row_local,
    run_step,
    take_ids,
    transform,
)
from confide.data.lineage import (
    FLDataConflictError,
    LineageState,
    Participant,
    _state_from_dict,
    apply_change,
    diff_states,
    is_empty_diff,
    merge_states,
)
from confide.errors import DataProblemError, InvalidParameterError

__all__ = [
    "FLData",
    "FLDataConflictError",
    "Participant",
    "Provisioned",
    "Step",
    "VerticalRows",
    "is_empty_diff",
    "localize_step",
    "transform",
]


@dataclass(frozen=True, eq=False)
class Provisioned:
    """One party's training (and local test) arrays, built by :meth:`FLData.provision`.

    Attributes
    ----------
    X, y : numpy.ndarray
        float64 features ``(n, d)`` and labels ``(n,)``.
    X_test, y_test : numpy.ndarray or None
        The local held-out rows; None when the participant's ``test_fraction`` is 0.
    feature_names : list of str
        Column names of ``X``, in order.
    fitted : list of dict
        Per pipeline step, the statistics this party fitted on its rows (imputation values,
        scaling parameters, encodings): with them :func:`transform` prepares new records exactly
        as training did. They stay at the party (they describe its rows).
    ranges : dict or None
        ``{column: [lowest, highest]}`` of the table's numeric columns (:func:`raw_ranges`), so
        that scoring can count new records outside what the model saw.
    """

    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray | None
    y_test: np.ndarray | None
    feature_names: list[str]
    fitted: list[dict] | None = None
    test_rows: np.ndarray | None = None
    ranges: dict[str, list[float]] | None = None


@dataclass
class VerticalRows:
    """One party's rows of a vertical job (:meth:`FLData.provision_columns`), before PSI."""

    ids: np.ndarray
    X: np.ndarray
    y: np.ndarray | None
    feature_names: list[str]
    fitted: list[dict] | None = None
    #: The steps as they ran at this party, in step with ``fitted`` (each restricted to its
    #: columns; None for a step that did nothing here, the join among them): what new records of
    #: this party go through (:func:`confide.data.flsteps.transform`) to be scored.
    steps: list[dict] | None = None


class FLData:
    """Participants, label and pipeline of a federated dataset, with the lineage of every change.

    Build one with :meth:`create` (or :meth:`from_dict` / :meth:`from_json`); never holds rows.
    Equality compares state and lineage; :attr:`fingerprint` identifies the state alone.
    """

    __slots__ = ("_states", "_entries")

    def __init__(self, _states: tuple[LineageState, ...], _entries: tuple[dict[str, Any], ...]) -> None:
        self._states = _states
        self._entries = _entries

    # -------------------------------------------------- construction

    @classmethod
    def create(cls, participants: Mapping[str, Any], label: str, pipeline: Sequence[Any] = ()) -> FLData:
        """A new FLData (lineage version 0).

        Parameters
        ----------
        participants : mapping of str to Participant, mapping or str
            Party name (1..64 characters of ``[a-z0-9-]``) to its :class:`Participant`, to a
            mapping of its fields (``dataset`` required), or to just the dataset name.
        label : str
            The label column; it is never dropped and always kept by ``select``.
        pipeline : sequence of Step or mapping
            Steps, each a :class:`Step` or ``{"name", "op", "params"}``.
        """
        if isinstance(pipeline, (str, Mapping)) or not isinstance(pipeline, Sequence):
            raise InvalidParameterError(f"pipeline must be a list of steps, got {type(pipeline).__name__}")
        if isinstance(participants, Mapping):
            participants = {n: (p.to_dict() if isinstance(p, Participant) else p) for n, p in participants.items()}
        pipeline = [s.to_dict() if isinstance(s, Step) else s for s in pipeline]
        args = {"participants": participants, "label": label, "pipeline": pipeline}
        return cls((), ())._then("create", args)

    def _then(self, operation: str, args: Any) -> FLData:
        state, canon = apply_change(self._states, operation, args)
        entry = {
            "version": len(self._entries),
            "operation": operation,
            "arguments": canon,
            "fingerprint": state.fingerprint(),
        }
        return FLData((*self._states, state), (*self._entries, entry))

    # -------------------------------------------------- state

    @property
    def _state(self) -> LineageState:
        return self._states[-1]

    @property
    def participants(self) -> dict[str, Participant]:
        """Party name to :class:`Participant`, sorted by name (a new dict)."""
        return self._state.party_map()

    @property
    def label(self) -> str:
        """The label column."""
        return self._state.label

    @property
    def pipeline(self) -> tuple[Step, ...]:
        """The steps, in order."""
        return self._state.pipeline

    @property
    def frozen(self) -> bool:
        """Whether :meth:`freeze` was called; a frozen FLData refuses every change."""
        return self._state.frozen

    @property
    def join_column(self) -> str | None:
        """The id column of the pipeline's ``join`` step (a vertical job's PSI), or None."""
        last = self._state.pipeline[-1] if self._state.pipeline else None
        return last._params["by"] if last is not None and last.op == "join" else None

    @property
    def version(self) -> int:
        """The latest lineage version (0 right after :meth:`create`)."""
        return len(self._entries) - 1

    @property
    def fingerprint(self) -> str:
        """sha256 hex of the canonical JSON of the state (participants, label, pipeline, frozen).

        Independent of the lineage: two FLData that describe the same dataset share it.
        """
        return self._entries[-1]["fingerprint"]

    def state(self) -> dict[str, Any]:
        """``{"participants", "label", "pipeline", "frozen"}`` as plain JSON values."""
        return self._state.to_dict()

    def datasets(self) -> dict[str, str]:
        """Party name to the name of the dataset it contributes."""
        return {n: p.dataset for n, p in self._state.participants}

    # -------------------------------------------------- manipulation

    def participants_shaping(
        self,
        *,
        add: Mapping[str, Any] | None = None,
        remove: Sequence[str] | None = None,
        update: Mapping[str, Any] | None = None,
    ) -> FLData:
        """Add, remove or update participants (removals first, then updates, then additions).

        ``add`` maps new parties to participants (as in :meth:`create`); ``update`` maps
        existing parties to a :class:`Participant` (replacing it) or to a mapping of the fields
        to change. A party may appear in only one of the three. At least one participant must
        remain.
        """
        if update is not None and isinstance(update, Mapping):
            update = {n: (p.to_dict() if isinstance(p, Participant) else p) for n, p in update.items()}
        if add is not None and isinstance(add, Mapping):
            add = {n: (p.to_dict() if isinstance(p, Participant) else p) for n, p in add.items()}
        args = {"add": {} if add is None else add, "remove": [] if remove is None else remove}
        args["update"] = {} if update is None else update
        return self._then("participants_shaping", args)

    def pipeline_shaping(
        self,
        *,
        append: Sequence[Any] = (),
        insert: tuple[int, Any] | None = None,
        remove: Sequence[str] = (),
    ) -> FLData:
        """Remove named steps, then insert one step at an index (of the pipeline after removal), then append.

        Step names must stay unique.
        """
        ins = None
        if insert is not None:
            if isinstance(insert, (str, Mapping)) or not isinstance(insert, Sequence) or len(insert) != 2:
                raise InvalidParameterError(f"pipeline_shaping.insert must be a pair (index, step), got {insert!r}")
            step = insert[1].to_dict() if isinstance(insert[1], Step) else insert[1]
            ins = {"index": insert[0], "step": step}
        if isinstance(append, (str, Mapping, Step)) or not isinstance(append, Sequence):
            raise InvalidParameterError(f"pipeline_shaping.append must be a list of steps, got {append!r}")
        append = [s.to_dict() if isinstance(s, Step) else s for s in append]
        return self._then("pipeline_shaping", {"append": append, "insert": ins, "remove": remove})

    def pipeline_substitute(self, name: str, step: Any) -> FLData:
        """Replace step ``name`` in place with ``step`` (a mapping without ``name`` keeps the old name)."""
        return self._then(
            "pipeline_substitute", {"name": name, "step": step.to_dict() if isinstance(step, Step) else step}
        )

    def rollback(self, version: int) -> FLData:
        """The state of lineage version ``version``, recorded as a new ``rollback`` entry."""
        return self._then("rollback", {"version": version})

    def freeze(self) -> FLData:
        """A frozen copy: it can be provisioned, exported, diffed, but every change is refused."""
        return self._then("freeze", {})

    # -------------------------------------------------- tracking

    def lineage(self) -> list[dict[str, Any]]:
        """``[{"version", "operation", "arguments", "fingerprint"}, ...]`` (deep copies), oldest first."""
        return copy.deepcopy(list(self._entries))

    def diff(self, other: FLData) -> dict[str, Any]:
        """What changes from ``self`` to ``other``.

        Returns
        -------
        dict
            ``{"participants": {"added": {party: participant}, "removed": [party],
            "changed": {party: {"from", "to"}}}, "label": None | {"from", "to"},
            "pipeline": {"added": [step], "removed": [name], "changed": [{"name", "from", "to"}],
            "order": bool}, "frozen": None | {"from", "to"}}``. ``order`` is true when the steps
            both have are in a different relative order. Use :func:`is_empty_diff` to test for
            no change; it is empty exactly when the fingerprints are equal.
        """
        if not isinstance(other, FLData):
            raise InvalidParameterError(f"diff: other must be an FLData, got {type(other).__name__}")
        return diff_states(self._state, other._state)

    def merge(self, other: FLData) -> FLData:
        """Three-way merge of ``other`` into ``self`` from their last common lineage entry.

        For every participant and every step (by name), and for the label: if only one side
        changed it since the ancestor, that change is taken (additions and removals
        included); if both changed it identically, fine; if both changed it differently,
        :class:`FLDataConflictError` names each such conflict. The steps both sides keep
        follow the order of the side that reordered them; a step only one side has keeps its
        place among the steps of its side that both sides have, right after the last of those
        before it (when the other side's reordering makes that impossible, that is a conflict
        too). The merged state does not depend on the order of the two arguments; the lineage
        is ``self``'s plus one ``merge`` entry.

        Raises
        ------
        InvalidParameterError
            No common ancestor, or either side is frozen.
        FLDataConflictError
            Conflicting changes.
        """
        if not isinstance(other, FLData):
            raise InvalidParameterError(f"merge: other must be an FLData, got {type(other).__name__}")
        if other.frozen and not self.frozen:
            raise InvalidParameterError("merge: other is frozen; merge from the version before freeze()")
        k = 0
        for ea, eb in zip(self._entries, other._entries, strict=False):
            if ea != eb:
                break
            k += 1
        if k == 0:
            raise InvalidParameterError(
                "merge: the two FLData have no common lineage ancestor (their version 0 entries differ)"
            )
        if self.frozen:
            return self._then("merge", {})  # refused with the frozen message
        merged = merge_states(self._states[k - 1], self._state, other._state)
        return self._then("merge", {"ancestor": k - 1, "other": other.fingerprint, "state": merged.to_dict()})

    # -------------------------------------------------- exchange

    def to_dict(self) -> dict[str, Any]:
        """``{"format": "confide.fldata", "version": 1, "state": {...}, "lineage": [...]}``."""
        return {"format": FORMAT, "version": FORMAT_VERSION, "state": self.state(), "lineage": self.lineage()}

    def to_json(self, indent: int | None = None) -> str:
        """:meth:`to_dict` as JSON (keys sorted)."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FLData:
        """Import an export of :meth:`to_dict`, replaying and checking every lineage entry.

        Raises
        ------
        InvalidParameterError
            Wrong format or version, an invalid entry, an entry whose recorded fingerprint is
            not the fingerprint of the state it produces, or a ``state`` that is not the
            lineage's last state (the message names the entry).
        """
        d = keys("FLData export", data, ("format", "version", "state", "lineage"))
        if d["format"] != FORMAT:
            raise InvalidParameterError(f"FLData export: format must be {FORMAT!r}, got {d['format']!r}")
        if d["version"] != FORMAT_VERSION or isinstance(d["version"], bool):
            raise InvalidParameterError(f"FLData export: version must be {FORMAT_VERSION}, got {d['version']!r}")
        lineage = d["lineage"]
        if isinstance(lineage, (str, Mapping)) or not isinstance(lineage, Sequence) or not lineage:
            raise InvalidParameterError("FLData export: lineage must be a non-empty list of entries")
        out = cls((), ())
        for i, entry in enumerate(lineage):
            where = f"FLData export: lineage[{i}]"
            e = keys(where, entry, ("version", "operation", "arguments", "fingerprint"))
            if e["version"] != i or isinstance(e["version"], bool):
                raise InvalidParameterError(f"{where}.version must be {i}, got {e['version']!r}")
            try:
                out = out._then(e["operation"], e["arguments"])
            except InvalidParameterError as exc:
                raise InvalidParameterError(f"{where} ({e['operation']!r}): {exc}") from None
            if out.fingerprint != e["fingerprint"]:
                raise InvalidParameterError(
                    f"{where}.fingerprint does not match the state this entry produces "
                    f"(recorded {str(e['fingerprint'])[:16]!r}, computed {out.fingerprint[:16]!r}): "
                    "the export was altered"
                )
        state = _state_from_dict("FLData export: state", d["state"])
        if state != out._state:
            raise InvalidParameterError(
                "FLData export: state is not the state the lineage produces (the export was altered)"
            )
        return out

    @classmethod
    def from_json(cls, text: str) -> FLData:
        """Import :meth:`to_json` output (see :meth:`from_dict`)."""
        if not isinstance(text, (str, bytes)):
            raise InvalidParameterError(f"FLData JSON must be str or bytes, got {type(text).__name__}")
        try:
            data = json.loads(text)
        except ValueError as e:
            raise InvalidParameterError(f"FLData JSON is not valid JSON: {e}") from None
        return cls.from_dict(data)

    # -------------------------------------------------- provisioning

    def provision(self, party: str, table: Table) -> Provisioned:
        """Build ``party``'s training arrays from its own ``table`` (run at that party).

        1. If ``fraction < 1``, keep ``max(1, round(fraction * rows))`` rows chosen with
           ``np.random.default_rng([seed, i])`` (``i`` = the party's index among the sorted
           party names), in table order.
        2. Run the steps in order. ``impute`` and ``scale`` without ``columns`` apply to every
           numeric column but the label; statistics are the party's own, over its rows after
           the steps before.
        3. Features are all remaining columns but the label, in order; they must be numeric and
           have no NaN; the label must be numeric without NaN.
        4. If ``test_fraction > 0``, ``max(1, round(test_fraction * n))`` rows chosen by the
           same generator form the local test set (both sets keep table order).

        Raises
        ------
        InvalidParameterError
            ``party`` is not a participant, or the table does not fit the pipeline (the message
            names the party, the step and the column).
        """
        p, rng, where, last, cols, row_numbers, fitted, _ran = self._run_pipeline(party, table)
        label = self.label
        features = self._checked_features(
            where, last, cols, label, "check fl_data.label against the dataset's published schema"
        )
        X = np.column_stack([cols[c].astype(np.float64) for c in features])
        y = cols[label].astype(np.float64)
        n = X.shape[0]
        ranges = raw_ranges(table, label)
        if p.test_fraction == 0.0:
            return Provisioned(X, y, None, None, features, fitted, row_numbers[:0], ranges)
        n_test = max(1, round(p.test_fraction * n))
        if n_test >= n:
            raise InvalidParameterError(
                f"{where}, {last}: {n} rows are too few for test_fraction {p.test_fraction} (no training rows left)"
            )
        is_test = np.zeros(n, dtype=bool)
        is_test[rng.permutation(n)[:n_test]] = True
        return Provisioned(
            X[~is_test], y[~is_test], X[is_test], y[is_test], features, fitted, row_numbers[is_test], ranges
        )

    def check_partitionable(self, party: str, columns: list[str] | None = None) -> None:
        """Refuse what partitioned data cannot do: ``fraction`` < 1, a step that fits statistics.

        The party process runs this before any partition is read, so the message (naming the step)
        reaches the developer as it is, whatever engine holds the partitions. ``columns``: a
        vertical party's columns (from the files' footers); each step is then judged as it
        applies to them (:func:`localize_step`), so a step on another party's columns is no
        obstacle.
        """
        parties = self._state.party_map()
        if party not in parties:
            raise InvalidParameterError(
                f"provision: party {party!r} is not a participant; participants: {sorted(parties)}"
            )
        p = parties[party]
        where = f"party {party!r}, dataset {p.dataset!r} (partitioned)"
        if p.fraction < 1.0:
            raise InvalidParameterError(
                f"{where}: fraction {p.fraction} samples rows of the whole dataset; on partitioned data "
                "it must be 1 (filter rows with a filter step instead)"
            )
        for step in self.pipeline:
            local = step if columns is None else localize_step(step, set(columns))
            if local is not None and not row_local(local):
                raise InvalidParameterError(
                    f"{where}: step {step.name!r} ({step.op}) fits statistics over all rows; on partitioned "
                    "data every step must be row-local (impute with strategy constant, scale minmax with "
                    "bounds for every column, encode with categories for every column)"
                )

    def provision_partition(self, party: str, table: Table, partition: int) -> Provisioned:
        """``party``'s arrays from one partition of its dataset (run where the partition is held).

        The partitioned counterpart of :meth:`provision`, for data no one process holds
        (:mod:`confide.compute`). Every step must be row-local (:func:`row_local`): its result
        for a row depends on that row alone, so the partitions' results are the whole dataset's.
        ``fraction`` must be 1. The test split is drawn per row: row r of partition p is a test
        row when ``np.random.default_rng([seed, i, p]).random(rows)[r] < test_fraction`` (``i``:
        the party's index among the sorted participants), whatever the other partitions hold.
        """
        parties = self._state.party_map()
        where = f"party {party!r}, partition {partition}"
        self.check_partitionable(party)
        p = parties[party]
        if table.rows == 0:
            raise InvalidParameterError(f"{where}: the partition has no rows")
        _p, _rng, _where, last, cols, _rows, fitted, _ran = self._run_pipeline(party, table)
        features = self._checked_features(
            where, last, cols, self.label, "check fl_data.label against the dataset's published schema"
        )
        X = np.column_stack([cols[c].astype(np.float64) for c in features])
        y = cols[self.label].astype(np.float64)
        index = sorted(parties).index(party)
        is_test = np.random.default_rng([p.seed, index, partition]).random(X.shape[0]) < p.test_fraction
        return Provisioned(X[~is_test], y[~is_test], X[is_test], y[is_test], features, fitted, np.flatnonzero(is_test))

    def provision_columns(self, party: str, table: Table, *, id_column: str, with_label: bool) -> VerticalRows:
        """``party``'s columns of a vertical job: record ids, features, and the label at the guest.

        The id column is taken out before the pipeline (no step sees it, so a numeric id is never
        scaled or imputed) and follows the rows that steps keep. Each step applies to the
        columns this party holds (:func:`localize_step`): the parties of a vertical job hold
        different columns, and one pipeline describes them all. Rows are not split: a vertical
        job splits its training and test rows after PSI has aligned the parties. Features must
        be numeric without missing values, as in :meth:`provision`; ids must be present, unique,
        and integers or text.
        """
        where = f"party {party!r}"
        if self.join_column is not None and self.join_column != id_column:
            raise InvalidParameterError(
                f"{where}: the pipeline joins by {self.join_column!r} but the job's id column is {id_column!r}"
            )
        columns = table.columns
        ids = take_ids(where, columns, id_column, "set data.id_column to the column holding the record ids")
        p, _rng, where, last, cols, row_numbers, fitted, ran = self._run_pipeline(party, Table(columns), localize=True)
        label = self.label if with_label else None
        hint = "the guest holds the label: check fl_data.label against its published schema"
        features = self._checked_features(where, last, cols, label, hint)
        X = np.column_stack([cols[c].astype(np.float64) for c in features])
        y = cols[label].astype(np.float64) if label is not None else None
        steps = [None if step is None else step.to_dict() for step in ran]
        return VerticalRows(ids[row_numbers], X, y, features, fitted, steps)

    def _run_pipeline(self, party: str, table: Table, localize: bool = False):
        parties = self._state.party_map()
        if party not in parties:
            raise InvalidParameterError(
                f"provision: party {party!r} is not a participant; participants: {sorted(parties)}"
            )
        if not isinstance(table, Table):
            raise InvalidParameterError(f"provision: table must be a confide.data.Table, got {type(table).__name__}")
        p = parties[party]
        index = sorted(parties).index(party)
        rng = np.random.default_rng([p.seed, index])
        where = f"party {party!r}"
        if not localize and self.join_column is not None:
            raise InvalidParameterError(
                f"{where}: step {self.pipeline[-1].name!r} (join) joins the records of a vertical job "
                "(provision_columns); a horizontal job's FL_Data cannot hold one"
            )
        n = table.rows
        if n == 0:
            raise InvalidParameterError(f"{where}: dataset {p.dataset!r} has no rows")
        cols = table.columns
        cols[ROW] = np.arange(n, dtype=np.int64)
        if p.fraction < 1.0:
            k = max(1, round(p.fraction * n))
            rows = np.sort(rng.choice(n, size=k, replace=False))
            cols = {c: v[rows] for c, v in cols.items()}
        fitted: list[dict] = []
        ran: list[Step | None] = []
        for step in self._state.pipeline:
            fitted.append({})
            local = localize_step(step, set(cols)) if localize else step
            ran.append(local)
            if local is not None:
                cols = run_step(party, local, cols, self.label, record=fitted[-1])
        last = f"after the pipeline (last step {self.pipeline[-1].name!r})" if self.pipeline else "(empty pipeline)"
        row_numbers = cols.pop(ROW)
        return p, rng, where, last, cols, row_numbers, fitted, ran

    @staticmethod
    def _checked_features(where: str, last: str, cols: dict, label: str | None, label_hint: str = "") -> list[str]:
        """Feature names after the pipeline: numeric, complete; the label (when given) present and so."""
        if label is not None and label not in cols:
            raise DataProblemError(
                f"{where}, {last}: label column {label!r} is not in the table; columns: {list(cols)[:50]}",
                columns=[label],
                hint=label_hint,
            )
        features = [c for c in cols if c != label]
        if not features:
            raise DataProblemError(f"{where}, {last}: no feature columns are left", hint="select fewer columns away")
        for c in [*features, *([label] if label is not None else [])]:
            what = "label" if c == label else "feature"
            if column_kind(cols[c]) == "str":
                raise DataProblemError(
                    f"{where}, {last}: {what} column {c!r} is text",
                    columns=[c],
                    hint="the label must be a number"
                    if c == label
                    else text_hint(len({v for v in cols[c] if v is not None})),
                )
            nan = int(missing_mask(cols[c]).sum())
            if nan:
                raise DataProblemError(
                    f"{where}, {last}: {what} column {c!r} has {nan} missing values",
                    columns=[c],
                    hint="add a filter step {op: notnull} on it"
                    if c == label
                    else "add an impute step (or a notnull filter)",
                )
        return features

    # -------------------------------------------------- dunder

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FLData):
            return NotImplemented
        return self._entries == other._entries

    def __hash__(self) -> int:
        return hash((self.fingerprint, len(self._entries)))

    def __repr__(self) -> str:
        flag = ", frozen" if self.frozen else ""
        return (
            f"FLData(v{self.version}, {len(self._state.participants)} participants, label={self.label!r}, "
            f"{len(self.pipeline)} steps{flag}, fingerprint={self.fingerprint[:12]})"
        )
