"""ONNX nodes evaluated in float64: the exact result that arbitrates when opplugin and
onnxruntime disagree (check's verdicts, first_bad.py), and a whole model's exact outputs,
which `bench --e2e --precision` measures a reduced precision against.

The nodes are copied into a small model whose float32 tensors, constants and casts
become float64, and onnx's ReferenceEvaluator runs it: its ops are numpy, so the
arithmetic is float64 throughout (onnxruntime's CPU provider has no float64 Conv).
The oracle is the ONNX definition of the nodes, not the plugin under judgement.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph.float64_nodes import node_in_float64, up


def evaluate(nodes: Sequence[onnx.NodeProto], inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray],
             outputs: Sequence[str], opset_import: Sequence[onnx.OperatorSetIdProto], new_ops: Sequence[type] = ()) -> dict[str, np.ndarray]:
    """`outputs` of `nodes` in float64, from `inputs` (cast up) and the `constants` they read;
    `new_ops`: onnx OpRun classes for ops the evaluator lacks (custom ops' references).
    Raises whatever the evaluator raises for an op it cannot run."""
    from onnx.reference import ReferenceEvaluator

    read = dict.fromkeys(i for n in nodes for i in n.input if i)
    feeds = {name: up(value) for name, value in inputs.items() if name in read}
    initializers = [numpy_helper.from_array(up(constants[name]), name) for name in read if name in constants and name not in feeds]
    graph = helper.make_graph(
        [node_in_float64(n) for n in nodes], "float64",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), None) for name, value in feeds.items()],
        [helper.make_empty_tensor_value_info(name) for name in outputs], initializer=initializers)
    imports = list(opset_import) + [helper.make_opsetid(domain, 1) for domain in
                                    dict.fromkeys(op.op_domain for op in new_ops) if domain not in {o.domain for o in opset_import}]
    model = helper.make_model(graph, opset_imports=imports)
    with np.errstate(all="ignore"):  # overflow inside a saturating op (Sigmoid of -800) is its right answer
        results = ReferenceEvaluator(model, new_ops=list(new_ops) or None).run(list(outputs), feeds)
    return dict(zip(outputs, (np.asarray(r) for r in results)))


def evaluate_model(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of a whole model in float64 (`evaluate` over all its nodes, its initializers as the
    constants): the exact result a run in a reduced precision is measured against (bench --e2e --precision)."""
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    return evaluate(graph.node, inputs, constants, [output.name for output in graph.output], model.opset_import)


# float32's unit roundoff
UNIT_ROUNDOFF = 2.0 ** -24
# Ops whose every output element is a sum of products: their float32 error has a classical bound
SUMS_OF_PRODUCTS = {"Conv", "Gemm", "MatMul"}


def fp32_bound(nodes: Sequence[onnx.NodeProto], inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray],
               opset_import: Sequence[onnx.OperatorSetIdProto], exact: np.ndarray | None = None) -> np.ndarray | None:
    """Per element of the last node's output, how far from the exact result any float32
    implementation of `nodes` may land, or None where no bound is known (the lead node is
    not a sum of products).

    The lead node's error is at most gamma_K * sum |terms| (K products per output element,
    gamma_K = K u / (1 - K u), Higham's bound for any summation order), with sum |terms| the
    node itself evaluated on the absolute values of its operands; plus one rounding of its
    result. The nodes after it carry that error as their own slopes do: they are evaluated at
    the exact result plus and minus the bound, and each adds a rounding of its own. `exact`:
    the lead node's float64 output where the caller has it."""
    lead, followers = nodes[0], list(nodes[1:])
    if lead.op_type not in SUMS_OF_PRODUCTS or lead.domain not in ("", "ai.onnx"):
        return None
    values = {**constants, **inputs}
    operands = [np.asarray(values[name]) for name in lead.input if name]
    terms = _terms_per_output(lead, operands)
    if terms is None:
        return None
    absolute = {name: np.abs(up(values[name])) for name in lead.input if name}
    magnitude = np.abs(evaluate([lead], absolute, {}, [lead.output[0]], opset_import)[lead.output[0]])
    if exact is None:
        exact = evaluate([lead], inputs, constants, [lead.output[0]], opset_import)[lead.output[0]]
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    known = {**inputs, lead.output[0]: exact}
    bounds = {lead.output[0]: gamma * magnitude + UNIT_ROUNDOFF * np.abs(exact)}  # intermediate -> its bound
    result = lead.output[0]
    for follower in followers:
        result = follower.output[0]
        at = [evaluate([follower], {**known, **{name: known[name] + sign * bound for name, bound in bounds.items()}},
                       constants, [result], opset_import)[result] for sign in (0, 1, -1)]
        with np.errstate(invalid="ignore"):
            spread = np.maximum(np.abs(at[1] - at[0]), np.abs(at[2] - at[0]))
        known[result] = at[0]
        bounds[result] = np.nan_to_num(spread, nan=np.inf) + UNIT_ROUNDOFF * np.abs(at[0])
    return bounds[result]


def _terms_per_output(node: onnx.NodeProto, operands: list[np.ndarray]) -> int | None:
    """K: the products summed into each output element."""
    if node.op_type == "Conv" and len(operands) > 1:
        return int(np.prod(operands[1].shape[1:]))
    if node.op_type == "MatMul" and operands and operands[0].ndim:
        return int(operands[0].shape[-1])
    if node.op_type == "Gemm" and operands and operands[0].ndim == 2:
        transposed = any(a.name == "transA" and a.i for a in node.attribute)
        return int(operands[0].shape[0 if transposed else 1])
    return None
