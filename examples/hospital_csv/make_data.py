"""Write the example's three hospital CSVs (deterministic; run once, the files are committed).

A synthetic cohort shaped like the public serum free light chain study (Dispenzieri et al.,
Mayo Clin Proc 2012; R's ``survival::flchain``): 7,874 patients with age, sex, the kappa and
lambda free light chains, their decile group, creatinine (missing for about one in six), a
monoclonal gammopathy flag, and whether the patient died during follow-up. No record is real:
values are drawn from distributions fitted by eye to the published summaries, with death
depending on age, the light chains, creatinine and sex.

The three files are what three hospitals' exports look like: ``hospital-a`` writes ``NA``
for a missing value, ``hospital-b`` leaves the cell empty, ``hospital-c`` exports from a
spreadsheet set to a European locale: ``;``-separated, ``NULL`` for missing.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PATIENTS = 7874
SITES = {"hospital-a": (",", "NA"), "hospital-b": (",", ""), "hospital-c": (";", "NULL")}


def cohort(seed: int = 2012) -> list[dict]:
    """The whole synthetic cohort, one dict per patient (None: creatinine not measured)."""
    rng = np.random.default_rng(seed)
    n = PATIENTS
    age = np.clip(50 + rng.gamma(2.0, 7.0, n), 50, 101).round()
    sex = np.where(rng.random(n) < 0.55, "F", "M")
    kappa = np.exp(rng.normal(0.25, 0.45, n) + 0.006 * (age - 64)).round(3)
    lam = np.exp(rng.normal(0.35, 0.40, n) + 0.005 * (age - 64)).round(3)
    total = kappa + lam
    flc_grp = np.searchsorted(np.quantile(total, np.linspace(0.1, 0.9, 9)), total) + 1
    creatinine = np.exp(rng.normal(0.0, 0.25, n) + 0.1 * (sex == "M")).round(2)
    creatinine_missing = rng.random(n) < 0.17
    mgus = (rng.random(n) < 0.015).astype(int)
    score = (
        -3.2 + 0.09 * (age - 50) + 0.55 * np.log(total) + 0.6 * np.log(creatinine) + 0.25 * (sex == "M") + 0.8 * mgus
    )
    death = (rng.random(n) < 1 / (1 + np.exp(-score))).astype(int)
    rows = []
    for i in range(n):
        rows.append(
            {
                "age": int(age[i]),
                "sex": sex[i],
                "kappa": float(kappa[i]),
                "lambda": float(lam[i]),
                "flc_grp": int(flc_grp[i]),
                "creatinine": None if creatinine_missing[i] else float(creatinine[i]),
                "mgus": int(mgus[i]),
                "death": int(death[i]),
            }
        )
    return rows


def write(directory: Path = HERE) -> dict[str, Path]:
    """Deal the cohort to the three hospitals and write each one's export; returns the paths."""
    rows = cohort()
    order = np.random.default_rng(7).permutation(len(rows))
    parts = np.array_split(order, len(SITES))
    out = {}
    for (site, (delimiter, missing)), part in zip(SITES.items(), parts, strict=True):
        path = directory / site / "patients.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter=delimiter)
            writer.writerow(list(rows[0]))
            for index in sorted(part):
                writer.writerow([missing if v is None else v for v in rows[index].values()])
        out[site] = path
    return out


if __name__ == "__main__":
    for site, path in write().items():
        print(f"{site}: {path}")
