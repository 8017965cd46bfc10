"""Execution configurations, deltas between them, and the slice routing policy (pure; no I/O).

A session's log entry holds, per recipient (each party and each aggregator node), the whole
configuration that recipient runs with. Tuning appends an entry; what is pushed to a recipient
is the *delta* between the configuration it has applied and the newest one: a list of leaf
operations ``{"op": "set" | "remove", "path": [...], "value": ...}``. A recipient whose
configuration did not change receives nothing. Lists are leaves (replaced whole): a party list
or a pipeline is small, and a partial list edit would need an order-aware merge for no gain.

Every configuration has a digest (SHA-256 of its canonical JSON); a recipient that applies a
delta checks that it arrives at the digest the controller computed, so a lost or reordered push
can never leave a party running a configuration nobody recorded. Deltas and digests are
:mod:`confide.agent.config` (the agent applies what the controller computes; re-exported here).

Routing (algorithms §6.2): slice ``i`` of an update goes to aggregator node
``nodes[i mod len(nodes)]``, worker ``(i div len(nodes)) mod workers``. The table depends only on
the slice index, never on the parties, so a party added by tuning gets exactly the routes the
others already use, and nothing is reshuffled.
"""

from __future__ import annotations

import copy
from typing import Any

from confide.agent.config import apply_delta, config_digest, delta
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
