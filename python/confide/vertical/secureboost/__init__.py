"""SecureBoost: gradient-boosted trees on vertically split data, lossless (algorithms.md §5.2).

The guest holds the labels (and possibly columns); hosts hold columns of the same aligned rows.
Per tree:

1. The guest computes each row's gradient g and hessian h, turns both into non-negative
   fixed-point integers (:class:`GHPacking`) and encrypts them packed into ONE Paillier
   plaintext per row, ``gh = G << 62 | H`` (GH packing), with its own key (CRT encryption).
2. Layer by layer, the guest tells the hosts which rows sit in which node. Each host sums the
   encrypted rows of each node per (feature, bin) with the Rust histogram kernel
   (``CiphertextVector.histogram``) for the smaller of two siblings only, folds up to
   ``(key_bits - 2) // 124`` bin sums into one ciphertext (cipher compression,
   ``CiphertextVector.fold``) and sends them with the bins' row counts. The guest gets the larger
   sibling as parent minus smaller from sums it has already decrypted (histogram subtraction in
   plaintext: the host never builds, folds or sends it, and the guest learns nothing more), and
   builds its own features' histograms while the hosts build theirs.
3. The guest decrypts, peels the fields, and scores every candidate "bin <= v" of every party
   with the XGBoost gain, from exact integer sums; the best split of a host is sent back as
   (feature, bin); the host records its threshold under a random record id (its lookup table),
   splits the rows and returns the left/right partition. The guest stores only (host, record id).
4. Leaves get ``-G / (H + lambda) * learning_rate``; the guest updates its margins.

Multi-class (``multi:softprob``, as XGBoost's): every boosting round grows one tree per class,
each on that class's softmax gradients (``g = p_k - [y = k]``, ``h = 2 p_k (1 - p_k)``) computed
at the start of the round, each run through steps 1-4 with its own encryption. Tree ``j`` adds
to the margin of class ``j % K``; predictions are the softmax of the K margins. The hosts run
exactly the binary protocol and cannot tell which class a tree serves.

Prediction runs the same way: the guest walks every tree and asks the owning host, per layer,
which of the rows at its nodes go left.

:func:`fit_reference` runs the very same tree builder with plaintext histograms computed directly
from the integers; the tests check that its splits equal the secure ones, split for split.

What each party learns is in docs/vertical.md (hosts: the rows of every node; guest: the per-bin
sums and counts of host features, the index of a host feature and bin it splits on, never a
threshold or a raw value).

Modules: :mod:`.params` (hyper-parameters, limits), :mod:`.packing` (fixed-point G/H in
plaintexts), :mod:`.tree` (the builder, models, plaintext reference), :mod:`.guest` and
:mod:`.host` (the two sides of the secure protocol).
"""

from __future__ import annotations

from confide.vertical.secureboost.guest import predict_guest, predict_margin, train_guest
from confide.vertical.secureboost.host import MatrixRows, serve_host
from confide.vertical.secureboost.packing import GHPacking, pack_this_round, packed_plaintexts
from confide.vertical.secureboost.params import FIELD_BITS, MAX_CLASSES, MAX_ROWS, SecureBoostParams
from confide.vertical.secureboost.tree import (
    SecureBoostGuestModel,
    SecureBoostHostModel,
    counts_histogram,
    fit_reference,
    softmax,
    validation_loss,
    validation_split,
)

__all__ = [
    "FIELD_BITS",
    "MAX_CLASSES",
    "MAX_ROWS",
    "GHPacking",
    "MatrixRows",
    "SecureBoostGuestModel",
    "SecureBoostHostModel",
    "SecureBoostParams",
    "counts_histogram",
    "fit_reference",
    "pack_this_round",
    "packed_plaintexts",
    "predict_guest",
    "predict_margin",
    "serve_host",
    "softmax",
    "train_guest",
    "validation_loss",
    "validation_split",
]
