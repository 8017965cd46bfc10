r"""Hetero logistic regression for vertical FL: Paillier-protected, two keys, no arbiter.

A guest G holds the labels and some columns; hosts H_1..H_m hold other columns of the same,
already aligned rows (PSI first). Every party keeps its own weights and runs its own
optimizer; nobody sees another party's features, weights, labels or gradient.

Model and loss (algorithms.md §5.1)
-----------------------------------
Score ``z = X_G w_G + b + sum_j X_j w_j``, labels ``y in {-1, +1}`` (inputs are 0/1). The
logistic loss is replaced by its second-order Taylor expansion at z = 0::

    L ~ log 2 - 1/(2N) sum_i y_i z_i + 1/(8N) sum_i z_i^2  (+ l2/2 ||w||^2 of every party)
    d_i = z_i/4 - y_i/2                      (fore-gradient; d = d_G + sum_j u_j)
    grad_party = 1/N X_party^T d + l2 w_party      intercept: 1/N sum_i d_i

with ``d_G = (X_G w_G + b)/4 - y/2`` at the guest and ``u_j = X_j w_j / 4`` at host j.

Keys
----
G draws a key pair K_G; the first host in ``hosts`` (the *key host* H_1) draws K_H. Both
public keys are published in the first message. Encryption by a key's owner uses the
faster CRT path.

One mini-batch B (N rows; the same batches everywhere)
-------------------------------------------------------
The row order of epoch e is ``numpy.random.default_rng(seed + e).permutation(rows)``, cut into
``rows // batch_size`` batches (at least one); the remainder joins the last batch, so no batch
is smaller than ``min(batch_size, rows)``.

1. Host k sends ``[[u_k]]_{K_H}`` to G and, with several hosts, ``[[u_k]]_{K_G}`` to every
   other host (host to host; G never receives a ciphertext under its own key from which it
   could read u_k).
2. G sends ``[[d_G]]_{K_G}`` to every host.
3. Host j: ``[[d]] = [[d_G]] + u_j + sum_{k != j} [[u_k]]`` and
   ``[[X_j^T d]]``; adds a fresh encryption of a random mask R_j and sends
   ``[[X_j^T d + R_j]]_{K_G}`` to G; G decrypts and returns the masked values; the host
   removes R_j, divides by N, adds ``l2 w_j`` and steps.
4. G: ``[[d]] = d_G + sum_k [[u_k]]_{K_H}``, ``[[X_G^T d]]`` and ``[[sum_i d_i]]``, masked
   with R_G and sent to H_1 with the masked loss part (below); H_1 decrypts and returns;
   G unmasks, adds ``l2 w_G`` and steps.
5. Loss, with ``z_H = sum_k z_k = 4 sum_k u_k``: G computes its plaintext part
   ``log 2 - 1/(2N) sum y z_G + 1/(8N) sum z_G^2 + l2/2 ||w_G||^2`` and, under K_H,
   ``1/N sum_i (z_G(i) - 2 y_i) u(i)`` (the ``y z_H`` and ``2 z_G z_H`` terms), masked. The
   remaining term ``1/(8N) sum z_H^2 = 1/(8N) sum_k sum z_k^2 + 1/N sum_{j<k} sum z_j u_k``
   (plus the hosts' ``l2/2 ||w_j||^2``) is built by the hosts: host j puts its plaintext
   ``sum z_j^2 / 8`` and, from the ``[[u_k]]_{K_G}`` it already holds, the encrypted cross
   terms with every later host k > j into one ciphertext ``[[a_j]]_{K_G}``. Hosts j >= 2 send it
   to H_1; H_1 decrypts G's masked part ``V = L_G + R_L`` (an exact integer: R_L lies in
   ``[2^(k-3), 2^(k-2))`` so nothing wraps), encrypts ``V + a_1`` under K_G, adds every ``[[a_j]]`` and sends
   the single ciphertext to G, which decrypts and removes R_L. So G learns exactly the batch
   loss and no host learns it; with one host this is FATE's loss, and unlike FATE it also
   works for several hosts. G logs the epoch loss (row-weighted mean of the batch losses,
   computed with the weights before each step) and stops when it changes by less than
   ``tol`` or after ``epochs`` epochs; a control message tells the hosts.

Fixed point and features
------------------------
``d_G`` and ``u_j`` travel as signed integers ``round(v 2^F)`` (F = ``fixed_point_bits``) in
Z_n. Every party standardizes its columns locally (mean 0, std 1, training statistics) and
quantizes them for the encrypted products only, as unsigned integers
``q = round((x - min_j) / step_j)`` with ``feature_bits`` bits (``step_j = (max_j - min_j) /
(2^bits - 1)``), so that ``X^T [[d]]`` is a multi-exponentiation with short unsigned
exponents (``CiphertextVector.dot_u64``; a pure-Python fallback over the native element
operations runs while the native kernel is missing). With ``S_j = sum_i q_ij D_i`` and
``T = sum_i D_i`` (a row of ones in the same product) the party forms, still encrypted,
``a_j S_j + b_j T`` with ``a_j = round(step_j 2^E)``, ``b_j = round(min_j 2^E)`` (E chosen so both
fit in 62 bits): that is ``sum_i xhat_ij d_i`` at scale ``2^(F+E)``, decoded after unmasking as
``value / 2^(F+E) / N``. The scores ``z`` use the unquantized standardized values; the
gradient uses ``xhat = min + step q`` (relative error ~ 2^-feature_bits per entry, which
averages out). :func:`train_plaintext_reference` runs the same algorithm in float64, with
``quantized=True`` using ``xhat`` in the gradient exactly like the secure run.

Masks
-----
Each masked value is ``x + R`` with R uniform in ``[2^(k-3), 2^(k-2))`` (k the smaller key
size), drawn from :mod:`secrets`; the decryptor sees ``x + R mod n``, within statistical
distance ``|x| / 2^(k-3)`` of R's own distribution (below 2^-1700 for any value these
protocols produce at k = 2048), and ``x + R`` never wraps modulo n, which the loss relay
through two keys needs. The fresh encryption of R also re-randomizes the ciphertext, which matters: a
product of the decryptor's own ciphertexts carries randomness ``prod rho_i^(q_ij)``, which the
key holder could otherwise recover and test against guesses of q.

What each party learns
----------------------
* G: its own gradient per batch, i.e. ``X_G^T (sum_k u_k)`` and ``sum_i sum_k u_k(i)`` (linear
  aggregates of the hosts' partial scores), the batch loss, each host's row count and column
  count (also visible from message sizes). Host gradients reach G only masked.
* Host j: its own gradient ``X_j^T d`` per batch (aggregates of the label-dependent
  fore-gradient), the stop decision; everything else it receives is a ciphertext or a masked
  value. H_1 additionally decrypts only masked values.
* Inference (:func:`predict_guest`): hosts send their per-row partial scores ``z_j = X_j w_j``
  to G, as in FATE; G learns these scores (not features or weights) and the predictions.

Caveats
-------
* Semi-honest parties only. Every decryptor is a decryption oracle for what it is sent: a
  malicious host could submit elements of ``[[d_G]]`` as its "gradient" and learn ``d_G``
  (hence labels), a malicious guest could submit hosts' ciphertexts to H_1. This is the trust
  model of FATE's and Yang et al.'s protocols. Channels must be authenticated (the runtime's
  mTLS).
* A party whose gradient has at least as many entries as a batch has rows could solve for the
  other side's per-row values; every party therefore refuses batches with no more rows than
  its gradient has entries (its columns, + 1 for the guest's intercept). This is necessary,
  not sufficient: gradients of many batches and epochs still accumulate information, as in
  every protocol of this family (FATE's included).
* Key sizes are 2048, 3072 or 4096 bits (the native core refuses smaller keys).

Modules: :mod:`.params` (hyper-parameters), :mod:`.model` (models, input checks, scaling,
optimizer), :mod:`.protocol` (fixed point, message fields, the steps both sides share),
:mod:`.guest` and :mod:`.host` (the two sides), :mod:`.reference` (the plaintext reference).
The Paillier vector plumbing is :mod:`confide.crypto.vectors`. Names with a leading underscore
are shared between these modules only.
"""

from __future__ import annotations

from confide.vertical.hetero_lr.guest import predict_guest, train_guest
from confide.vertical.hetero_lr.host import predict_host, train_host
from confide.vertical.hetero_lr.model import HeteroLRGuestModel, HeteroLRHostModel, ReferenceResult
from confide.vertical.hetero_lr.params import PROTOCOL, HeteroLRParams
from confide.vertical.hetero_lr.reference import train_plaintext_reference

__all__ = [
    "PROTOCOL",
    "HeteroLRGuestModel",
    "HeteroLRHostModel",
    "HeteroLRParams",
    "ReferenceResult",
    "predict_guest",
    "predict_host",
    "train_guest",
    "train_host",
    "train_plaintext_reference",
]
