"""scikit-learn's embedded data sets, read from the files its package ships, without importing it.

``import sklearn`` pulls in SciPy's statistics (about 2 s of CPU on this project's 2-core
machines), and every party process of a job on embedded data paid it only to read two small
files. These readers parse the same files the way ``sklearn.datasets.load_breast_cancer`` and
``load_digits`` do (tests/unit/data/test_embedded.py checks them equal, value for value). Where
an installed scikit-learn keeps its files elsewhere, its own loader runs instead.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

# The column order of the breast cancer file: ten measurements as mean, standard error and worst.
_MEASURES = [
    "radius",
    "texture",
    "perimeter",
    "area",
    "smoothness",
    "compactness",
    "concavity",
    "concave points",
    "symmetry",
    "fractal dimension",
]
BREAST_CANCER_FEATURES = (
    [f"mean {m}" for m in _MEASURES] + [f"{m} error" for m in _MEASURES] + [f"worst {m}" for m in _MEASURES]
)


@dataclass(frozen=True)
class Embedded:
    """One embedded data set: ``data`` ``(n, d)`` float64, ``target`` ``(n,)`` int, its names."""

    data: np.ndarray
    target: np.ndarray
    feature_names: list[str]
    target_names: list[str]
    DESCR: str
    images: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # One copy per process is shared by every caller (cached): nobody may write into it.
        for array in (self.data, self.target, self.images):
            if array is not None:
                array.setflags(write=False)


def _files(data_name: str, descr_name: str) -> tuple[Path, Path] | None:
    """The data file and description scikit-learn ships, where the installed one keeps them."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "datasets"
    data, descr = root / "data" / data_name, root / "descr" / descr_name
    return (data, descr) if data.is_file() and descr.is_file() else None


def _loaded(bunch) -> Embedded:
    """What scikit-learn's own loader returned (an installed version keeping its files elsewhere)."""
    return Embedded(
        data=bunch.data,
        target=bunch.target,
        feature_names=[str(n) for n in bunch.feature_names],
        target_names=[str(n) for n in bunch.target_names],
        DESCR=bunch.DESCR,
        images=getattr(bunch, "images", None),
    )


@cache
def breast_cancer() -> Embedded:
    """The Wisconsin diagnostic breast cancer data: 569 rows, 30 features, 0 malignant / 1 benign."""
    files = _files("breast_cancer.csv", "breast_cancer.rst")
    if files is None:
        from sklearn.datasets import load_breast_cancer

        return _loaded(load_breast_cancer())
    csv, descr = files
    with csv.open(encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
        table = np.loadtxt(handle, delimiter=",", dtype=np.float64, ndmin=2)
    rows, columns = int(header[0]), int(header[1])
    if table.shape != (rows, columns + 1):
        raise ValueError(f"{csv}: {table.shape} values where its header says {rows} rows of {columns} features")
    return Embedded(
        data=np.ascontiguousarray(table[:, :columns]),
        target=table[:, columns].astype(int),
        feature_names=list(BREAST_CANCER_FEATURES),
        target_names=header[2:],
        DESCR=descr.read_text(encoding="utf-8"),
    )


@cache
def digits() -> Embedded:
    """The handwritten digits: 1,797 images of 8x8 pixels (0-16), 10 classes."""
    files = _files("digits.csv.gz", "digits.rst")
    if files is None:
        from sklearn.datasets import load_digits

        return _loaded(load_digits())
    csv, descr = files
    with gzip.open(csv, "rt", encoding="utf-8") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.float64, ndmin=2)
    if table.shape[1] != 65:
        raise ValueError(f"{csv}: {table.shape[1]} columns where 64 pixels and a label were expected")
    data = np.ascontiguousarray(table[:, :-1])
    return Embedded(
        data=data,
        target=table[:, -1].astype(int),
        feature_names=[f"pixel_{row}_{column}" for row in range(8) for column in range(8)],
        target_names=[str(k) for k in range(10)],
        DESCR=descr.read_text(encoding="utf-8"),
        images=data.reshape((-1, 8, 8)),
    )
