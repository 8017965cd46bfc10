"""Execution configurations, deltas between them, and the slice routing policy (pure; no I/O).

A session's log entry holds, per recipient (each party and each aggregator node), the whole
configuration that recipient runs with. Tuning appends an entry; what is pushed to a recipient
is the *delta* between the configuration it has applied and the newest one: a list of leaf
operations ``{"op": "set" | "remove", "path": [...], "value": ...}``. A recipient whose
configuration did not change receives nothing. Lists are leaves (replaced whole): a party list
or a pipeline is small, and a partial list edit would need an order-aware merge for no gain.

Every configuration has a digest (SHA-256 of its canonical JSON); a recipient that applies a
delta checks that it arrives at the digest the controller computed, so a lost or reordered push
can never leave a party running a configuration nobody recorded.

Routing (algorithms §6.2): slice ``i`` of an update goes to aggregator node
``nodes[i mod len(nodes)]``, worker ``(i div len(nodes)) mod workers``. The table depends only on
the slice index, never on the parties, so a party added by tuning gets exactly the routes the
others already use, and nothing is reshuffled.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from confide.errors import InvalidParameterError
from confide.spec import JobSpec

__all__ = [
    "apply_delta",
    "build_configs",
    "config_digest",
    "delta",
    "route",
    "routing_policy",
    "set_path",
]

ROLE_PARTY = "party"
ROLE_AGGREGATOR = "aggregator"


def canonical(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def config_digest(config: dict) -> str:
    """SHA-256 hex digest of a configuration's canonical JSON."""
    return hashlib.sha256(canonical(config)).hexdigest()


def routing_policy(nodes: list[dict], *, workers: int = 1) -> dict:
    """The routing table for aggregator ``nodes`` (each ``{"name", "address"}``)."""
    if not nodes:
        raise InvalidParameterError("routing needs at least one aggregator node")
    return {
        "nodes": [{"name": n["name"], "address": n["address"]} for n in nodes],
        "workers_per_node": workers,
        "rule": "node = slice_index mod nodes; worker = (slice_index div nodes) mod workers_per_node",
    }


def route(policy: dict, slice_index: int) -> tuple[str, int]:
    """The (node name, worker) that slice ``slice_index`` goes to under ``policy``."""
    nodes = policy["nodes"]
    node = nodes[slice_index % len(nodes)]["name"]
    worker = (slice_index // len(nodes)) % policy["workers_per_node"]
    return node, worker


def build_configs(spec: JobSpec, *, session: str, routing: dict) -> dict[str, dict]:
    """Per-recipient execution configurations for ``spec``: one per party, one per aggregator node."""
    spec_data = spec.model_dump(mode="json")
    datasets = spec.datasets()
    configs: dict[str, dict] = {}
    for party in spec.parties:
        configs[party] = {
            "role": ROLE_PARTY,
            "session": session,
            "spec": spec_data,
            "dataset": datasets.get(party),
            "routing": routing,
        }
    for node in routing["nodes"]:
        configs[node["name"]] = {
            "role": ROLE_AGGREGATOR,
            "session": session,
            "job_id": spec.job_id,
            "parties": list(spec.parties),
            "rounds": spec.rounds,
            "checkpoint_interval": spec.checkpoint_interval,
            "round_timeout_s": spec.transport.round_timeout_s,
            "dropout_grace_s": spec.transport.dropout_grace_s,
            "protection": spec.protection.mode,
            "routing": routing,
        }
    return configs


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


def set_path(data: dict, dotted: str, value: Any) -> dict:
    """A copy of the mapping ``data`` with ``dotted`` ("model.learning_rate") set to ``value``."""
    if not isinstance(dotted, str) or not dotted or any(not part for part in dotted.split(".")):
        raise InvalidParameterError(f"setting path must look like 'model.learning_rate', got {dotted!r}")
    result = copy.deepcopy(data)
    parts = dotted.split(".")
    parent = result
    for index, key in enumerate(parts[:-1]):
        child = parent.get(key)
        if child is None:
            child = {}
            parent[key] = child
        if not isinstance(child, dict):
            raise InvalidParameterError(f"cannot set {dotted!r}: {'.'.join(parts[: index + 1])} is not a section")
        parent = child
    parent[parts[-1]] = value
    return result
