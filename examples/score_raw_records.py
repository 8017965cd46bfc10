"""Score a hospital's raw records twice: with ``confide model predict`` and with the ONNX export.

    .venv/bin/python examples/score_raw_records.py PARTY.model.zip RECORDS.csv [--rows 5]

The export is one ONNX graph, the training pipeline with the site's fitted statistics in front
of the model; it takes the CSV's raw columns (text stays text, a missing value stays missing).
The two columns printed agree to float32 precision.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> int:
    """Score the records both ways and print them side by side; exit 1 if they disagree."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("records")
    parser.add_argument("--rows", type=int, default=5, help="how many records to show (some with a missing value)")
    args = parser.parse_args()

    import onnxruntime

    from confide.artifact import ModelArtifact, export_onnx, predict, read_records
    from confide.data.onnx_graph import feeds

    artifact = ModelArtifact.load(args.artifact)
    table = read_records(args.records)
    rows, scores = predict(artifact, args.records)
    with tempfile.TemporaryDirectory() as folder:
        path = export_onnx(artifact, Path(folder) / "model.onnx")
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds(session, table)), strict=True))
    onnx_scores = np.asarray(outputs["probabilities"])[:, 1]
    shown = [name for name in table.names if name != artifact.manifest["label"]]
    label = artifact.manifest["label"]
    print(f"raw records of {args.records} scored by {artifact.manifest['party']}'s model (P({label} = 1)):")
    print("  " + "  ".join(f"{name:>10}" for name in shown) + f"  {'predict':>10}  {'onnx':>10}")

    def missing(row: int, name: str) -> bool:
        value = table.columns[name][row]
        return value is None or (isinstance(value, float) and np.isnan(value))

    scored = dict(zip(rows.tolist(), scores, strict=True))
    gaps = [row for row in scored if any(missing(row, name) for name in shown)]
    picked = sorted(set(list(scored)[: max(0, args.rows - 2)] + gaps[:2]))[: args.rows]
    for row in picked:
        cells = [f"{'(missing)' if missing(row, name) else table.columns[name][row]:>10}" for name in shown]
        print("  " + "  ".join(cells) + f"  {scored[row]:>10.6f}  {onnx_scores[row]:>10.6f}")
    gap = float(np.max(np.abs(onnx_scores[rows] - scores))) if len(rows) else 0.0
    print(f"largest difference over all {len(rows)} records: {gap:.2e} (the ONNX model runs in float32)")
    return 0 if gap < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
