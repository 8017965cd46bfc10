"""The guest's side of the secure protocol: encrypted gradients out, histograms and splits back."""

from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np

from confide import _native
from confide.crypto import gpu
from confide.errors import InvalidParameterError, ProtocolError
from confide.vertical.binning import Binner
from confide.vertical.secureboost.params import FIELD_BITS, SecureBoostParams
from confide.vertical.secureboost.tree import SecureBoostGuestModel, boost, layer_histograms, softmax


# -- secure protocol: guest side ----------------------------------------------------------------
class _Commands:
    """Numbered request/reply messages from the guest to one host (tags sb/<session>/...)."""

    def __init__(self, channel, peer: str, session: str) -> None:
        self.channel, self.peer, self.session = channel, peer, session
        self.seq = 0

    def request(self, message: dict, reply: bool = True) -> dict | None:
        tag = f"sb/{self.session}/{self.seq}"
        self.channel.send(self.peer, tag, message)
        self.seq += 1
        if not reply:
            return None
        return self.channel.recv(self.peer, tag + "/reply")

    def receive(self) -> dict:
        """The reply to the last request sent with ``reply=False``."""
        return self.channel.recv(self.peer, f"sb/{self.session}/{self.seq - 1}/reply")


class _RemoteSource:
    """A host reached over a channel: histograms come back encrypted and folded."""

    def __init__(self, name, commands: _Commands, key, params: SecureBoostParams) -> None:
        self.name, self.commands, self.key, self.params = name, commands, key, params
        self.sent_key = False
        self.stats: dict[str, float] = {}

    def begin_tree(self, tree, G, H, packing, ciphertexts, slot=None):
        """Tell the host a tree begins.

        ``slot``: (class k, K) when a row's K classes share one ciphertext (sent with the round's
        first tree; the others reuse it).
        """
        self.stats = {"decrypt_s": 0.0, "decrypted": 0, "cells": 0}
        self.current = {}
        self.slot = slot
        message = {"op": "tree", "tree": tree, "rows": len(G), "fields": slot[1] if slot else 1}
        if ciphertexts is not None:
            message["gh"] = ciphertexts.to_bytes()
        if not self.sent_key:
            message["key"] = self.key.encryption_key.to_bytes()
            self.sent_key = True
        self.commands.request(message, reply=False)

    def send_layer(self, node_of_row, plan):
        self.plan = plan
        self.commands.request(
            {"op": "layer", "node_of_row": node_of_row, "plan": np.asarray(plan, np.int64)}, reply=False
        )

    def layer_result(self):
        """The host's histograms of every node of the layer.

        Decrypted for the nodes the host built, parent − sibling in plaintext for the others (the
        host never builds those).
        """
        plan = self.plan
        direct = [node_id for node_id, mode, *_ in plan if mode == 0]
        reply = self.commands.receive()
        counts = np.asarray(reply["counts"], dtype=np.int64)
        hists = reply["hist"]
        if (
            counts.ndim != 3
            or counts.shape[0] != len(direct)
            or counts.shape[2] != self.params.n_bins
            or len(hists) != len(direct)
        ):
            raise ProtocolError(
                f"{self.name}: histograms of shape {counts.shape} ({len(hists)} parts) do not match "
                f"{len(direct)} directly built nodes x {self.params.n_bins} bins"
            )
        features, n_bins = counts.shape[1], counts.shape[2]
        fields, field = (self.slot[1], self.slot[0]) if self.slot else (1, 0)
        built = {}
        for i, data in enumerate(hists):
            folded = _native.CiphertextVector.from_bytes(data, self.key.encryption_key)
            started = time.perf_counter()
            plains = gpu.decrypt_raw(self.key, folded, self.params.threads)
            self.stats["decrypt_s"] += time.perf_counter() - started
            self.stats["decrypted"] += len(plains)
            self.stats["cells"] += features * n_bins
            per = self.params.cells_per_ciphertext(fields)
            G_sum, H_sum = _unfold(plains, features * n_bins, per, fields=fields, field=field)
            built[direct[i]] = (G_sum.reshape(features, n_bins), H_sum.reshape(features, n_bins), counts[i])
        self.current = layer_histograms(plan, built.__getitem__, getattr(self, "current", {}))
        return self.current

    def split(self, decisions, val_node_of_row=None):
        items = sorted(decisions.items())
        message = {"op": "split", "decisions": np.asarray([(n, f, b) for n, (f, b) in items], np.int64)}
        if val_node_of_row is not None:
            message["val_node_of_row"] = val_node_of_row
        reply = self.commands.request(message)
        records = np.asarray(reply["records"], dtype=np.int64)
        lefts = reply["left"]
        val_lefts = reply.get("val_left") if val_node_of_row is not None else [None] * len(items)
        if len(records) != len(items) or len(lefts) != len(items) or len(val_lefts or ()) != len(items):
            raise ProtocolError(f"{self.name}: {len(records)} split answers for {len(items)} decisions")
        return {
            node: (
                int(records[i]),
                np.asarray(lefts[i], dtype=bool),
                None if val_lefts[i] is None else np.asarray(val_lefts[i], dtype=bool),
            )
            for i, (node, _) in enumerate(items)
        }

    def end_tree(self, tree, last):
        reply = self.commands.request({"op": "end_tree", "last": last, "tree": tree})
        self.host_stats = {k: float(v) for k, v in reply.items()}

    def tree_stats(self):
        return {**self.stats, **getattr(self, "host_stats", {})}


def _unfold(
    plains: list[bytes], count: int, slots: int, *, fields: int = 1, field: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The (G, H) sums of ``count`` cells folded ``slots`` to a ciphertext.

    Each cell holds ``fields`` packed classes, of which class ``field`` is returned.
    """
    mask = (1 << FIELD_BITS) - 1
    pair = 2 * FIELD_BITS
    width = pair * fields
    G = np.empty(count, dtype=np.int64)
    H = np.empty(count, dtype=np.int64)
    i = 0
    for raw in plains:
        value = int.from_bytes(raw, "big")
        for _ in range(slots):
            if i == count:
                break
            cell = (value & ((1 << width) - 1)) >> (pair * field)
            value >>= width
            G[i], H[i] = (cell >> FIELD_BITS) & mask, cell & mask
            i += 1
    if i != count or value:
        raise ProtocolError(f"folded histogram holds a different number of sums than the {count} expected")
    return G, H


def train_guest(
    channel,
    hosts: list[str],
    X: np.ndarray,
    y: np.ndarray,
    params: SecureBoostParams,
    session: str,
    *,
    key=None,
    on_tree=None,
    resume: dict | None = None,
    encrypt_with=None,
) -> SecureBoostGuestModel:
    """Train as the guest (labels holder). ``X`` may have zero columns (a label-only guest).

    ``on_tree(entry, snapshot)``: after every tree; ``snapshot`` (after a round's last tree,
    else None) returns the trees and margins so far. ``resume``: such a snapshot; the hosts
    resume with their lookup tables of the same round (``serve_host(model=...)``).
    ``encrypt_with(encryption_key, plaintexts)``: encrypts the GH plaintexts somewhere else (the
    party's compute workers, :func:`confide.compute.tasks.encrypt_raw_on`), with the public key
    only; by default the guest encrypts them itself on the key holder's CRT path.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] != len(y):
        raise InvalidParameterError(f"guest: features of shape {X.shape} do not match {len(y)} labels")
    if not hosts:
        raise InvalidParameterError("hosts: SecureBoost needs at least one host")
    if X.shape[1]:
        binner = Binner.fit(X, params.n_bins, party="guest")
        bins = binner.transform(X, party="guest")
    else:
        binner, bins = None, np.zeros((0, len(y)), dtype=np.uint8)
    key = key if key is not None else _native.generate_keypair(params.key_bits)
    started = time.perf_counter()
    hello = {"op": "hello", "rows": len(y), "params": asdict(params)}
    commands = [_Commands(channel, host, session) for host in hosts]
    channel.round += 1
    for command in commands:
        command.request(hello, reply=False)
    for host in hosts:
        reply = channel.recv(host, f"sb/{session}/0/reply")
        if reply.get("error"):
            raise InvalidParameterError(f"{host}: {reply['error']}")
        if int(reply["rows"]) != len(y):
            raise InvalidParameterError(
                f"{host} holds {reply['rows']} aligned rows, the guest {len(y)}: align with PSI first"
            )
    setup_s = time.perf_counter() - started
    sources = [_RemoteSource(h, c, key, params) for h, c in zip(hosts, commands, strict=True)]

    def encrypt(plaintexts: list[bytes]):
        if encrypt_with is not None:
            return encrypt_with(key.encryption_key, plaintexts)
        return gpu.encrypt_raw(key, plaintexts, "fixed_base", params.threads)

    def advance() -> None:
        channel.round += 1

    model = boost(params, y, bins, binner, sources, encrypt=encrypt, advance=advance, on_tree=on_tree, resume=resume)
    for c in commands:
        c.request({"op": "done"}, reply=False)
    model.setup_seconds = setup_s
    return model


# -- prediction -------------------------------------------------------------------------------------
def predict_margin(channel, model: SecureBoostGuestModel, X: np.ndarray, session: str) -> np.ndarray:
    """Margins of the guest's rows ``X`` (aligned with the hosts'); hosts run :func:`serve_host`."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    commands = {k: _Commands(channel, host, session) for k, host in enumerate(model.hosts)}
    channel.round += 1
    classes = model.params.classes
    margin = np.full((n, classes), model.base_margin)
    position = [np.zeros(n, dtype=np.int64) for _ in model.trees]
    for _ in range(model.params.max_depth):
        queries: dict[int, list[tuple[int, int, np.ndarray]]] = {k: [] for k in commands}
        moves = []
        for t, tree in enumerate(model.trees):
            for node in tree:
                if node.owner is None:
                    continue
                rows = np.flatnonzero(position[t] == node.id)
                if not len(rows):
                    continue
                if node.owner < 0:
                    moves.append((t, node, rows, X[rows, node.feature] < node.threshold))
                else:
                    queries[node.owner].append((t, node, rows))
        for k, items in queries.items():
            if not items:
                continue
            offsets = np.cumsum([0] + [len(rows) for _, _, rows in items])
            reply = commands[k].request(
                {
                    "op": "predict",
                    "records": np.asarray([node.record for _, node, _ in items], dtype=np.int64),
                    "offsets": offsets.astype(np.int64),
                    "rows": np.concatenate([rows for _, _, rows in items]).astype(np.int64),
                }
            )
            left = np.asarray(reply["left"], dtype=bool)
            for i, (t, node, rows) in enumerate(items):
                moves.append((t, node, rows, left[offsets[i] : offsets[i + 1]]))
        if not moves:
            break
        for t, node, rows, go_left in moves:
            position[t][rows[go_left]] = node.left
            position[t][rows[~go_left]] = node.right
    for t, tree in enumerate(model.trees):
        weights = np.array([node.weight for node in tree])
        margin[:, t % classes] += weights[position[t]]
    for c in commands.values():
        c.request({"op": "done"}, reply=False)
    return margin if classes > 1 else margin[:, 0]


def predict_guest(channel, model: SecureBoostGuestModel, X: np.ndarray, session: str) -> np.ndarray:
    """Predictions: P(1) for binary:logistic, ``(n, K)`` class probabilities for multi:softprob, values."""
    margin = predict_margin(channel, model, X, session)
    if model.params.objective == "binary:logistic":
        return 1.0 / (1.0 + np.exp(-margin))
    if model.params.objective == "multi:softprob":
        return softmax(margin)
    return margin
