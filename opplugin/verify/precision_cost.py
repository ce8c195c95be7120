"""What reduced precision costs a model in accuracy, node by node, against float64: `check --precision
tf32|fp16|bf16`.

The cost is measured on an emulation, so that each node's own share can be told apart from what reaches
it (`run --precision` runs the model on the format's kernels and checks its outputs). FP16 and BF16: every float tensor a
node reads or writes (inputs, weights, results) is rounded to the format, and the arithmetic inside the
node stays FP32, as a tensor-core kernel that stores half precision and accumulates in FP32 computes, up
to the order of its sums. TF32: tensors stay FP32,
and the operands of each product (Conv, ConvTranspose, Gemm, MatMul) are rounded to TF32 as they are read,
as cuDNN's and cuBLAS's TF32 modes do. onnxruntime's CPU provider runs each node in FP32; the exact result
is each node in float64 (float64.py). Three measures:

- a node's own error: the node alone on the exact result's inputs, rounded, its output rounded, against
  its exact output: what that node costs wherever it stands, the ranking's measure (infinite where the
  node alone makes a value the format cannot hold);
- the error as it arrives: every node on the rounded results before it (the emulated model run
  through), each tensor against its exact value;
- the outputs: their error and, for (batch, classes) scores, the top-1 agreement with float64.

Errors are relative L2 (||got - exact|| / ||exact||) over the values both hold finite; a value the
format cannot hold (FP16 past 65504) comes out infinite and is counted, not hidden.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.number_formats import REDUCED, UNIT_ROUNDOFF, round_to
from ..core.texttable import elide_middle
from ..errors import InputError, first_line
from . import float64

PRECISIONS = REDUCED
# what each emulation rounds, in words
HOW = {"tf32": "the operands of each Conv, Gemm and MatMul rounded to TF32, sums and every other op in FP32",
       "fp16": "every float tensor rounded to FP16, FP32 arithmetic inside each node",
       "bf16": "every float tensor rounded to BF16, FP32 arithmetic inside each node"}
PRODUCTS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})  # what TF32 tensor cores compute
SCHEMA = "opplugin-precision-cost/1"
RANKED = 10  # nodes the text names in its ranking (the JSON has them all)


@dataclass
class NodeCost:
    name: str
    op: str
    output: str
    own: float  # relative L2 of the node alone on rounded exact inputs (own_error)
    arriving: float  # relative L2 of its output in the emulated run
    nonfinite: int  # values the emulated run made infinite or NaN where float64 has a number


@dataclass
class PrecisionCost:
    precision: str
    model: str
    batch: int
    nodes: list[NodeCost] = field(default_factory=list)
    outputs: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def ranking(self) -> list[NodeCost]:
        return sorted(self.nodes, key=lambda n: -n.own)  # an overflow (infinite) first

    def as_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "precision": self.precision, "emulated": True, "model": self.model, "batch": self.batch,
                "how": HOW[self.precision] + ", against float64",
                "outputs": self.outputs,
                "nodes": [vars(n) | {"rank": i + 1} for i, n in enumerate(self.ranking())]}


class Emulation:
    """A model's nodes run one at a time on onnxruntime's CPU provider, each in a precision of its own (`run`),
    beside the exact result of every tensor (float64.evaluate). A node rounds what it reads and writes as its
    precision says (`_on_read`, `_on_write`), so tensors are kept as their writers left them: an FP32 node
    reading an FP16 node's output reads FP16 values, as a mixed plan converting at its boundaries would.
    The first run is in FP32, to learn each tensor's dtype; every run reuses the nodes' sessions."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], progress: Callable[[str, int, int], None] | None = None):
        graph = model.graph
        _refuse_what_cannot_run_alone(graph)
        constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for node in graph.node:  # Constant nodes' values, as constants
            if node.op_type == "Constant":
                constants[node.output[0]] = _constant_value(node)
        self.body = [n for n in graph.node if n.op_type != "Constant"]
        self.opset, self.outputs, self.progress = list(model.opset_import), [o.name for o in graph.output], progress
        self.given = {**{k: np.asarray(v) for k, v in feeds.items()}, **constants}
        written = [o for n in self.body for o in n.output if o]
        try:
            exact = float64.evaluate(self.body, feeds, constants, written, model.opset_import)
        except Exception as err:  # an op or a typing the evaluator lacks: said in one line, as what cannot be measured
            raise InputError(f"--precision: onnx's float64 reference cannot evaluate this graph: {first_line(err)}") from None
        self.exact = {**self.given, **exact}
        self._sessions: dict[int, Any] = {}
        self.dtypes = {name: value.dtype for name, value in self.run(lambda index: "fp32", "fp32").items()}

    def run(self, precision_of: Callable[[int], str], label: str) -> dict[str, np.ndarray]:
        """Every tensor of a pass through the model, node `index` in precision_of(index)."""
        values = dict(self.given)
        for index, node in enumerate(self.body):
            values.update(self._node(index, {i: values[i] for i in node.input if i}, precision_of(index)))
            if self.progress:
                self.progress(label, index + 1, len(self.body))
        return values

    def own(self, precision: str) -> list[dict[str, np.ndarray]]:
        """Each node's outputs in `precision`, alone on the exact values of its inputs (in the model's dtypes)."""
        found = []
        for index, node in enumerate(self.body):
            inputs = {i: np.asarray(self.exact[i]).astype(self.dtypes[i]) for i in node.input if i}
            found.append(self._node(index, inputs, precision))
            if self.progress:
                self.progress(f"{precision}, alone", index + 1, len(self.body))
        return found

    def float_outputs(self, index: int) -> list[str]:
        """The outputs of node `index` that hold numbers with fractions: those a precision can cost."""
        return [o for o in self.body[index].output if o and np.issubdtype(np.asarray(self.exact[o]).dtype, np.floating)]

    def _node(self, index: int, inputs: dict[str, np.ndarray], precision: str) -> dict[str, np.ndarray]:
        node = self.body[index]
        outputs = [o for o in node.output if o]
        try:
            return self._run_node(index, node, outputs, inputs, precision)
        except Exception as err:
            raise InputError(f"--precision: onnxruntime cannot run node {node.name or outputs[0]!r} ({node.op_type}) alone: "
                             f"{first_line(err)}") from None

    def _run_node(self, index: int, node: onnx.NodeProto, outputs: list[str], inputs: dict[str, np.ndarray], precision: str):
        import onnxruntime as ort

        session = self._sessions.get(index)
        if session is None:
            graph = helper.make_graph([node], "alone", [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                                                        for i, v in inputs.items()],
                                      [helper.make_empty_tensor_value_info(o) for o in outputs])
            alone = helper.make_model(graph, opset_imports=self.opset)
            alone.ir_version = min(alone.ir_version, 10)
            settings = ort.SessionOptions()
            settings.intra_op_num_threads = settings.inter_op_num_threads = 1  # a session a node: thread pools would cost more
            session = self._sessions[index] = ort.InferenceSession(alone.SerializeToString(), settings, providers=["CPUExecutionProvider"])
        read = {i: _on_read(node, v, precision) for i, v in inputs.items()}
        return {o: _on_write(v, precision) for o, v in zip(outputs, session.run(outputs, read))}


def measure(model: onnx.ModelProto, feeds: dict[str, np.ndarray], precision: str, name: str = "model",
            progress: Callable[[str, int, int], None] | None = None) -> PrecisionCost:
    """The cost of `precision` for `model` (the file's graph, names as written) on `feeds`."""
    if precision not in PRECISIONS:
        raise InputError(f"--precision {precision}: one of {', '.join(PRECISIONS)} is measured (fp32 is what check compares)")
    emulation = Emulation(model, feeds, progress)
    alone = emulation.own(precision)
    through = emulation.run(lambda index: precision, precision)
    result = PrecisionCost(precision, name, int(next(iter(feeds.values())).shape[0]) if feeds else 0)
    for index, node in enumerate(emulation.body):
        for output in emulation.float_outputs(index):
            truth = emulation.exact[output]
            result.nodes.append(NodeCost(node.name or output, node.op_type, output, own_error(alone[index][output], truth),
                                         relative_l2(through[output], truth), _made_nonfinite(through[output], truth)))
    for output in emulation.outputs:
        result.outputs[output] = output_error(through[output], emulation.exact[output])
    return result


def own_error(got: np.ndarray, exact: np.ndarray) -> float:
    """A node's own error: its relative L2, or infinite where it made a value infinite or NaN that float64 holds."""
    return float("inf") if _made_nonfinite(got, exact) else relative_l2(got, exact)


def relative_l2(got: np.ndarray, exact: np.ndarray) -> float:
    """||got - exact|| / ||exact|| over the values both hold finite (0 for a tensor of zeros matched)."""
    g, e = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    finite = np.isfinite(g) & np.isfinite(e)
    difference, norm = np.linalg.norm((g - e)[finite]), np.linalg.norm(e[finite])
    if norm > 0:
        return float(difference / norm)
    return 0.0 if difference == 0 else float("inf")


def output_error(got: np.ndarray, exact: np.ndarray) -> dict[str, float | None]:
    """A graph output's relative L2 error and, for (batch, classes) scores, top-1 agreement with float64."""
    error: dict[str, float | None] = {"rel_l2": relative_l2(got, exact), "nonfinite": _made_nonfinite(got, exact), "top1_agreement": None}
    g, e = np.asarray(got), np.asarray(exact)
    if g.ndim == 2 and g.shape[1] > 1:
        error["top1_agreement"] = float(np.mean(np.argmax(np.nan_to_num(g, nan=-np.inf), axis=1) == np.argmax(e, axis=1)))
    return error


def format_text(cost: PrecisionCost) -> str:
    fmt = cost.precision.upper()
    lines = [f"{fmt} cost of {cost.model} on {cost.batch} images, against float64. Emulated, so that each node's own",
             f"share shows (run --precision {cost.precision} runs the kernels): {HOW[cost.precision]}. Rounding to {fmt}",
             f"moves a value by at most {UNIT_ROUNDOFF[cost.precision]:.1e} of itself: a node's own error near that is the format's, "
             "above it the node's.", ""]
    for name, error in cost.outputs.items():
        top1 = "" if error["top1_agreement"] is None else f", top-1 agreement {error['top1_agreement']:.4f}"
        overflow = f", {error['nonfinite']} values not finite" if error["nonfinite"] else ""
        lines.append(f"Output {name}: relative L2 error {error['rel_l2']:.2e}{top1}{overflow}")
    lines += ["", f"The {min(RANKED, len(cost.nodes))} nodes that cost the most on their own (of {len(cost.nodes)}):",
              f"{'rank':>4}  {'node':40}  {'op':20}  {'own error':>9}  {'arriving':>9}"]
    for rank, node in enumerate(cost.ranking()[:RANKED], 1):
        flag = f"  {node.nonfinite} not finite" if node.nonfinite else ""
        lines.append(f"{rank:>4}  {elide_middle(node.name, 40):40}  {node.op:20}  {node.own:9.2e}  {node.arriving:9.2e}{flag}")
    return "\n".join(lines) + "\n"


def _made_nonfinite(got: np.ndarray, exact: np.ndarray) -> int:
    g, e = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    return int(np.count_nonzero(~np.isfinite(g) & np.isfinite(e)))


def _rounded(value: np.ndarray, precision: str) -> np.ndarray:
    value = np.asarray(value)
    return round_to(value, precision) if value.dtype == np.float32 else value


def _on_read(node: onnx.NodeProto, value: np.ndarray, precision: str) -> np.ndarray:
    """An input as a node in `precision` reads it: FP16 and BF16 round every float input, TF32 a product's."""
    if precision in ("fp16", "bf16") or (precision == "tf32" and node.op_type in PRODUCTS):
        return _rounded(value, precision)
    return np.asarray(value)


def _on_write(value: np.ndarray, precision: str) -> np.ndarray:
    """An output as a node in `precision` stores it: in FP16 or BF16; TF32's and FP32's stay FP32."""
    return _rounded(value, precision) if precision in ("fp16", "bf16") else np.asarray(value)


def _refuse_what_cannot_run_alone(graph: onnx.GraphProto) -> None:
    for node in graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise InputError(f"--precision: node {node.name or node.output[0]!r} ({node.op_type}) has a subgraph; "
                             "the precision cost is measured on graphs without control flow")
        if node.domain not in ("", "ai.onnx"):
            raise InputError(f"--precision: node {node.name or node.output[0]!r} is a {node.domain}::{node.op_type}; "
                             "the precision cost is measured on standard ONNX ops")


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    """A Constant node's value, whichever attribute holds it."""
    [attribute] = node.attribute
    value = helper.get_attribute_value(attribute)
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)
