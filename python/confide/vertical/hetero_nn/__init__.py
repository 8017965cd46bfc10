r"""Hetero NN for vertical FL: bottom models, a Paillier interactive layer, a top model.

A guest G holds the labels and some columns; hosts H_1..H_m hold other columns of the same,
already aligned rows (PSI first). The network (algorithms.md §5.3, FATE 1.x's design)::

    a_G = bottom_G(x_G)            a_h = bottom_h(x_h)        (each at its owner, in plaintext)
    z   = a_G W_G + sum_h a_h W_h + b                         (the interactive layer)
    out = top(g(z))                                           (at G; head: sigmoid, softmax or identity)

Who holds what
--------------
G holds its bottom model, ``W_G``, ``b``, the top model and the only Paillier key pair. The
host part ``W_h`` of the interactive layer is held by nobody: it exists as two additive
shares in the ring Z_(2^64) (fixed point, 2^-32), ``W_h = W'_h + E_h``, where G holds W'_h and
host h holds E_h. Each share alone is uniformly distributed, so neither side knows W_h (FATE's
"noisy copy W_A' plus accumulated noise", made exact: FATE's float noise is not uniform).

Initial shares: G draws A, host h draws B (each Glorot / sqrt 2, fixed point) and a uniform
E_h, sends ``B - E_h mod 2^64``; G sets ``W'_h = A + B - E_h``. So W_h = A + B: each party
knows its own half of the *initial* weights; everything learned afterwards is hidden from both.

One mini-batch of rows (the same batches everywhere; per host h)
-----------------------------------------------------------------
Fixed point: activations a_q = round(a 2^13), |a| <= 8 (clipped, counted); the cut-layer
gradient delta = dL_sum/dz (per example), delta_q = round(delta 2^16), |delta| <= 128 (clipped,
counted). All packing puts several signed integers in one Paillier plaintext, ``sum v_i 2^(w i)``
(decoded from the low end with centered digits), so every ciphertext carries many values.

1. Forward. G sends [[W'_h]] (its key; row k of W'_h packed in one ciphertext, repeated at P
   row positions). Host h computes, with the crypto core's multi-exponentiation kernel,
   ``[[sum_k e_bk W'_h[k]]]`` for every row b with ``e = a_q + 2^16`` (P rows per output
   ciphertext), adds a fresh encryption of ``(a_q E_h mod 2^64) + 2^64 rho`` (rho uniform, 40
   bits above the sum's high part) and returns it. G decrypts, subtracts ``2^16 sum_k W'_h[k]``
   and reduces mod 2^64: ``a_q (W'_h + E_h) = a_q W_h``, the host's contribution z_h. The high
   part (above 2^64), which could reveal more about a_q, is hidden by rho.
2. G runs the top model and back-propagates to ``delta`` (B x d_i). It sends every host
   ``[[delta_b]]`` (one ciphertext per row, the row's d_i values packed) and
   ``[[delta[:, j]]]`` (the batch dimension packed, s rows per ciphertext, per column j).
3. Host h computes ``[[a_q^T delta_q]]`` (d_h ciphertexts, the kernel over the B rows), adds
   uniform masks M (40 bits above the value), returns. G decrypts ``a_q^T delta_q + M`` (which
   says nothing about the gradient) and sets ``W'_h -= floor(c (G + M))``; host h sets
   ``E_h += floor(c M)`` (c = learning rate / rows in the batch, 2^-40 exact); the shares then
   sum to ``W_h - c grad`` (to 2^-32). Plain SGD: a moment would need the gradient in clear.
4. For the host's bottom gradient ``delta W_h^T = delta W'_h^T + delta E_h^T``: host h computes,
   per group of s rows, ``[[sum_j E_h[k, j] delta[:, j]]]`` (64-bit exponents), adds masks R
   (40 bits above) and returns; G decrypts, adds ``delta_q W'_h^T`` (mod 2^64) and sends the
   sum; host h removes R: ``delta_q W_h^T mod 2^64``, its bottom model's input gradient.

Per batch and host: 3 round trips; G decrypts ceil(B/P) + d_h + ceil(B/s) d_h ciphertexts and
encrypts B + ceil(B/s) d_i (+ d_h P) with its own (fast CRT) key; a host encrypts as many as it
returns (the masks and rho, under G's public key). 2048-bit keys, d_h = d_i = 8, B = 1024:
P = 2, s = 15.

What each side learns (and the known limit)
-------------------------------------------
- G: its own data and model; z_h = a_h W_h for every training row (the host's contribution
  to the interactive layer, as in FATE); never x_h, a_h, W_h, the host's bottom weights or the
  gradients of W_h (only values under uniform masks). Sizes: rows, d_h.
- Host h: its own data, bottom model and E_h; ``delta W_h^T`` for every training row — the
  gradient of its bottom model's output, which any split model must give it to train that
  model. Never labels, predictions, the loss, a_G, W_G or W_h. That gradient is known to leak
  labels: in binary tasks the norm and direction attacks of Li et al. (ICLR 2022, "Label
  Leakage and Protection in Two-party Split Learning") and the model-completion attacks of
  Fu et al. (USENIX Security 2022) recover most labels from it; the hidden W_h and the
  interactive layer make it harder but do not remove it. Mitigations (noise on the gradient,
  DP) belong to the differential-privacy work; do not rely on Hetero NN alone to keep labels
  secret from a host that attacks.
- Prediction runs step 1 only; G learns the scores, a host nothing.

The plaintext reference ``train_reference`` trains the same network centrally with the same
initial weights, batches and optimizers (Adam for bottom and top models, SGD for the
interactive layer); the secure run differs only by fixed-point rounding.

Modules: :mod:`.params` (hyper-parameters, fixed-point constants), :mod:`.model` (input checks,
heads, networks, models), :mod:`.protocol` (the ring arithmetic and the encrypted steps both
sides share), :mod:`.guest` and :mod:`.host` (the two sides), :mod:`.reference` (plaintext).
The Paillier vector plumbing is :mod:`confide.crypto.vectors`. Names with a leading underscore
are shared between these modules only.
"""

from __future__ import annotations

from confide.vertical.hetero_nn.guest import predict_guest, train_guest
from confide.vertical.hetero_nn.host import predict_host, train_host
from confide.vertical.hetero_nn.model import HeteroNNGuestModel, HeteroNNHostModel
from confide.vertical.hetero_nn.params import FW, OBJECTIVES, HeteroNNParams
from confide.vertical.hetero_nn.reference import ReferenceModel, predict_reference, train_reference

__all__ = [
    "FW",
    "OBJECTIVES",
    "HeteroNNGuestModel",
    "HeteroNNHostModel",
    "HeteroNNParams",
    "ReferenceModel",
    "predict_guest",
    "predict_host",
    "predict_reference",
    "train_guest",
    "train_host",
    "train_reference",
]
