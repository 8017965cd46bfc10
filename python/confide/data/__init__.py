"""Data sets for federated experiments, generated or loaded locally (no downloads).

See :mod:`confide.data.datasets` for the generators and how each split is made,
:mod:`confide.data.catalog` for a party's local datasets and :mod:`confide.data.fldata` for
FL_Data, the description of a federated dataset (participants and pipeline).
"""

from confide.data.catalog import Catalog, Table
from confide.data.datasets import (
    Federation,
    breast_cancer_feature_ranges,
    breast_cancer_federation,
    digits_federation,
    synthetic_lr,
    synthetic_tensors,
    text_federation,
)
from confide.data.fldata import FLData, FLDataConflictError, Participant, Provisioned, Step, is_empty_diff

__all__ = [
    "Catalog",
    "FLData",
    "FLDataConflictError",
    "Federation",
    "Participant",
    "Provisioned",
    "Step",
    "Table",
    "breast_cancer_feature_ranges",
    "breast_cancer_federation",
    "digits_federation",
    "is_empty_diff",
    "synthetic_lr",
    "synthetic_tensors",
    "text_federation",
]
