"""Data sets for federated experiments, generated or loaded locally (no downloads).

See :mod:`confide.data.datasets` for the generators and how each split is made.
"""

from confide.data.datasets import (
    Federation,
    breast_cancer_feature_ranges,
    breast_cancer_federation,
    synthetic_lr,
)

__all__ = [
    "Federation",
    "breast_cancer_feature_ranges",
    "breast_cancer_federation",
    "synthetic_lr",
]
