"""``roc_auc`` against scikit-learn's ``roc_auc_score``, which it replaces on every party's path."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from confide.ml.metrics import roc_auc


@pytest.mark.parametrize("seed", range(6))
def test_equals_scikit_learn_with_and_without_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    y = rng.integers(0, 2, size=n)
    y[0], y[-1] = 0, 1
    # Half the seeds score on a coarse grid, so many scores tie, across and within classes.
    scores = rng.normal(size=n) + y if seed % 2 else np.round(rng.normal(size=n) + y, 1)
    assert roc_auc(y, scores) == pytest.approx(roc_auc_score(y, scores), abs=1e-12)


def test_labels_of_any_two_values_take_the_larger_as_positive():
    scores = np.array([0.1, 0.4, 0.35, 0.8, 0.8, 0.2])
    for negative, positive in ((0, 1), (-1, 1), (2, 7)):
        y = np.where(np.array([0, 0, 1, 1, 0, 1]) == 1, positive, negative)
        assert roc_auc(y, scores) == pytest.approx(roc_auc_score(y, scores), abs=1e-12)


def test_perfect_inverted_and_constant_scores():
    y = np.array([0, 0, 1, 1])
    assert roc_auc(y, [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert roc_auc(y, [0.9, 0.8, 0.2, 0.1]) == 0.0
    assert roc_auc(y, [0.5, 0.5, 0.5, 0.5]) == 0.5


@pytest.mark.parametrize(
    ("labels", "scores", "message"),
    [
        ([0, 1, 1], [0.1, 0.2], "3 labels and 2 scores"),
        ([1, 1, 1], [0.1, 0.2, 0.3], "1 classes"),
        ([0, 1, 2], [0.1, 0.2, 0.3], "3 classes"),
        ([0, 1, 1], [0.1, np.nan, 0.3], "NaN or infinite"),
        ([0, 1, 1], [0.1, np.inf, 0.3], "NaN or infinite"),
    ],
)
def test_bad_input_is_refused_with_the_reason(labels, scores, message):
    with pytest.raises(ValueError, match=message):
        roc_auc(labels, scores)
