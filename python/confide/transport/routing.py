"""Level-1 routing of slices across an aggregator cluster (algorithms.md §6.2, Jupiter §3.5).

Slice ``index`` of layer ``layer`` of session (job) ``job_id`` belongs to share

    node_for = (mix64(H(job_id) ^ layer) + index) mod nodes

so consecutive slices of one layer go round-robin over the nodes (every node works on every
layer at once: rule R1) and every participant's copy of a slice lands on the same node (rule
R2: no cross-node state). The table depends on the session and the node count only, so parties
joining never move a slice. When a node is lost, only its share moves, to the next live node
(:func:`serving_node`); every other slice stays where it was.

Level 2 (which worker of a node) is the node's business: ``confide._native.DataPlane`` hashes
(session, index) with the same :func:`mix64` onto one worker queue.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from confide.errors import TransportUnavailableError

__all__ = ["mix64", "node_for", "serving_node", "session_hash", "share_indices"]

_MASK = (1 << 64) - 1


def mix64(value: int) -> int:
    """The splitmix64 finalizer (the native data plane uses the same one)."""
    z = value & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def session_hash(job_id: str) -> int:
    """64-bit hash of a session (job) id: the first 8 bytes of its SHA-256, big-endian (as in Rust)."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")


def node_for(job_id: str, index: int, nodes: int, layer: int = 0) -> int:
    """The share (original node) of slice ``index`` of ``layer``."""
    if nodes <= 1:
        return 0
    return (mix64(session_hash(job_id) ^ layer) + index) % nodes


def share_indices(job_id: str, share: int, nodes: int, num_slices: int, layer: int = 0) -> list[int]:
    """Every slice index of ``share`` (all of them without a cluster)."""
    if nodes <= 1:
        return list(range(num_slices))
    first = (share - mix64(session_hash(job_id) ^ layer)) % nodes
    return list(range(first, num_slices, nodes))


def serving_node(share: int, nodes: int, lost: Iterable[int]) -> int:
    """The node that serves ``share``: its owner, or the next live node after a loss."""
    gone = set(lost)
    for step in range(max(nodes, 1)):
        node = (share + step) % max(nodes, 1)
        if node not in gone:
            return node
    raise TransportUnavailableError(f"every one of the {nodes} aggregator nodes is lost")
