"""``confide model show | predict | export``: use a trained model at the party that holds it.

The model is the ``<party>.model.zip`` artifact a party writes at the end of a job
(:mod:`confide.artifact`); these commands need no controller and no network.
"""

from __future__ import annotations

import csv
import json
import sys

from confide.errors import InvalidParameterError

__all__ = ["add_commands", "dispatch"]


def add_commands(commands) -> None:
    """Register ``confide model`` on the top-level subparsers."""
    model = commands.add_parser("model", help="show, score with, or export a trained model (<party>.model.zip)")
    sub = model.add_subparsers(dest="model_command", required=True)
    show = sub.add_parser("show", help="what the model is: job, features, pipeline, metrics, checkpoint leaf")
    show.add_argument("artifact", help="a <party>.model.zip")
    show.add_argument("--json", action="store_true", help="print the manifest as JSON")
    predict = sub.add_parser("predict", help="score new records (CSV or Parquet) with the training pipeline")
    predict.add_argument("artifact", help="a <party>.model.zip")
    predict.add_argument("records", help="CSV (or Parquet) with the dataset's columns; the label may be absent")
    predict.add_argument("--out", default=None, help="write row,score CSV here (default: standard output)")
    predict.add_argument(
        "--id-column",
        default=None,
        metavar="NAME",
        help="write this column of the records (a patient id) instead of the row number, to join the scores back",
    )
    predict.add_argument(
        "--stream",
        action="store_true",
        help="read and score the file block by block (a file larger than memory); warnings come at the end",
    )
    predict.add_argument("--delimiter", default="auto", help="CSV delimiter (default: detected)")
    predict.add_argument(
        "--missing", action="append", default=None, metavar="MARKER", help="a cell text meaning missing (repeat)"
    )
    export = sub.add_parser(
        "export",
        help="the model in ONNX with the training pipeline in front (it scores raw records); or a SecureBoost "
        "guest's trees in XGBoost's JSON format",
    )
    export.add_argument("artifact", help="a <party>.model.zip")
    export.add_argument(
        "--format",
        choices=["onnx", "xgboost"],
        default="onnx",
        help="onnx; xgboost: a SecureBoost guest's trees where every split is the guest's (prepared features)",
    )
    export.add_argument("--out", required=True, help="file to write, e.g. model.onnx")
    export.add_argument(
        "--prepared",
        action="store_true",
        help="the model alone: its input is the prepared features (float32, in the manifest's order), not raw columns",
    )


def dispatch(args) -> int:
    """Run a ``confide model`` command."""
    from confide.artifact import ModelArtifact, export_onnx, export_xgboost

    artifact = ModelArtifact.load(args.artifact)
    if args.model_command == "show":
        _show(artifact, args.json)
    elif args.model_command == "predict":
        if len(args.delimiter) != 1 and args.delimiter != "auto":
            raise InvalidParameterError(f"--delimiter must be one character or 'auto', got {args.delimiter!r}")
        _predict(artifact, args)
    elif args.format == "xgboost":
        path = export_xgboost(artifact, args.out)
        print(
            f"wrote {path} (XGBoost JSON; input: the guest's {len(artifact.features or [])} prepared features "
            "in the manifest's order, as float32)"
        )
    else:
        path = export_onnx(artifact, args.out, prepared=args.prepared)
        if args.prepared:
            print(
                f"wrote {path} (ONNX; input: {len(artifact.features or [])} prepared features in the manifest's order)"
            )
        else:
            import onnx

            graph = onnx.load_model(str(path), load_external_data=False).graph
            inputs = ", ".join(
                f"{i.name} ({'text' if i.type.tensor_type.elem_type == 8 else 'number'})" for i in graph.input
            )
            outputs = ", ".join(o.name for o in graph.output)
            print(f"wrote {path} (ONNX; raw columns in: {inputs}; out: {outputs})")
    return 0


def _blocks(artifact, args):
    """``(row numbers, scores, id values or None)`` per block, then the warnings."""
    from confide.artifact import check_records, predict, predict_stream, read_records

    keep = [args.id_column] if args.id_column is not None else []
    if args.stream:
        blocks = predict_stream(artifact, args.records, delimiter=args.delimiter, missing=args.missing, keep=keep)
        for item in blocks:
            if isinstance(item, tuple):
                rows, scores, kept = item
                yield rows, scores, kept.get(args.id_column)
            else:
                yield item.warnings()
        return
    table = read_records(args.records, delimiter=args.delimiter, missing=args.missing)
    if keep and keep[0] not in table.columns:
        raise InvalidParameterError(
            f"--id-column {keep[0]!r} is not a column of the records; columns: {table.names[:20]}"
        )
    warnings = check_records(artifact, table)
    rows, scores = predict(artifact, table)
    yield rows, scores, table.columns[keep[0]][rows] if keep else None
    yield warnings


def _predict(artifact, args) -> None:
    """Scores as CSV: a row number (or the id column) and the probabilities, written block by block."""
    handle = open(args.out, "w", newline="", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    key = "row" if args.id_column is None else args.id_column
    scored, header = 0, False
    try:
        writer = csv.writer(handle)
        for item in _blocks(artifact, args):
            if isinstance(item, list):
                for warning in item:
                    print(f"warning: {warning}", file=sys.stderr)
                continue
            rows, scores, ids = item
            ids = rows if ids is None else ids
            if not header:
                names = (
                    [f"p_{artifact.manifest['label']}"]
                    if scores.ndim == 1
                    else [f"p_class_{k}" for k in range(scores.shape[1])]
                )
                writer.writerow([key, *names])
                header = True
            if scores.ndim == 1:
                writer.writerows([_cell(r), f"{s:.17g}"] for r, s in zip(ids, scores, strict=True))
            else:
                writer.writerows([_cell(r), *(f"{v:.17g}" for v in s)] for r, s in zip(ids, scores, strict=True))
            scored += len(rows)
    finally:
        if args.out:
            handle.close()
    if args.out:
        print(f"scored {scored} records into {args.out}", file=sys.stderr)


def _cell(value) -> str:
    """A row number or an id as its CSV cell (an id read as a number keeps no trailing .0)."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():  # numpy float64 is a float
        return str(int(value))
    return str(value)


def _show(artifact, as_json: bool) -> None:
    m = artifact.manifest
    if as_json:
        print(json.dumps(m, indent=1, sort_keys=True))
        return
    spec = m["model"]["spec"]
    if m.get("vertical"):
        _show_vertical(m, spec)
        return
    lines = [
        f"model {spec['algorithm']} of job {m['job_id']}"
        + (f", session {m['session']}" if m.get("session") else "")
        + f", trained by {m['party']} ({m['rounds']} rounds, protection {m.get('protection')})",
        f"label {m.get('label')}; {len(m.get('features') or [])} features: {', '.join(m.get('features') or [])}",
    ]
    for step, fitted in zip(m.get("pipeline") or [], m.get("fitted") or [], strict=False):
        stats = fitted.get("columns") or fitted.get("categories") or {}
        lines.append(f"  step {step['name']} ({step['op']}): fitted for {len(stats)} column(s)")
    if m.get("metrics"):
        lines.append("held-out metrics at this party: " + ", ".join(f"{k} {v:.4g}" for k, v in m["metrics"].items()))
    if m.get("checkpoint"):
        leaf = m["checkpoint"]
        lines.append(f"final checkpoint leaf {leaf['name']} sha256 {leaf['sha256']} (see 'confide session log')")
    print("\n".join(lines))


def _show_vertical(m: dict, spec: dict) -> None:
    v = m["vertical"]
    partners = [p for p in [v["guest"], *v["hosts"]] if p != m["party"]]
    lines = [
        f"model {spec['algorithm']} (vertical) of job {m['job_id']}"
        + (f", session {m['session']}" if m.get("session") else "")
        + f": {m['party']}'s part, the {v['role']}, with {', '.join(partners)}"
        + f" ({m['rounds']} rounds, protection {m.get('protection')})",
        (f"labels {m['label']} held here" if v.get("holds_labels") else "no labels here (a host)")
        + f"; {len(m.get('features') or [])} own features: {', '.join(m.get('features') or [])}",
        f"records joined by PSI on {v.get('id_column') or 'the ids'}: {v.get('common_records')} in common",
    ]
    if m.get("metrics"):
        lines.append("held-out metrics (at the guest): " + ", ".join(f"{k} {v:.4g}" for k, v in m["metrics"].items()))
    lines.append(
        "new records score with every partner's part: a scoring job through the controller "
        "(score: {session: ...}; docs/vertical.md#scoring-new-records); part.cvw in this archive is the part itself"
    )
    print("\n".join(lines))
