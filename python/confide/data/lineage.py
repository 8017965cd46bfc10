"""FL_Data's lineage: the participants and pipeline as versioned states, their diff and merge.

Every operation on an :class:`~confide.data.fldata.FLData` appends a state (:func:`apply_change`), so an
earlier version can be restored, two versions compared (:func:`diff_states`) and two branches
merged three ways (:func:`merge_states`, conflicts raised as :class:`FLDataConflictError`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confide._checks import check_int, check_real
from confide.data.catalog import check_dataset_name
from confide.data.flops import column_name, keys
from confide.data.flsteps import MAX_PARTIES, MAX_STEPS, MAX_TEST_FRACTION, Step, party_name, sha256_of
from confide.errors import InvalidParameterError


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
    if not 0.0 <= test_fraction <= MAX_TEST_FRACTION:
        raise InvalidParameterError(f"{where}.test_fraction must be in [0, {MAX_TEST_FRACTION}], got {test_fraction}")
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
        keys(where, value, ("dataset",), fields[1:])
        merged = {"fraction": 1.0, "test_fraction": 0.2, "seed": 0, **value}
    else:
        keys(where, value, (), fields)
        merged = {**base.to_dict(), **value}
    return Participant(**_participant_fields(where, *(merged[k] for k in fields)))


@dataclass(frozen=True)
class LineageState:
    """One version of an FL_Data: its participants, label, pipeline and whether it is frozen."""

    participants: tuple[tuple[str, Participant], ...]  # sorted by party name
    label: str
    pipeline: tuple[Step, ...]
    frozen: bool

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON-ready data (what its fingerprint is taken of)."""
        return {
            "participants": {name: p.to_dict() for name, p in self.participants},
            "label": self.label,
            "pipeline": [s.to_dict() for s in self.pipeline],
            "frozen": self.frozen,
        }

    def fingerprint(self) -> str:
        """SHA-256 of the canonical JSON of :meth:`to_dict`."""
        return sha256_of(self.to_dict())

    def party_map(self) -> dict[str, Participant]:
        """Participants by party name."""
        return dict(self.participants)


def _make_state(
    participants: Mapping[str, Participant], label: str, pipeline: Sequence[Step], frozen: bool
) -> LineageState:
    """Check the cross-field rules and build a state."""
    if not participants:
        raise InvalidParameterError("participants must keep at least 1 participant")
    if len(participants) > MAX_PARTIES:
        raise InvalidParameterError(f"participants must have at most {MAX_PARTIES} entries, got {len(participants)}")
    if len(pipeline) > MAX_STEPS:
        raise InvalidParameterError(f"pipeline must have at most {MAX_STEPS} steps, got {len(pipeline)}")
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
    return LineageState(tuple(sorted(participants.items())), label, tuple(pipeline), bool(frozen))


def _participants_arg(where: str, value: Any, base: Mapping[str, Participant] | None = None) -> dict[str, Participant]:
    if not isinstance(value, Mapping):
        raise InvalidParameterError(
            f"{where} must be a mapping of party name to participant, got {type(value).__name__}"
        )
    out = {}
    for name, p in value.items():
        party_name(f"{where} key", name)
        out[name] = _participant(f"{where}[{name!r}]", p, None if base is None else base.get(name))
    return out


def _steps_arg(where: str, value: Any) -> list[Step]:
    if isinstance(value, (str, Mapping, Step)) or not isinstance(value, Sequence):
        raise InvalidParameterError(f"{where} must be a list of steps, got {type(value).__name__}")
    return [Step.from_value(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _state_from_dict(where: str, value: Any) -> LineageState:
    d = keys(where, value, ("participants", "label", "pipeline", "frozen"))
    if not isinstance(d["frozen"], bool):
        raise InvalidParameterError(f"{where}.frozen must be true or false, got {d['frozen']!r}")
    participants = _participants_arg(f"{where}.participants", d["participants"])
    label = column_name(f"{where}.label", d["label"])
    return _make_state(participants, label, _steps_arg(f"{where}.pipeline", d["pipeline"]), d["frozen"])


def apply_change(states: Sequence[LineageState], operation: str, args: Any) -> tuple[LineageState, dict[str, Any]]:
    """Apply one lineage entry to the history ``states``; returns the new state and canonical arguments.

    Used both by the public methods (with arguments they built) and by import (replay), so an
    imported lineage is checked by exactly the code that produced it.
    """
    if operation == "create":
        if states:
            raise InvalidParameterError("lineage: 'create' may only be the first entry (version 0)")
        a = keys("create", args, ("participants", "label", "pipeline"))
        participants = _participants_arg("participants", a["participants"])
        label = column_name("label", a["label"])
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
        a = keys("participants_shaping", args, ("add", "remove", "update"))
        parties = cur.party_map()
        remove = a["remove"]
        if isinstance(remove, str) or not isinstance(remove, Sequence):
            raise InvalidParameterError(f"participants_shaping.remove must be a list of party names, got {remove!r}")
        remove = [party_name(f"participants_shaping.remove[{i}]", r) for i, r in enumerate(remove)]
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
        a = keys("pipeline_shaping", args, ("append", "insert", "remove"))
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
            ins = keys("pipeline_shaping.insert", insert, ("index", "step"))
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
        a = keys("pipeline_substitute", args, ("name", "step"))
        names = [s.name for s in cur.pipeline]
        if a["name"] not in names:
            raise InvalidParameterError(f"pipeline_substitute.name: unknown step {a['name']!r}; steps: {names}")
        step = Step.from_value(a["step"], "pipeline_substitute.step", default_name=a["name"])
        steps = list(cur.pipeline)
        steps[names.index(a["name"])] = step
        state = _make_state(cur.party_map(), cur.label, steps, False)
        return state, {"name": a["name"], "step": step.to_dict()}
    if operation == "rollback":
        a = keys("rollback", args, ("version",))
        version = check_int("rollback.version", a["version"], 0, len(states) - 1)
        return states[version], {"version": version}
    if operation == "freeze":
        keys("freeze", args, ())
        return LineageState(cur.participants, cur.label, cur.pipeline, True), {}
    if operation == "merge":
        a = keys("merge", args, ("ancestor", "other", "state"))
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


def diff_states(a: LineageState, b: LineageState) -> dict[str, Any]:
    """What changed from ``a`` to ``b``: participants, label, steps added, removed, changed, reordered."""
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


def merge_states(base: LineageState, a: LineageState, b: LineageState) -> LineageState:
    """A three-way merge of ``a`` and ``b`` from ``base``; FLDataConflictError names every clash."""
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
