"""Write the example's two CSV exports (deterministic; run once, the files are committed).

Two sites hold different columns of the same patients, as in vertical federated learning: the
hospital has the diagnosis, the site of the clinic that saw the patient, and ten measurements
of the biopsy image; the lab has twenty more measurements from its own analysis. The numbers
are scikit-learn's embedded Wisconsin breast cancer data (569 patients); the record ids, the
site column and the missing cells are invented. Each site exports only the patients it saw
(a random 92 %), in its own order:

- ``hospital/records.csv``: comma-separated, ``NA`` for a measurement the scanner did not take;
- ``lab/panel.csv``: ``;``-separated (a European-locale spreadsheet), empty cells for missing.

The same patient carries the same id at both sites (``MRN-00042``); nothing else links them.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer

HERE = Path(__file__).resolve().parent


def main() -> None:
    """Write both files."""
    data = load_breast_cancer()
    names = [n.replace(" ", "_").replace("mean_", "").replace("_error", "_se") for n in data.feature_names]
    X, malignant = data.data, (data.target == 0).astype(int)
    rng = np.random.default_rng(92)
    ids = [f"MRN-{i:05d}" for i in range(len(X))]
    sites = rng.choice(["north", "south", "east"], size=len(X), p=[0.5, 0.3, 0.2])

    def export(path: Path, columns: list[int], delimiter: str, missing: str, extra: dict, gaps: dict) -> None:
        keep = rng.permutation(np.sort(rng.choice(len(X), size=round(0.92 * len(X)), replace=False)))
        with path.open("w", newline="") as f:
            writer = csv.writer(f, delimiter=delimiter)
            writer.writerow(["patient_id", *extra, *[names[c] for c in columns]])
            for i in keep:
                cells = []
                for c in columns:
                    hole = names[c] in gaps and rng.random() < gaps[names[c]]
                    cells.append(missing if hole else f"{X[i, c]:.6g}")
                writer.writerow([ids[i], *[values[i] for values in extra.values()], *cells])

    export(
        HERE / "hospital" / "records.csv",
        list(range(10)),
        ",",
        "NA",
        {"diagnosis": malignant, "site": sites},
        {"texture": 0.04},
    )
    export(HERE / "lab" / "panel.csv", list(range(10, 30)), ";", "", {}, {"worst_smoothness": 0.05})


if __name__ == "__main__":
    main()
