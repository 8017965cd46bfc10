"""SecureBoost host histograms on the party's compute engine: rows split, sums combined exactly.

A host's encrypted histogram of a node is, per feature and bin, the product mod n² of the
guest's GH ciphertexts of the node's rows in that bin. Products do not depend on how the rows
are grouped, so the host cuts its rows into contiguous ranges, one :class:`HistogramRows` holder
per range (placed by the engine: Ray actors on the silo's workers, or inline), sends each holder
the ciphertexts of its own rows only (so a holder's memory falls with more ranges), and multiplies
the holders' partial histograms (:meth:`CiphertextVector.sum`): the same ciphertexts, bit for
bit, as one histogram over all rows (test). What a holder gets: its rows' bins (uint8), the
guest's public key, its rows' ciphertexts, the node of each row. No key that decrypts anything.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["HistogramRows", "HostHistograms", "combine_histograms", "node_histograms", "received_gradients"]


def received_gradients(cache: dict, public_key: bytes, gh: bytes, rows: int, where: str):
    """The guest's ciphertexts ``gh`` of a holder's ``rows`` rows, under its public key.

    ``cache`` keeps the parsed key (``key``, ``key_bytes``) between trees: it changes only with
    the job. Shared by the row-range holders here and the partition holders
    (:mod:`confide.vertical.columns`).
    """
    from confide import _native
    from confide.errors import ProtocolError

    if cache.get("key_bytes") != public_key:
        cache["key"], cache["key_bytes"] = _native.EncryptionKey.from_bytes(public_key), public_key
    vector = _native.CiphertextVector.from_bytes(gh, cache["key"])
    if len(vector) != rows:
        raise ProtocolError(f"{where}: {len(vector)} ciphertexts for {rows} rows")
    return vector


def node_histograms(
    gh, bins: np.ndarray, node_of_row: np.ndarray, nodes: list[int], n_bins: int, key=None, block: bytes | None = None
):
    """``(histograms, members)``: each node's encrypted histogram over a holder's rows, and its rows there.

    With the guest's ``key`` (a native EncryptionKey) and the GPU engine selected, the products run
    on the GPU (:func:`confide.crypto.gpu.histograms`, the same bytes; ``block``: the bytes ``gh``
    was parsed from); else the Rust kernel.
    """
    from confide.crypto import gpu

    local = np.asarray(node_of_row)
    members = [np.flatnonzero(local == node).astype(np.uint32) for node in nodes]
    on_gpu = None if key is None else gpu.histograms(key, gh, bins, local, nodes, n_bins, block)
    if on_gpu is not None:
        return on_gpu, members
    return [gh.histogram(bins, rows, n_bins, 1).to_bytes() for rows in members], members


def combine_histograms(parts: list[list[bytes]], key, count: int, threads: int = 0) -> list:
    """One CiphertextVector per node: the product of every holder's histogram of it (exact)."""
    from confide import _native

    return [
        _native.CiphertextVector.sum([_native.CiphertextVector.from_bytes(part[i], key) for part in parts], threads)
        for i in range(count)
    ]


class HistogramRows:
    """Rows ``[start, stop)`` of a host's binned columns (features x rows), held where the engine runs."""

    def __init__(self, bins: np.ndarray, start: int) -> None:
        self.bins = np.ascontiguousarray(bins, dtype=np.uint8)
        self.start, self.stop = int(start), int(start) + self.bins.shape[1]
        self.keys: dict = {}
        self.gh: Any = None
        self.gh_block: bytes | None = None

    def pid(self) -> int:
        """The process id of the worker holding these rows."""
        return os.getpid()

    def set_gradients(self, public_key: bytes, gh: bytes) -> int:
        """Keep the tree's encrypted gradients of this range's rows (``gh``: their ciphertexts)."""
        self.gh = received_gradients(
            self.keys, public_key, gh, self.stop - self.start, f"rows {self.start}..{self.stop}"
        )
        self.gh_block = gh
        return len(self.gh)

    def histograms(self, node_of_row: np.ndarray, nodes: list[int], n_bins: int) -> list[bytes]:
        """Encrypted histogram of each node over this range's rows (``node_of_row``: theirs)."""
        if self.gh is None:  # built again after its worker died: the tree's gradients are gone
            from confide.errors import ProtocolError

            raise ProtocolError(f"rows {self.start}..{self.stop} hold no encrypted gradients (restarted)")
        return node_histograms(self.gh, self.bins, node_of_row, nodes, n_bins, self.keys.get("key"), self.gh_block)[0]


class HostHistograms:
    """A host's rows cut into ranges held on ``engine``; encrypted histograms combined exactly."""

    def __init__(self, engine, bins: np.ndarray, ranges: int | None = None) -> None:
        self.ranges = engine.ranges(bins.shape[1], parts=ranges) or [(0, 0)]
        self.holders = engine.hold(HistogramRows, [(bins[:, a:b], a) for a, b in self.ranges])
        self._gradients: list[tuple[bytes, bytes]] = []

    def set_gradients(self, key, gh) -> None:
        """Hand each range the tree's encrypted gradients (a CiphertextVector) of its own rows."""
        public = key.to_bytes()
        self._gradients = [(public, gh.slice(a, b).to_bytes()) for a, b in self.ranges]
        self.holders.call_each("set_gradients", self._gradients)

    def histograms(self, node_of_row: np.ndarray, nodes: list[int], n_bins: int, key) -> list:
        """One CiphertextVector per node: the product of the ranges' histograms.

        A holder whose worker died was built again without the tree's gradients: they are sent
        once more and the layer asked again.
        """
        from confide.errors import ProtocolError

        node_of_row = np.asarray(node_of_row, dtype=np.int32)
        args = [(node_of_row[a:b], list(nodes), n_bins) for a, b in self.ranges]
        try:
            parts = self.holders.call_each("histograms", args)
        except ProtocolError:
            self.holders.call_each("set_gradients", self._gradients)
            parts = self.holders.call_each("histograms", args)
        return combine_histograms(parts, key, len(nodes))

    def close(self) -> None:
        """Release the holders."""
        self.holders.close()
