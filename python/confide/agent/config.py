"""Configuration deltas and digests: what the controller computes and an agent applies.

A delta is a list of leaf operations ``{"op": "set" | "remove", "path": [...], "value": ...}``
turning one configuration into another (lists are leaves, replaced whole); a digest is the
SHA-256 of a configuration's canonical JSON. The controller sends an agent the delta from the
configuration it last applied and the digest of the result; the agent applies it and checks
the digest (:mod:`confide.controller.sessions` explains the session log these come from).
Pure: no I/O.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from confide.errors import InvalidParameterError

__all__ = ["apply_delta", "canonical", "config_digest", "delta"]


def canonical(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def config_digest(config: dict) -> str:
    """SHA-256 hex digest of a configuration's canonical JSON."""
    return hashlib.sha256(canonical(config)).hexdigest()


def delta(old: dict | None, new: dict | None) -> list[dict]:
    """Leaf operations turning ``old`` into ``new`` (empty when equal).

    ``old is None`` (a new recipient) gives one ``set`` of the whole configuration at path ``[]``;
    ``new is None`` (a recipient removed) gives one ``remove`` at ``[]``.
    """
    if old is None and new is None:
        return []
    if old is None:
        return [{"op": "set", "path": [], "value": copy.deepcopy(new)}]
    if new is None:
        return [{"op": "remove", "path": []}]
    ops: list[dict] = []
    _diff(old, new, [], ops)
    return ops


def _diff(old: Any, new: Any, path: list, ops: list[dict]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            if key not in new:
                ops.append({"op": "remove", "path": [*path, key]})
            elif key not in old:
                ops.append({"op": "set", "path": [*path, key], "value": copy.deepcopy(new[key])})
            else:
                _diff(old[key], new[key], [*path, key], ops)
    elif canonical(old) != canonical(new):
        ops.append({"op": "set", "path": list(path), "value": copy.deepcopy(new)})


def apply_delta(config: dict | None, ops: list[dict]) -> dict | None:
    """Apply :func:`delta` operations to a copy of ``config``; returns the new configuration."""
    result = copy.deepcopy(config)
    for number, op in enumerate(ops):
        kind, path = op.get("op"), op.get("path")
        if kind not in ("set", "remove") or not isinstance(path, list):
            raise InvalidParameterError(f"delta operation {number} is malformed: {op!r}")
        if not path:
            result = copy.deepcopy(op.get("value")) if kind == "set" else None
            continue
        if not isinstance(result, dict):
            raise InvalidParameterError(f"delta operation {number} edits a configuration that does not exist")
        parent = result
        for key in path[:-1]:
            child = parent.get(key)
            if not isinstance(child, dict):
                child = {}
                parent[key] = child
            parent = child
        if kind == "set":
            parent[path[-1]] = copy.deepcopy(op["value"])
        else:
            parent.pop(path[-1], None)
    return result
