"""Scores every model family reports, in numpy alone.

``roc_auc`` is the area under the ROC curve as the Mann-Whitney statistic: the chance that a
positive row scores above a negative one, ties counting half. It equals
``sklearn.metrics.roc_auc_score`` for binary labels (tests/unit/ml/test_metrics.py compares them
on tied, untied and shuffled scores), without importing scikit-learn, whose SciPy statistics cost
every party process about 2 s of CPU at start.
"""

from __future__ import annotations

import numpy as np


def roc_auc(labels, scores) -> float:
    """Area under the ROC curve of ``scores`` for ``labels`` of exactly two classes (the larger one positive).

    Raises
    ------
    ValueError
        ``labels`` and ``scores`` differ in length, ``labels`` do not hold exactly two classes, or a
        score is NaN or infinite.
    """
    y = np.asarray(labels).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"roc_auc: {y.size} labels and {s.size} scores; one score per label is needed")
    classes = np.unique(y)
    if classes.size != 2:
        raise ValueError(f"roc_auc: the labels hold {classes.size} classes; the AUC needs exactly 2")
    if not np.all(np.isfinite(s)):
        raise ValueError("roc_auc: the scores hold NaN or infinite values")
    positive = y == classes[1]
    # Average 1-based ranks: tied scores share the mean of the ranks they occupy.
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]
    n_pos = int(np.count_nonzero(positive))
    n_neg = y.size - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
