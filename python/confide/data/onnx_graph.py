"""A fitted FL_Data pipeline as an ONNX graph: raw columns in, the model's features out.

:func:`pipeline_model` turns the pipeline and the statistics a party fitted at training time
(the artifact's ``pipeline`` and ``fitted``) into an ONNX model that a serving site runs in
front of the trained model (:func:`confide.artifact.export_onnx` joins the two). It computes
what :func:`confide.data.flsteps.transform` computes, step by step, with the same constants:

========== =====================================================================================
step       graph
========== =====================================================================================
impute     ``Where(IsNaN(x), fill, x)`` (the fitted mean or median, or the constant)
scale      ``(x - mean) / std`` or ``(x - low) / (high - low)`` (``x - a`` where the spread is 0)
clip       ``Clip(x, low, high)``, a missing value staying missing
log1p      ``Log(x + 1)`` (a value at or below -1 gives NaN or -inf: ``predict`` refuses it)
encode     ONNX-ML ``LabelEncoder`` (category -> index, anything else -> -1), then one 0/1
           column per category (one-hot) or the index, NaN for an unknown one (ordinal)
filter     no row is dropped: the output ``kept`` says which rows every filter keeps (``predict``
           scores those rows only)
select,    which columns remain (no node)
drop
join       nothing: new records of a vertical job come aligned
========== =====================================================================================

Inputs, one per raw column the pipeline reads, by its name, shape ``[rows, 1]``: ``tensor(double)``
(NaN for a missing value) or, for a column the pipeline encodes or compares with text,
``tensor(string)`` (the empty string for a missing value; a numeric code such as a stage ``3``
is passed as the text ``"3"``). Outputs: ``features`` (float32 ``[rows, d]``, the model's input
in the manifest's order) and ``kept`` (bool ``[rows]``). Arithmetic runs in float64 as in
``predict``; the features are cast to float32 for the model, as ``predict``'s model sees them.

A step the graph cannot express is refused with an :class:`InvalidParameterError` naming it
(an encode of a column an earlier step turned into numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confide.errors import InvalidParameterError

__all__ = ["FEATURES", "KEPT", "feeds", "pipeline_model", "text_columns"]

#: The pipeline graph's outputs.
FEATURES = "features"
KEPT = "kept"
_NUMERIC_FILTERS = {"<": "Less", "<=": "LessOrEqual", ">": "Greater", ">=": "GreaterOrEqual", "==": "Equal"}


def text_columns(pipeline: Sequence[dict]) -> set[str]:
    """The raw columns the graph takes as text: those the pipeline encodes or compares with text."""
    out: set[str] = set()
    for step in pipeline:
        params = step.get("params") or {}
        if step["op"] == "encode":
            out.update(params["columns"])
        elif step["op"] == "filter" and isinstance(params.get("value"), str):
            out.add(params["column"])
    return out


def feeds(session, table) -> dict:
    """The inputs an onnxruntime ``session`` of an export takes, from a table of raw records.

    ``table``: a :class:`confide.data.catalog.Table` read as a catalog reads a CSV (missing
    markers become NaN or None). Text inputs get the cell text ("" where missing), numeric ones
    float64 (NaN where missing). A column the graph needs and the table lacks is named.
    """
    import numpy as np

    out = {}
    for spec in session.get_inputs():
        if spec.name not in table.columns:
            raise InvalidParameterError(f"the records lack the column {spec.name!r} the model's graph takes")
        values = table.columns[spec.name]
        if spec.type == "tensor(string)":
            out[spec.name] = np.array(["" if v is None else str(v) for v in values], dtype=object).reshape(-1, 1)
        elif values.dtype.kind not in "fiu":
            raise InvalidParameterError(f"column {spec.name!r} holds text; the model's graph takes it as a number")
        else:
            out[spec.name] = values.astype(np.float64).reshape(-1, 1)
    return out


@dataclass
class _Graph:
    """Nodes, constants and inputs as they are added; tensor names are unique."""

    text: set[str]
    nodes: list = field(default_factory=list)
    constants: list = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    count: int = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"confide/{hint}/{self.count}"

    def node(self, op: str, inputs: Sequence[str], hint: str, domain: str = "", **attrs) -> str:
        from onnx import helper

        out = self.fresh(hint)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, domain=domain or None, **attrs))
        return out

    def constant(self, value, dtype: str = "double") -> str:
        import numpy as np
        from onnx import numpy_helper

        name = self.fresh("const")
        self.constants.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def raw(self, column: str, kind: str, where: str) -> str:
        """The graph input of raw ``column`` (made on first use); ``kind`` is ``double`` or ``string``."""
        from onnx import TensorProto, helper

        want = "string" if column in self.text else "double"
        if kind != want:
            raise InvalidParameterError(
                f"{where}: takes column {column!r} as a number, and another step encodes it or compares it with "
                "text: the ONNX graph takes each raw column in one type"
            )
        if column not in self.inputs:
            elem = TensorProto.STRING if want == "string" else TensorProto.DOUBLE
            self.inputs[column] = helper.make_tensor_value_info(column, elem, ["rows", 1])
        return column


@dataclass
class _Column:
    """A column as the pipeline has it: still the raw input ``raw``, or the float64 tensor ``tensor``."""

    raw: str | None = None
    tensor: str | None = None


class _Columns:
    """The columns after each step. Raw columns are reachable by name until a ``select``."""

    def __init__(self, graph: _Graph) -> None:
        self.graph = graph
        self.cols: dict[str, _Column] = {}
        self.removed: set[str] = set()
        self.open = True

    def get(self, name: str, where: str) -> _Column:
        if name not in self.cols:
            if not self.open or name in self.removed:
                raise InvalidParameterError(
                    f"{where}: column {name!r} is not there at this step (an earlier step removed it)"
                )
            self.cols[name] = _Column(raw=name)
        return self.cols[name]

    def number(self, name: str, where: str) -> str:
        """Column ``name`` as a float64 tensor."""
        col = self.get(name, where)
        return col.tensor if col.tensor is not None else self.graph.raw(name, "double", where)

    def text(self, name: str, where: str) -> str:
        """Column ``name`` as the raw text input."""
        col = self.get(name, where)
        if col.tensor is not None:
            raise InvalidParameterError(
                f"{where}: column {name!r} is a number computed by an earlier step; the ONNX export encodes or "
                "compares raw text columns only"
            )
        return self.graph.raw(name, "string", where)

    def set(self, name: str, tensor: str) -> None:
        self.cols[name] = _Column(tensor=tensor)
        self.removed.discard(name)

    def remove(self, name: str) -> None:
        self.cols.pop(name, None)
        self.removed.add(name)


def pipeline_model(
    pipeline: Sequence[dict],
    fitted: Sequence[dict],
    features: Sequence[str],
    label: str | None,
    *,
    opset: int,
    ml_opset: int,
    ir_version: int,
):
    """The ONNX model of ``pipeline`` with its ``fitted`` statistics (see the module docstring)."""
    from onnx import TensorProto, helper

    if len(fitted) != len(pipeline):
        raise InvalidParameterError(f"fitted statistics for {len(fitted)} steps, the pipeline has {len(pipeline)}")
    graph = _Graph(text=text_columns(pipeline))
    cols = _Columns(graph)
    masks: list[str] = []
    for step, stats in zip(pipeline, fitted, strict=True):
        where = f"step {step.get('name', step['op'])!r} ({step['op']})"
        build = _STEPS.get(step["op"])
        if build is None:
            raise InvalidParameterError(f"{where}: the ONNX export has no graph for operation {step['op']!r}")
        build(graph, cols, dict(step.get("params") or {}), stats or {}, label, where, masks)
    if not features:
        raise InvalidParameterError("the model has no feature columns to export")
    columns = [cols.number(name, f"feature {name!r}") for name in features]
    joined = graph.node("Concat", columns, "features", axis=1) if len(columns) > 1 else columns[0]
    graph.nodes.append(helper.make_node("Cast", [joined], [FEATURES], name=FEATURES, to=TensorProto.FLOAT))
    rows = graph.node(
        "Slice",
        [graph.node("Shape", [FEATURES], "shape"), graph.constant([0], "int64"), graph.constant([1], "int64")],
        "rows",
    )
    kept = graph.node("ConstantOfShape", [rows], "all", value=helper.make_tensor("one", TensorProto.BOOL, [1], [True]))
    for mask in masks:
        kept = graph.node("And", [kept, graph.node("Reshape", [mask, graph.constant([-1], "int64")], "mask")], "kept")
    graph.nodes.append(helper.make_node("Identity", [kept], [KEPT], name=KEPT))
    outputs = [
        helper.make_tensor_value_info(FEATURES, TensorProto.FLOAT, ["rows", len(features)]),
        helper.make_tensor_value_info(KEPT, TensorProto.BOOL, ["rows"]),
    ]
    body = helper.make_graph(graph.nodes, "confide_pipeline", list(graph.inputs.values()), outputs, graph.constants)
    model = helper.make_model(
        body,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.ml", ml_opset)],
        producer_name="confide",
    )
    model.ir_version = ir_version
    return model


# -- one function per operation ------------------------------------------------------------------------
def _names(op: str, params: dict, stats: dict) -> list[str]:
    """The columns a column-wise step changes on new records, by the rule ``predict`` follows."""
    from confide.data.flops import OPERATIONS

    if "columns" not in params:
        return OPERATIONS[op].fitted_columns(params, stats)
    return list(params["columns"])


def _known(stats: dict, column: str, what: str, where: str) -> dict:
    known = (stats.get("columns") or {}).get(column)
    if known is None:
        raise InvalidParameterError(f"{where}: the artifact holds no fitted {what} for column {column!r}")
    return known


def _impute(graph, cols, p, stats, label, where, masks):
    for c in _names("impute", p, stats):
        x = cols.number(c, where)
        fill = p["value"] if p["strategy"] == "constant" else _known(stats, c, "fill value", where)["fill"]
        cols.set(c, graph.node("Where", [graph.node("IsNaN", [x], "isnan"), graph.constant(fill), x], "impute"))


def _affine(graph, x: str, shift: float, spread: float | None) -> str:
    moved = graph.node("Sub", [x, graph.constant(shift)], "shift")
    return graph.node("Div", [moved, graph.constant(spread)], "spread") if spread else moved


def _scale(graph, cols, p, stats, label, where, masks):
    bounds = p.get("bounds") or {}
    for c in _names("scale", p, stats):
        x = cols.number(c, where)
        if c in bounds:
            low, high = bounds[c]
            cols.set(c, _affine(graph, x, low, high - low))
        elif p["method"] == "minmax":
            known = _known(stats, c, "minimum and maximum", where)
            spread = known["high"] - known["low"]
            cols.set(c, _affine(graph, x, known["low"], spread if spread > 0 else None))
        else:
            known = _known(stats, c, "mean and standard deviation", where)
            cols.set(c, _affine(graph, x, known["mean"], known["std"] if known["std"] > 0 else None))


def _clip(graph, cols, p, stats, label, where, masks):
    low = graph.constant(p["low"]) if "low" in p else ""
    high = graph.constant(p["high"]) if "high" in p else ""
    for c in p["columns"]:
        x = cols.number(c, where)
        clipped = graph.node("Clip", [x, low, high], "clip")
        cols.set(c, graph.node("Where", [graph.node("IsNaN", [x], "isnan"), x, clipped], "clip"))


def _log1p(graph, cols, p, stats, label, where, masks):
    for c in p["columns"]:
        x = cols.number(c, where)
        cols.set(c, graph.node("Log", [graph.node("Add", [x, graph.constant(1.0)], "plus1")], "log1p"))


def _index(graph, text: str, keys: Sequence[str], values: Sequence[int], default: int) -> str:
    return graph.node(
        "LabelEncoder",
        [text],
        "index",
        domain="ai.onnx.ml",
        keys_strings=list(keys),
        values_int64s=list(values),
        default_int64=default,
    )


def _encode(graph, cols, p, stats, label, where, masks):
    categories = {**(p.get("categories") or {}), **(stats.get("categories") or {})}
    for c in p["columns"]:
        if c not in categories:
            raise InvalidParameterError(f"{where}: the artifact holds no categories for column {c!r}")
        cats = categories[c]
        index = _index(graph, cols.text(c, where), cats, range(len(cats)), -1)
        cols.remove(c)
        if p.get("method", "onehot") == "onehot":
            for i, cat in enumerate(cats):
                hit = graph.node("Equal", [index, graph.constant([[i]], "int64")], "is")
                cols.set(f"{c}={cat}", graph.node("Cast", [hit], "onehot", to=11))  # 11: DOUBLE
        else:
            unknown = graph.node("Less", [index, graph.constant([[0]], "int64")], "unknown")
            value = graph.node("Cast", [index], "ordinal", to=11)
            cols.set(c, graph.node("Where", [unknown, graph.constant(float("nan")), value], "ordinal"))


def _filter(graph, cols, p, stats, label, where, masks):
    c, op, value = p["column"], p["op"], p.get("value")
    if isinstance(value, str) or (op == "notnull" and c in graph.text):
        if value == "":
            raise InvalidParameterError(
                f"{where}: compares with the empty string, which the ONNX graph reads as missing"
            )
        # 2: missing (the empty string), 1: equals the value, 0: anything else
        keys, codes = ([""], [2]) if value is None else (["", value], [2, 1])
        index = _index(graph, cols.text(c, where), keys, codes, 0)
        present = graph.node(
            "Not", [graph.node("Equal", [index, graph.constant([[2]], "int64")], "missing")], "present"
        )
        if op == "notnull":
            masks.append(present)
            return
        equal = graph.node("Equal", [index, graph.constant([[1]], "int64")], "equal")
        masks.append(equal if op == "==" else graph.node("And", [graph.node("Not", [equal], "not"), present], "keep"))
        return
    x = cols.number(c, where)
    present = graph.node("Not", [graph.node("IsNaN", [x], "isnan")], "present")
    if op == "notnull":
        masks.append(present)
        return
    compare = graph.node(_NUMERIC_FILTERS.get(op, "Equal"), [x, graph.constant(value)], "compare")
    if op == "!=":
        compare = graph.node("Not", [compare], "not")
    masks.append(graph.node("And", [compare, present], "keep"))


def _select(graph, cols, p, stats, label, where, masks):
    kept = {c: cols.get(c, where) for c in p["columns"] if c != label}
    if label is not None and label in cols.cols:
        kept[label] = cols.cols[label]
    cols.cols, cols.open = kept, False


def _drop(graph, cols, p, stats, label, where, masks):
    for c in p["columns"]:
        cols.get(c, where)
        cols.remove(c)


def _join(graph, cols, p, stats, label, where, masks):
    """New records of a vertical job come aligned: the join is not part of scoring."""


_STEPS = {
    "impute": _impute,
    "scale": _scale,
    "clip": _clip,
    "log1p": _log1p,
    "encode": _encode,
    "filter": _filter,
    "select": _select,
    "drop": _drop,
    "join": _join,
}
