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
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from confide._checks import check_int, check_real
from confide.data.catalog import Table, check_dataset_name
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


class FLDataConflictError(InvalidParameterError):
    """A merge found the same participant, step, label or step order changed differently on both sides.

    Attributes
    ----------
    conflicts : list of str
        One line per conflict, naming it.
    """

    def __init__(self, conflicts: Sequence[str]) -> None:
        self.conflicts = list(conflicts)
        super().__init__("merge conflict: " + "; ".join(self.conflicts))


# ---------------------------------------------------------------------- small checks


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


# ---------------------------------------------------------------------- Participant


@dataclass(frozen=True)
class Participant:
    """What one party contributes.

    Attributes
    ----------
    dataset : str
        Name of the dataset in the party's catalog (1..64 characters of ``[a-z0-9_-]``).
    fraction : float, default 1.0
        Share of the dataset's rows used, in (0, 1]; the rows are sampled with ``seed``.
    test_fraction : float, default 0.2
        Share of the rows (after the pipeline) held out locally for metrics, in [0, 0.9].
    seed : int, default 0
        Seed of the sampling and of the test split, >= 0.
    """

    dataset: str
    fraction: float = 1.0
    test_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        checked = _participant_fields("Participant", self.dataset, self.fraction, self.test_fraction, self.seed)
        for key, value in checked.items():
            object.__setattr__(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        """``{"dataset", "fraction", "test_fraction", "seed"}``."""
        return {
            "dataset": self.dataset,
            "fraction": self.fraction,
            "test_fraction": self.test_fraction,
            "seed": self.seed,
        }


def _participant_fields(where: str, dataset: Any, fraction: Any, test_fraction: Any, seed: Any) -> dict[str, Any]:
    dataset = check_dataset_name(f"{where}.dataset", dataset)
    fraction = check_real(f"{where}.fraction", fraction)
    if not 0.0 < fraction <= 1.0:
        raise InvalidParameterError(f"{where}.fraction must be in (0, 1], got {fraction}")
    test_fraction = check_real(f"{where}.test_fraction", test_fraction)
    if not 0.0 <= test_fraction <= _MAX_TEST_FRACTION:
        raise InvalidParameterError(f"{where}.test_fraction must be in [0, {_MAX_TEST_FRACTION}], got {test_fraction}")
    seed = check_int(f"{where}.seed", seed, 0, 2**63 - 1)
    return {"dataset": dataset, "fraction": fraction, "test_fraction": test_fraction, "seed": seed}


def _participant(where: str, value: Any, base: Participant | None = None) -> Participant:
    """A Participant from a Participant, a dataset name, or a mapping (partial, over ``base``, if given)."""
    if isinstance(value, Participant):
        return value
    if isinstance(value, str):
        return Participant(**_participant_fields(where, value, 1.0, 0.2, 0))
    fields = ("dataset", "fraction", "test_fraction", "seed")
    if base is None:
        _keys(where, value, ("dataset",), fields[1:])
        merged = {"fraction": 1.0, "test_fraction": 0.2, "seed": 0, **value}
    else:
        _keys(where, value, (), fields)
        merged = {**base.to_dict(), **value}
    return Participant(**_participant_fields(where, *(merged[k] for k in fields)))


# ---------------------------------------------------------------------- Step


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


# ---------------------------------------------------------------------- state


@dataclass(frozen=True)
class _State:
    participants: tuple[tuple[str, Participant], ...]  # sorted by party name
    label: str
    pipeline: tuple[Step, ...]
    frozen: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "participants": {name: p.to_dict() for name, p in self.participants},
            "label": self.label,
            "pipeline": [s.to_dict() for s in self.pipeline],
            "frozen": self.frozen,
        }

    def fingerprint(self) -> str:
        return _sha256(self.to_dict())

    def party_map(self) -> dict[str, Participant]:
        return dict(self.participants)


def _make_state(participants: Mapping[str, Participant], label: str, pipeline: Sequence[Step], frozen: bool) -> _State:
    """Check the cross-field rules and build a state."""
    if not participants:
        raise InvalidParameterError("participants must keep at least 1 participant")
    if len(participants) > _MAX_PARTIES:
        raise InvalidParameterError(f"participants must have at most {_MAX_PARTIES} entries, got {len(participants)}")
    if len(pipeline) > _MAX_STEPS:
        raise InvalidParameterError(f"pipeline must have at most {_MAX_STEPS} steps, got {len(pipeline)}")
    names = [s.name for s in pipeline]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidParameterError(f"pipeline: step name {dup!r} is used more than once (step names must be unique)")
    for s in pipeline:
        if s.op == "drop" and label in s._params["columns"]:
            raise InvalidParameterError(f"step {s.name!r} (drop): columns must not include the label {label!r}")
    joins = [s for s in pipeline if s.op == "join"]
    if joins and (len(joins) > 1 or pipeline[-1].op != "join"):
        raise InvalidParameterError(
            f"step {joins[0].name!r} (join): a vertical job joins its parties' records once, as the last step "
            "(every other step runs on each party's own rows before the join)"
        )
    if joins and joins[0]._params["by"] == label:
        raise InvalidParameterError(f"step {joins[0].name!r} (join): by must not be the label {label!r}")
    return _State(tuple(sorted(participants.items())), label, tuple(pipeline), bool(frozen))


def _participants_arg(where: str, value: Any, base: Mapping[str, Participant] | None = None) -> dict[str, Participant]:
    if not isinstance(value, Mapping):
        raise InvalidParameterError(
            f"{where} must be a mapping of party name to participant, got {type(value).__name__}"
        )
    out = {}
    for name, p in value.items():
        _party_name(f"{where} key", name)
        out[name] = _participant(f"{where}[{name!r}]", p, None if base is None else base.get(name))
    return out


def _steps_arg(where: str, value: Any) -> list[Step]:
    if isinstance(value, (str, Mapping, Step)) or not isinstance(value, Sequence):
        raise InvalidParameterError(f"{where} must be a list of steps, got {type(value).__name__}")
    return [Step.from_value(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _state_from_dict(where: str, value: Any) -> _State:
    d = _keys(where, value, ("participants", "label", "pipeline", "frozen"))
    if not isinstance(d["frozen"], bool):
        raise InvalidParameterError(f"{where}.frozen must be true or false, got {d['frozen']!r}")
    participants = _participants_arg(f"{where}.participants", d["participants"])
    label = _column(f"{where}.label", d["label"])
    return _make_state(participants, label, _steps_arg(f"{where}.pipeline", d["pipeline"]), d["frozen"])


def _apply(states: Sequence[_State], operation: str, args: Any) -> tuple[_State, dict[str, Any]]:
    """Apply one lineage entry to the history ``states``; returns the new state and canonical arguments.

    Used both by the public methods (with arguments they built) and by import (replay), so an
    imported lineage is checked by exactly the code that produced it.
    """
    if operation == "create":
        if states:
            raise InvalidParameterError("lineage: 'create' may only be the first entry (version 0)")
        a = _keys("create", args, ("participants", "label", "pipeline"))
        participants = _participants_arg("participants", a["participants"])
        label = _column("label", a["label"])
        state = _make_state(participants, label, _steps_arg("pipeline", a["pipeline"]), False)
        return state, {k: v for k, v in state.to_dict().items() if k != "frozen"}
    if not states:
        raise InvalidParameterError(f"lineage: the first entry must be 'create', got {operation!r}")
    cur = states[-1]
    if cur.frozen:
        raise InvalidParameterError(
            f"{operation}: this FLData is frozen (fingerprint {cur.fingerprint()[:12]}); it can be provisioned, "
            "exported, compared and diffed, but not changed"
        )
    if operation == "participants_shaping":
        a = _keys("participants_shaping", args, ("add", "remove", "update"))
        parties = cur.party_map()
        remove = a["remove"]
        if isinstance(remove, str) or not isinstance(remove, Sequence):
            raise InvalidParameterError(f"participants_shaping.remove must be a list of party names, got {remove!r}")
        remove = [_party_name(f"participants_shaping.remove[{i}]", r) for i, r in enumerate(remove)]
        add = _participants_arg("participants_shaping.add", a["add"])
        if isinstance(a["update"], Mapping):
            for n in a["update"]:
                if n not in parties or n in remove:
                    raise InvalidParameterError(
                        f"participants_shaping.update: unknown party {n!r}; participants: {sorted(parties)}"
                    )
        update = _participants_arg("participants_shaping.update", a["update"], parties)
        if not (add or remove or update):
            raise InvalidParameterError(
                "participants_shaping: nothing to change (add, remove and update are all empty)"
            )
        seen: dict[str, str] = {}
        for field, names in (("remove", remove), ("add", list(add)), ("update", list(update))):
            for n in names:
                if n in seen:
                    raise InvalidParameterError(
                        f"participants_shaping: party {n!r} appears in both {seen[n]} and {field} (or twice)"
                    )
                seen[n] = field
        for n in remove:
            if n not in parties:
                raise InvalidParameterError(
                    f"participants_shaping.remove: unknown party {n!r}; participants: {sorted(parties)}"
                )
            del parties[n]
        parties.update(update)
        for n, p in add.items():
            if n in parties:
                raise InvalidParameterError(
                    f"participants_shaping.add: party {n!r} is already a participant (use update to change it)"
                )
            parties[n] = p
        if not parties:
            raise InvalidParameterError("participants_shaping.remove: at least 1 participant must remain")
        state = _make_state(parties, cur.label, cur.pipeline, False)
        canon = {
            "add": {n: p.to_dict() for n, p in sorted(add.items())},
            "remove": sorted(remove),
            "update": {n: p.to_dict() for n, p in sorted(update.items())},
        }
        return state, canon
    if operation == "pipeline_shaping":
        a = _keys("pipeline_shaping", args, ("append", "insert", "remove"))
        remove = a["remove"]
        if isinstance(remove, str) or not isinstance(remove, Sequence):
            raise InvalidParameterError(f"pipeline_shaping.remove must be a list of step names, got {remove!r}")
        steps = list(cur.pipeline)
        names = [s.name for s in steps]
        for r in remove:
            if r not in names:
                raise InvalidParameterError(f"pipeline_shaping.remove: unknown step {r!r}; steps: {names}")
        if len(set(remove)) != len(remove):
            raise InvalidParameterError("pipeline_shaping.remove lists a step more than once")
        steps = [s for s in steps if s.name not in remove]
        insert = a["insert"]
        canon_insert = None
        if insert is not None:
            ins = _keys("pipeline_shaping.insert", insert, ("index", "step"))
            index = check_int("pipeline_shaping.insert.index", ins["index"], 0, len(steps))
            step = Step.from_value(ins["step"], "pipeline_shaping.insert.step")
            steps.insert(index, step)
            canon_insert = {"index": index, "step": step.to_dict()}
        append = _steps_arg("pipeline_shaping.append", a["append"])
        steps.extend(append)
        if not (remove or insert is not None or append):
            raise InvalidParameterError("pipeline_shaping: nothing to change (append, insert and remove are all empty)")
        state = _make_state(cur.party_map(), cur.label, steps, False)
        return state, {"append": [s.to_dict() for s in append], "insert": canon_insert, "remove": list(remove)}
    if operation == "pipeline_substitute":
        a = _keys("pipeline_substitute", args, ("name", "step"))
        names = [s.name for s in cur.pipeline]
        if a["name"] not in names:
            raise InvalidParameterError(f"pipeline_substitute.name: unknown step {a['name']!r}; steps: {names}")
        step = Step.from_value(a["step"], "pipeline_substitute.step", default_name=a["name"])
        steps = list(cur.pipeline)
        steps[names.index(a["name"])] = step
        state = _make_state(cur.party_map(), cur.label, steps, False)
        return state, {"name": a["name"], "step": step.to_dict()}
    if operation == "rollback":
        a = _keys("rollback", args, ("version",))
        version = check_int("rollback.version", a["version"], 0, len(states) - 1)
        return states[version], {"version": version}
    if operation == "freeze":
        _keys("freeze", args, ())
        return _State(cur.participants, cur.label, cur.pipeline, True), {}
    if operation == "merge":
        a = _keys("merge", args, ("ancestor", "other", "state"))
        ancestor = check_int("merge.ancestor", a["ancestor"], 0, len(states) - 1)
        other = a["other"]
        if not isinstance(other, str) or not re.fullmatch(r"[0-9a-f]{64}", other):
            raise InvalidParameterError(f"merge.other must be a sha256 hex fingerprint, got {other!r}")
        state = _state_from_dict("merge.state", a["state"])
        if state.frozen:
            raise InvalidParameterError("merge.state.frozen must be false")
        return state, {"ancestor": ancestor, "other": other, "state": state.to_dict()}
    raise InvalidParameterError(
        "lineage operation must be one of create, participants_shaping, pipeline_shaping, pipeline_substitute, "
        f"rollback, freeze, merge; got {operation!r}"
    )


# ---------------------------------------------------------------------- diff and merge


def _diff_states(a: _State, b: _State) -> dict[str, Any]:
    pa, pb = a.party_map(), b.party_map()
    sa = {s.name: s for s in a.pipeline}
    sb = {s.name: s for s in b.pipeline}
    common_a = [s.name for s in a.pipeline if s.name in sb]
    common_b = [s.name for s in b.pipeline if s.name in sa]
    return {
        "participants": {
            "added": {n: pb[n].to_dict() for n in sorted(pb) if n not in pa},
            "removed": [n for n in sorted(pa) if n not in pb],
            "changed": {
                n: {"from": pa[n].to_dict(), "to": pb[n].to_dict()} for n in sorted(pa) if n in pb and pa[n] != pb[n]
            },
        },
        "label": None if a.label == b.label else {"from": a.label, "to": b.label},
        "pipeline": {
            "added": [s.to_dict() for s in b.pipeline if s.name not in sa],
            "removed": [s.name for s in a.pipeline if s.name not in sb],
            "changed": [
                {"name": n, "from": sa[n].to_dict(), "to": sb[n].to_dict()} for n in common_a if sa[n] != sb[n]
            ],
            "order": common_a != common_b,
        },
        "frozen": None if a.frozen == b.frozen else {"from": a.frozen, "to": b.frozen},
    }


def is_empty_diff(diff: Mapping[str, Any]) -> bool:
    """True when a :meth:`FLData.diff` result records no change at all."""
    p, s = diff["participants"], diff["pipeline"]
    return (
        not p["added"]
        and not p["removed"]
        and not p["changed"]
        and diff["label"] is None
        and not s["added"]
        and not s["removed"]
        and not s["changed"]
        and not s["order"]
        and diff.get("frozen") is None
    )


_ABSENT = object()


def _pick(what: str, base: Any, a: Any, b: Any, conflicts: list[str]) -> Any:
    """Three-way choice for one item (``_ABSENT`` = not there)."""
    if a == b:
        return a
    if a == base:
        return b
    if b == base:
        return a

    def show(v: Any) -> str:
        if v is _ABSENT:
            return "removed"
        if isinstance(v, (Participant, Step)):
            return f"{v.to_dict()}"
        return repr(v)

    conflicts.append(f"{what} changed differently on both sides ({show(a)} vs {show(b)})")
    return a


def _runs(
    order: Sequence[str], common: set[str], position: Mapping[str, int], conflicts: list[str]
) -> dict[str | None, list[str]]:
    """Steps of one side not in ``common``, grouped by the common step they go right after (None = the start).

    ``order`` is that side's pipeline and ``position`` the merged order of the common steps. A step
    goes after every common step before it on its side, so right after the last of those in the
    merged order. When a common step after it on its side comes earlier in the merged order than
    that one (the other side swapped the steps it sits between), it cannot keep its place on its
    side: that is an order conflict, added to ``conflicts``.
    """
    earliest_after: list[str | None] = [None] * (len(order) + 1)
    for index in range(len(order) - 1, -1, -1):
        following = earliest_after[index + 1]
        name = order[index]
        if name in common and (following is None or position[name] < position[following]):
            following = name
        earliest_after[index] = following
    runs: dict[str | None, list[str]] = {}
    anchor: str | None = None
    for index, name in enumerate(order):
        if name in common:
            if anchor is None or position[name] > position[anchor]:
                anchor = name
            continue
        following = earliest_after[index + 1]
        if anchor is not None and following is not None and position[following] < position[anchor]:
            conflicts.append(
                f"pipeline order changed differently on both sides (step {name!r} comes after {anchor!r} and "
                f"before {following!r} on one side, but the other side put {following!r} before {anchor!r})"
            )
        runs.setdefault(anchor, []).append(name)
    return runs


def _merge_states(base: _State, a: _State, b: _State) -> _State:
    conflicts: list[str] = []
    pbase, pa, pb = base.party_map(), a.party_map(), b.party_map()
    parties = {}
    for n in sorted(set(pbase) | set(pa) | set(pb)):
        v = _pick(f"participant {n!r}", pbase.get(n, _ABSENT), pa.get(n, _ABSENT), pb.get(n, _ABSENT), conflicts)
        if v is not _ABSENT:
            parties[n] = v
    label = _pick("label", base.label, a.label, b.label, conflicts)

    sbase = {s.name: s for s in base.pipeline}
    sa = {s.name: s for s in a.pipeline}
    sb = {s.name: s for s in b.pipeline}
    steps = {}
    for n in sorted(set(sbase) | set(sa) | set(sb)):
        v = _pick(f"step {n!r}", sbase.get(n, _ABSENT), sa.get(n, _ABSENT), sb.get(n, _ABSENT), conflicts)
        if v is not _ABSENT:
            steps[n] = v
    # Order: the steps kept by both sides keep the order of the side that changed it (both
    # changing it differently is a conflict); a step only one side has keeps its place among
    # the steps of its side that both sides have: it goes right after the last of those before
    # it (see _runs; the other side's reordering making that impossible is a conflict). Two such
    # runs at the same place are concatenated in the order of their first step's name, so the
    # result is symmetric.
    order_a = [s.name for s in a.pipeline if s.name in steps]
    order_b = [s.name for s in b.pipeline if s.name in steps]
    order_base = [s.name for s in base.pipeline if s.name in steps]
    common = set(order_a) & set(order_b)
    ca = [n for n in order_a if n in common]
    cb = [n for n in order_b if n in common]
    cbase = [n for n in order_base if n in common]
    if ca == cb or cb == cbase:
        chosen = ca
    elif ca == cbase:
        chosen = cb
    else:
        conflicts.append(f"pipeline order changed differently on both sides ({ca} vs {cb})")
        chosen = ca
    if conflicts:
        raise FLDataConflictError(conflicts)
    position = {n: i for i, n in enumerate(chosen)}
    runs_a, runs_b = _runs(order_a, common, position, conflicts), _runs(order_b, common, position, conflicts)
    if conflicts:
        raise FLDataConflictError(conflicts)
    order: list[str] = []
    for anchor in [None, *chosen]:
        if anchor is not None:
            order.append(anchor)
        groups = [r for r in (runs_a.get(anchor), runs_b.get(anchor)) if r]
        for run in sorted(groups, key=lambda r: r[0]):
            order.extend(run)
    return _make_state(parties, label, [steps[n] for n in order], False)


# ---------------------------------------------------------------------- provisioning


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
    """

    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray | None
    y_test: np.ndarray | None
    feature_names: list[str]
    fitted: list[dict] | None = None
    test_rows: np.ndarray | None = None


@dataclass
class VerticalRows:
    """One party's rows of a vertical job (:meth:`FLData.provision_columns`), before PSI."""

    ids: np.ndarray
    X: np.ndarray
    y: np.ndarray | None
    feature_names: list[str]
    fitted: list[dict] | None = None


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

    ``fitted``: :attr:`Provisioned.fitted` of the training run (imputation values, scaling,
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


# ---------------------------------------------------------------------- FLData


class FLData:
    """Participants, label and pipeline of a federated dataset, with the lineage of every change.

    Build one with :meth:`create` (or :meth:`from_dict` / :meth:`from_json`); never holds rows.
    Equality compares state and lineage; :attr:`fingerprint` identifies the state alone.
    """

    __slots__ = ("_states", "_entries")

    def __init__(self, _states: tuple[_State, ...], _entries: tuple[dict[str, Any], ...]) -> None:
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
        state, canon = _apply(self._states, operation, args)
        entry = {
            "version": len(self._entries),
            "operation": operation,
            "arguments": canon,
            "fingerprint": state.fingerprint(),
        }
        return FLData((*self._states, state), (*self._entries, entry))

    # -------------------------------------------------- state

    @property
    def _state(self) -> _State:
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
        return _diff_states(self._state, other._state)

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
        merged = _merge_states(self._states[k - 1], self._state, other._state)
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
        d = _keys("FLData export", data, ("format", "version", "state", "lineage"))
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
            e = _keys(where, entry, ("version", "operation", "arguments", "fingerprint"))
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
        p, rng, where, last, cols, row_numbers, fitted = self._run_pipeline(party, table)
        label = self.label
        features = self._checked_features(
            where, last, cols, label, "check fl_data.label against the dataset's published schema"
        )
        X = np.column_stack([cols[c].astype(np.float64) for c in features])
        y = cols[label].astype(np.float64)
        n = X.shape[0]
        if p.test_fraction == 0.0:
            return Provisioned(X, y, None, None, features, fitted, row_numbers[:0])
        n_test = max(1, round(p.test_fraction * n))
        if n_test >= n:
            raise InvalidParameterError(
                f"{where}, {last}: {n} rows are too few for test_fraction {p.test_fraction} (no training rows left)"
            )
        is_test = np.zeros(n, dtype=bool)
        is_test[rng.permutation(n)[:n_test]] = True
        return Provisioned(X[~is_test], y[~is_test], X[is_test], y[is_test], features, fitted, row_numbers[is_test])

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
        _p, _rng, _where, last, cols, _rows, fitted = self._run_pipeline(party, table)
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
        if id_column not in columns:
            raise DataProblemError(
                f"{where}: id column {id_column!r} is not in the table; columns: {list(columns)[:50]}",
                columns=[id_column],
                hint="set data.id_column to the column holding the record ids",
            )
        ids = _record_ids(where, id_column, columns.pop(id_column))
        p, _rng, where, last, cols, row_numbers, fitted = self._run_pipeline(party, Table(columns), localize=True)
        label = self.label if with_label else None
        hint = "the guest holds the label: check fl_data.label against its published schema"
        features = self._checked_features(where, last, cols, label, hint)
        X = np.column_stack([cols[c].astype(np.float64) for c in features])
        y = cols[label].astype(np.float64) if label is not None else None
        return VerticalRows(ids[row_numbers], X, y, features, fitted)

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
        for step in self._state.pipeline:
            fitted.append({})
            local = localize_step(step, set(cols)) if localize else step
            if local is not None:
                cols = _run_step(party, local, cols, self.label, record=fitted[-1])
        last = f"after the pipeline (last step {self.pipeline[-1].name!r})" if self.pipeline else "(empty pipeline)"
        row_numbers = cols.pop(ROW)
        return p, rng, where, last, cols, row_numbers, fitted

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
            if _kind(cols[c]) == "str":
                raise DataProblemError(
                    f"{where}, {last}: {what} column {c!r} is text",
                    columns=[c],
                    hint="the label must be a number" if c == label else "add an encode step for it, or drop it",
                )
            nan = int(_missing(cols[c]).sum())
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
