"""The host's side of the secure protocol: encrypted histograms of its columns, split rows."""

from __future__ import annotations

import secrets
import time

import numpy as np

from confide import _native
from confide._checks import is_int
from confide.crypto import gpu
from confide.errors import ConfideError, ProtocolError
from confide.vertical.binning import Binner
from confide.vertical.secureboost.params import FIELD_BITS, SecureBoostParams
from confide.vertical.secureboost.tree import SecureBoostHostModel, counts_histogram


# -- secure protocol: host side -----------------------------------------------------------------
class MatrixRows:
    """A host's aligned rows as one in-memory matrix: what :func:`serve_host` asks of its rows.

    The same operations are answered by :class:`confide.vertical.columns.ColumnView` for a
    partitioned dataset whose rows never enter the party process. ``engine``: a
    :class:`confide.compute.LocalCompute` whose workers build the encrypted histograms by row
    ranges (:mod:`confide.vertical.histograms`; the same ciphertexts as building them here).
    """

    def __init__(self, X: np.ndarray, engine=None) -> None:
        self.X = np.asarray(X, dtype=np.float64)
        self.rows = int(self.X.shape[0]) if self.X.ndim == 2 else 0
        self.features = int(self.X.shape[1]) if self.X.ndim == 2 else 0
        self.engine = engine
        self.binner: Binner | None = None
        self.bins: np.ndarray | None = None
        self.remote = None
        self.gh = None
        self.gh_block: bytes | None = None

    def fit(self, n_bins: int, party: str) -> Binner:
        """Quantile cut points of every column; the rows binned with them."""
        self.binner = Binner.fit(self.X, n_bins, party=party)
        self.bins = self.binner.transform(self.X, party=party)
        if self.engine is not None and self.rows:
            from confide.vertical.histograms import HostHistograms

            self.remote = HostHistograms(self.engine, self.bins)
        return self.binner

    def set_gradients(self, key, gh, block: bytes | None = None) -> None:
        """The tree's encrypted gradients, one ciphertext per row (``block``: the bytes they came as)."""
        self.gh, self.gh_block = gh, block
        if self.remote is not None:
            self.remote.set_gradients(key, gh)

    def layer(self, node_of_row: np.ndarray, nodes: list[int], n_bins: int, key, threads: int = 0):
        """The nodes' encrypted histograms and their row counts per (feature, bin)."""
        members = [np.flatnonzero(node_of_row == node) for node in nodes]
        on_gpu = (
            gpu.histograms(key, self.gh, self.bins, node_of_row, nodes, n_bins, self.gh_block) if self.rows else None
        )
        if on_gpu is not None:  # all rows in one pass on this process's GPU (the same ciphertexts)
            hists = [type(self.gh).from_bytes(block, key) for block in on_gpu]
        elif self.remote is not None:
            hists = self.remote.histograms(node_of_row, nodes, n_bins, key)
        else:
            hists = [self.gh.histogram(self.bins, rows.astype(np.uint32), n_bins, threads) for rows in members]
        counts = np.stack([counts_histogram(self.bins, rows, n_bins) for rows in members])
        return hists, counts

    def lefts(self, node_of_row: np.ndarray, decisions: np.ndarray) -> list[np.ndarray]:
        """Per (node, feature, bin): whether each row of the node (in row order) goes left."""
        return [
            self.bins[feature, np.flatnonzero(node_of_row == node)] <= bin_index
            for node, feature, bin_index in np.asarray(decisions).reshape(-1, 3)
        ]

    def below(self, queries: list[tuple[np.ndarray, int, float]]) -> list[np.ndarray]:
        """Per (rows, feature, threshold): x < threshold (NaN compares False: right)."""
        return [self.X[rows, feature] < threshold for rows, feature, threshold in queries]

    def close(self) -> None:
        """Release the histogram holders, if any."""
        if self.remote is not None:
            self.remote.close()
            self.remote = None


def serve_host(
    channel,
    guest: str,
    X,
    session: str,
    *,
    model: SecureBoostHostModel | None = None,
    threads: int = 0,
    on_tree=None,
    engine=None,
) -> SecureBoostHostModel:
    """Answer the guest's training or prediction requests until it says "done".

    ``X`` is this host's aligned raw rows: a matrix, or a partitioned dataset's view
    (:class:`confide.vertical.columns.ColumnView`) whose holders answer for their rows. Returns
    the lookup table (grown during training). ``model``: a lookup table to start from
    (prediction, or training resumed from a checkpoint). ``on_tree(tree, snapshot, last)``: after
    each tree the guest finished, with a callable returning the lookup table so far, and whether
    it was the last (early stopping may end training before ``n_trees``). ``engine``: a
    :class:`confide.compute.LocalCompute` whose workers build a matrix's encrypted histograms by
    row ranges (:class:`MatrixRows`).
    """
    rows = X if hasattr(X, "lefts") else MatrixRows(X, engine)
    lookup = dict(model.lookup) if model is not None else {}
    state: dict = {"rows": rows}
    try:
        return _serve(channel, guest, session, lookup, state, threads, on_tree)
    finally:
        if rows is not X:
            rows.close()


def _serve(channel, guest, session, lookup, state, threads, on_tree) -> SecureBoostHostModel:
    rows = state["rows"]
    seq = 0
    channel.round += 1
    while True:
        tag = f"sb/{session}/{seq}"
        message = channel.recv(guest, tag)
        op = message.get("op")
        seq += 1
        if op == "hello":
            params = SecureBoostParams(**message["params"])
            problem: ConfideError | None = None
            try:
                state.update(params=params, binner=rows.fit(params.n_bins, channel.party))
            except ConfideError as failure:  # told to the guest, which stops naming this host
                problem = failure
            channel.send(guest, tag + "/reply", {"rows": rows.rows, "error": str(problem) if problem else None})
            if problem is not None:
                raise problem
        elif op == "tree":
            if "key" in message:
                state["key"] = _native.EncryptionKey.from_bytes(message["key"])
            if int(message["rows"]) != rows.rows:
                raise ProtocolError(f"guest sent gradients for {message['rows']} rows, this host holds {rows.rows}")
            fields = message.get("fields", 1)
            if not is_int(fields) or state["params"].cells_per_ciphertext(fields) < 1:
                raise ProtocolError(f"tree {message.get('tree')}: {fields!r} packed classes do not fit a plaintext")
            state["fields"] = fields
            if "gh" in message:
                state["gh"] = True
                block = message["gh"]
                rows.set_gradients(state["key"], _native.CiphertextVector.from_bytes(block, state["key"]), block)
            elif "gh" not in state:
                raise ProtocolError(f"tree {message.get('tree')}: no encrypted gradients to reuse")
            state["stats"] = {"hist_s": 0.0, "fold_s": 0.0}
        elif op == "layer":
            _host_layer(channel, guest, tag, message, state, threads)
        elif op == "split":
            replies = _host_split(message, state, lookup)
            channel.send(guest, tag + "/reply", replies)
        elif op == "end_tree":
            channel.send(guest, tag + "/reply", state.get("stats", {}))
            if message.get("last"):
                state.pop("gh", None)  # kept until then: a round's classes may share one vector
            if not message.get("last"):
                channel.round += 1
            if on_tree is not None and isinstance(message.get("tree"), int):
                on_tree(
                    message["tree"], lambda: SecureBoostHostModel(dict(lookup)).to_dict(), bool(message.get("last"))
                )
        elif op == "predict":
            channel.send(guest, tag + "/reply", _host_predict(message, rows, lookup))
        elif op == "done":
            return SecureBoostHostModel(lookup)
        else:
            raise ProtocolError(f"unknown SecureBoost request {op!r} from {guest}")


def _host_layer(channel, guest, tag, message, state, threads) -> None:
    """Encrypted histograms of the layer's directly built nodes (mode 0), folded and re-randomized.

    The guest derives each other node as parent − sibling from sums it has already decrypted, so
    the host never computes, folds or sends those.
    """
    params: SecureBoostParams = state["params"]
    rows = state["rows"]
    node_of_row = np.asarray(message["node_of_row"], dtype=np.int32)
    plan = np.asarray(message["plan"], dtype=np.int64).reshape(-1, 4)
    if len(node_of_row) != rows.rows:
        raise ProtocolError(f"layer plan names {len(node_of_row)} rows, this host holds {rows.rows}")
    if "gh" not in state:
        raise ProtocolError("layer requested before any encrypted gradients")
    state["node_of_row"] = node_of_row
    direct_nodes = [int(node_id) for node_id, mode, *_ in plan if mode == 0]
    started = time.perf_counter()
    hists, counts = rows.layer(node_of_row, direct_nodes, params.n_bins, state["key"], threads)
    state["stats"]["hist_s"] += time.perf_counter() - started
    started = time.perf_counter()
    # Re-randomized: a product of the guest's own ciphertexts is deterministic, so without fresh
    # randomness the guest could test which rows a sum combines (e.g. a bin holding one row).
    fields = state.get("fields", 1)
    per = params.cells_per_ciphertext(fields)
    folded = [
        (h.fold(2 * FIELD_BITS * fields, per, threads) if per > 1 else h).rerandomize(threads).to_bytes() for h in hists
    ]
    state["stats"]["fold_s"] += time.perf_counter() - started
    channel.send(guest, tag + "/reply", {"hist": folded, "counts": np.asarray(counts).astype(np.int32)})


def _host_split(message, state, lookup) -> dict:
    decisions = np.asarray(message["decisions"], dtype=np.int64).reshape(-1, 3)
    rows, binner, node_of_row = state["rows"], state["binner"], state["node_of_row"]
    val_node_of_row = message.get("val_node_of_row")
    if val_node_of_row is not None:
        val_node_of_row = np.asarray(val_node_of_row, dtype=np.int32)
        if len(val_node_of_row) != rows.rows:
            raise ProtocolError(f"split names {len(val_node_of_row)} validation rows, this host holds {rows.rows}")
    records = []
    for _node_id, feature, bin_index in decisions:
        if not (0 <= feature < rows.features and 0 <= bin_index < state["params"].n_bins - 1):
            raise ProtocolError(f"split on feature {feature}, bin {bin_index} is out of range")
        record = secrets.randbits(62)
        while record in lookup:
            record = secrets.randbits(62)
        lookup[record] = (int(feature), binner.threshold(int(feature), int(bin_index)))
        records.append(record)
    reply = {"records": np.asarray(records, dtype=np.int64), "left": rows.lefts(node_of_row, decisions)}
    if val_node_of_row is not None:
        reply["val_left"] = rows.lefts(val_node_of_row, decisions)
    return reply


def _host_predict(message, rows, lookup) -> dict:
    records = np.asarray(message["records"], dtype=np.int64)
    offsets = np.asarray(message["offsets"], dtype=np.int64)
    positions = np.asarray(message["rows"], dtype=np.int64)
    if len(offsets) != len(records) + 1 or (len(positions) and (positions.min() < 0 or positions.max() >= rows.rows)):
        raise ProtocolError("prediction request: offsets or rows out of range")
    if len(offsets) and (offsets[0] != 0 or offsets[-1] != len(positions) or (np.diff(offsets) < 0).any()):
        raise ProtocolError("prediction request: offsets or rows out of range")
    queries = []
    for i, record in enumerate(records):
        if int(record) not in lookup:
            raise ProtocolError(f"prediction request names unknown record {int(record)}")
        feature, threshold = lookup[int(record)]
        queries.append((positions[offsets[i] : offsets[i + 1]], feature, threshold))
    answers = rows.below(queries)
    return {"left": np.concatenate(answers) if answers else np.empty(0, dtype=bool)}
