"""The embedded data sets read without importing scikit-learn equal scikit-learn's own loaders."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits

from confide.data import embedded


def test_breast_cancer_equals_scikit_learn_value_for_value():
    ours, theirs = embedded.breast_cancer(), load_breast_cancer()
    assert ours.data.dtype == np.float64 and np.array_equal(ours.data, theirs.data)
    assert np.array_equal(ours.target, theirs.target)
    assert ours.feature_names == [str(n) for n in theirs.feature_names]
    assert ours.target_names == [str(n) for n in theirs.target_names]
    assert ours.DESCR == theirs.DESCR


def test_digits_equal_scikit_learn_value_for_value():
    ours, theirs = embedded.digits(), load_digits()
    assert np.array_equal(ours.data, theirs.data) and np.array_equal(ours.images, theirs.images)
    assert np.array_equal(ours.target, theirs.target)
    assert ours.feature_names == list(theirs.feature_names)
    assert ours.target_names == [str(n) for n in theirs.target_names]
    assert ours.DESCR == theirs.DESCR


def test_the_shared_copy_cannot_be_written():
    data = embedded.breast_cancer()
    with pytest.raises(ValueError, match="read-only"):
        data.data[0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        embedded.digits().images[0, 0, 0] = 1.0


def test_a_party_on_embedded_data_does_not_import_scikit_learn():
    # What each party process of a job on embedded data runs: deal the rows, score the model.
    code = (
        "import sys\n"
        "from confide.data.datasets import breast_cancer_federation, digits_federation\n"
        "from confide.ml.metrics import roc_auc\n"
        "breast_cancer_federation(3); digits_federation(3); roc_auc([0, 1], [0.2, 0.7])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_where_scikit_learn_keeps_its_files_elsewhere_its_own_loader_gives_the_same(monkeypatch):
    read = {name: getattr(embedded, name)() for name in ("breast_cancer", "digits")}
    monkeypatch.setattr(embedded, "_files", lambda *_: None)
    for name, ours in read.items():
        getattr(embedded, name).cache_clear()
        try:
            loaded = getattr(embedded, name)()
        finally:
            getattr(embedded, name).cache_clear()
        assert loaded is not ours and np.array_equal(loaded.data, ours.data)
        assert np.array_equal(loaded.target, ours.target)
        assert (loaded.feature_names, loaded.target_names, loaded.DESCR) == (
            ours.feature_names,
            ours.target_names,
            ours.DESCR,
        )
