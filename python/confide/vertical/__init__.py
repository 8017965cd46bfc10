"""Vertical federated learning: parties hold different columns of the same records.

- :mod:`~confide.vertical.channel`, :mod:`~confide.vertical.wire`: typed, chunked messages
  between parties over the runtime's relay (or in memory for tests).
- :mod:`~confide.vertical.psi`: ECDH private set intersection on ristretto255 to align records.
- :mod:`~confide.vertical.hetero_lr`: Paillier-protected logistic regression, no arbiter.
- :mod:`~confide.vertical.secureboost`: SecureBoost with GH packing and encrypted histograms.

docs/vertical.md has the protocols, their leakage and the measured figures.
"""
