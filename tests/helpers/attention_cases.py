"""Attention blocks as exporters write them, for the fused attention's tests: Q, K and V graph inputs
(N, H, T, D), K^T by a Transpose, then MatMul > [Mul or Div by a constant] > [Add of a bias] > Softmax >
MatMul."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from opplugin.core.number_formats import UNIT_ROUNDOFF
from opplugin.ops.gemm import attention


def attention_model(heads: int = 3, t: int = 20, d: int = 16, dv: int = 16, scale: float | None = 0.25, bias: str | None = "const",
                    div: bool = False, seed: int = 0, opset: int = 17, softmax_axis: int = -1) -> onnx.ModelProto:
    """`scale`: the factor after the scores (None: no Mul), written as Div by 1 / scale with `div`; `bias`:
    "const" (an initializer (1, H, T, T), as a relative position bias), "input" (a graph input (N, H, T, T))
    or None."""
    rng = np.random.default_rng(seed)
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", heads, t, width])
              for name, width in (("q", d), ("k", d), ("v", dv))]
    initializers = []
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], name="k_transposed", perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk")]
    last = "scores"
    if scale is not None:
        initializers.append(numpy_helper.from_array(np.array([1 / scale if div else scale], np.float32), "s"))
        nodes.append(helper.make_node("Div" if div else "Mul", [last, "s"], ["scaled"], name="scale"))
        last = "scaled"
    if bias == "const":
        initializers.append(numpy_helper.from_array(rng.standard_normal((1, heads, t, t)).astype(np.float32), "bias"))
    elif bias == "input":
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["N", heads, t, t]))
    if bias is not None:
        nodes.append(helper.make_node("Add", [last, "bias"], ["biased"], name="bias_add"))
        last = "biased"
    nodes += [helper.make_node("Softmax", [last], ["p"], name="softmax", axis=softmax_axis),
              helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", heads, t, dv])
    model = helper.make_model(helper.make_graph(nodes, "attention", inputs, [output], initializers),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def random_feeds(model: onnx.ModelProto, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {value.name: rng.standard_normal([batch, *(d.dim_value for d in value.type.tensor_type.shape.dim[1:])]).astype(np.float32)
            for value in model.graph.input}


def row_scale(scale: float, q: np.ndarray, kt: np.ndarray) -> np.ndarray:
    """Per query, the largest |scale| |Q| |K^T| of its row: a relative error in the scores moves them by that much of it."""
    return np.max(abs(scale) * (np.abs(q) @ np.abs(kt)), axis=-1, keepdims=True)


def error_scale(scale: float, q: np.ndarray, kt: np.ndarray, v: np.ndarray, p: np.ndarray) -> np.ndarray:
    """What float32 rounding errors of softmax(s) V scale with, per output element: P |V| from the second
    product, times 1 plus the largest |scale| |Q| |K^T| of the row, since an error in a score of that size
    moves every probability of its row relatively by as much. `p`: the probabilities in float64."""
    return (p @ np.abs(v)) * (1 + row_scale(scale, q, kt))


def tf32_bound(scale: float, q: np.ndarray, kt: np.ndarray, v: np.ndarray, p: np.ndarray) -> np.ndarray:
    """How far plain TF32's roundings may move each output from float64 (`p`: the probabilities in float64).
    Q and K^T rounded to TF32 (unit roundoff u = 2^-11) move each product q k by at most (2u + u^2) |q| |k|,
    so a score by (2u + u^2) |scale| |Q| |K^T|, at most M = (2u + u^2) row_scale in its row; the softmax
    then moves each probability by a factor within e^(+-2M). P and V rounded move each term p v by a factor
    within (1 +- u)^2 more: |y - exact| <= P |V| (e^(2M) (1 + u)^2 - 1). Sums count as exact here."""
    u = UNIT_ROUNDOFF["tf32"]
    return (p @ np.abs(v)) * (np.exp(2 * (2 * u + u * u) * row_scale(scale, q, kt)) * (1 + u) ** 2 - 1)


def float64_operands(spec, model, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Q, K^T, V and the bias (None without one) of attention_model's step in float64, from its feeds and
    initializers (K^T: K's last two axes swapped, as the graph's Transpose does)."""
    bias = model.initializers["bias"] if "bias" in spec.constants else feeds.get("bias")
    q, kt, v = (np.asarray(x, np.float64) for x in (feeds["q"], np.swapaxes(feeds["k"], -1, -2), feeds["v"]))
    return q, kt, v, None if bias is None else np.asarray(bias, np.float64)


def float64_result(spec, q: np.ndarray, kt: np.ndarray, v: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(softmax(..) V, the probabilities) in float64: the latter as the attention of V the identity."""
    identity = np.broadcast_to(np.eye(spec.tk), (*q.shape[:-2], spec.tk, spec.tk))
    return attention.reference(spec, q, kt, v, bias), attention.reference(spec, q, kt, identity, bias)


def scaled_operands_model(heads: int = 3, t: int = 30, d: int = 16, seed: int = 0) -> onnx.ModelProto:
    """torch's dynamo export of scaled-dot-product attention: Q and K^T each times d^-1/4, then MatMul >
    Softmax > MatMul (K^T by a Transpose of K)."""
    scale = numpy_helper.from_array(np.array([d ** -0.25], np.float32), "s")
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], name="k_transposed", perm=[0, 1, 3, 2]),
             helper.make_node("Mul", ["q", "s"], ["q_scaled"], name="q_scale"),
             helper.make_node("Mul", ["s", "kt"], ["kt_scaled"], name="k_scale"),
             helper.make_node("MatMul", ["q_scaled", "kt_scaled"], ["scores"], name="qk"),
             helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", heads, t, d]) for name in ("q", "k", "v")]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", heads, t, d])
    model = helper.make_model(helper.make_graph(nodes, "sdpa", inputs, [output], [scale]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def projected_attention_model(heads: int = 3, t: int = 20, d: int = 16, split: bool = False, seed: int = 0,
                              k_also_out: bool = False, tokens_first: bool = False) -> onnx.ModelProto:
    """A transformer's attention as torch's dynamo exporter writes it, from tokens x (N, T, C) to (N, T, C):
    one QKV projection, Reshape to (N, T, 3, H, D), Transpose to (3, N, H, T, D), Slice and Squeeze (or,
    with `split`, Split and Squeeze) per operand, K transposed per head through (N H, T, D), then
    MatMul > Mul > Softmax > MatMul, the heads merged by Transpose and Reshape. `k_also_out`: K is a
    graph output too; `tokens_first`: the heads merged into (T, N, C), as torchvision's multi-head
    attention leaves them, the batch no longer first."""
    rng = np.random.default_rng(seed)
    c = heads * d
    weights = {"w_qkv": (rng.standard_normal((c, 3 * c)) / np.sqrt(c)).astype(np.float32),
               "heads_shape": np.array([0, t, 3, heads, d], np.int64), "merged": np.array([-1, t, d], np.int64),
               "unmerged": np.array([-1, heads, d, t], np.int64), "tokens": np.array([0, t, c], np.int64),
               "scale": np.array([d ** -0.5], np.float32), "zero": np.array([0], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"], name="qkv_projection"),
             helper.make_node("Reshape", ["qkv", "heads_shape"], ["qkv_heads"], name="qkv_reshape"),
             helper.make_node("Transpose", ["qkv_heads"], ["qkv_first"], name="qkv_permute", perm=[2, 0, 3, 1, 4])]
    if split:
        nodes.append(helper.make_node("Split", ["qkv_first"], ["q1", "k1", "v1"], name="qkv_split", axis=0, num_outputs=3))
    else:
        for i, name in enumerate("qkv"):
            weights[f"start{i}"], weights[f"end{i}"] = np.array([i], np.int64), np.array([i + 1], np.int64)
            nodes.append(helper.make_node("Slice", ["qkv_first", f"start{i}", f"end{i}", "zero"], [f"{name}1"], name=f"{name}_slice"))
    for name in "qkv":
        nodes.append(helper.make_node("Squeeze", [f"{name}1", "zero"], [name], name=f"{name}_squeeze"))
    nodes += [helper.make_node("Reshape", ["k", "merged"], ["k_merged"], name="k_merge"),
              helper.make_node("Transpose", ["k_merged"], ["kt_merged"], name="k_transpose", perm=[0, 2, 1]),
              helper.make_node("Reshape", ["kt_merged", "unmerged"], ["kt"], name="k_unmerge"),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale_scores"),
              helper.make_node("Softmax", ["scaled"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["heads_out"], name="pv"),
              helper.make_node("Transpose", ["heads_out"], ["tokens_heads"], name="merge_heads", perm=[2, 0, 1, 3] if tokens_first else [0, 2, 1, 3])]
    if tokens_first:  # back to (N, T, C) after the merge, so that the graph's output has the batch first
        weights["tokens"] = np.array([t, -1, c], np.int64)
        nodes += [helper.make_node("Reshape", ["tokens_heads", "tokens"], ["tokens_merged"], name="merge_reshape"),
                  helper.make_node("Transpose", ["tokens_merged"], ["y"], name="batch_first", perm=[1, 0, 2])]
    else:
        nodes.append(helper.make_node("Reshape", ["tokens_heads", "tokens"], ["y"], name="merge_reshape"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", t, c])]
    if k_also_out:
        outputs.append(helper.make_tensor_value_info("k", TensorProto.FLOAT, ["N", heads, t, d]))
    graph = helper.make_graph(nodes, "projected_attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", t, c])],
                              outputs, [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def shifted_window_model(windows: int = 4, heads: int = 3, t: int = 16, d: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Swin's shifted-window attention as torch's dynamo exporter writes it: Q, K and V (N, windows, H, T, D)
    merged to (N windows, H, T, D), MatMul(Q, K^T) > Mul > Add of a relative position bias (1, H, T, T) >
    Reshape to (N, windows, H, T, T) > Add of a mask (1, windows, 1, T, T) (0 or -100, as torchvision's) >
    Reshape back > Softmax > MatMul(P, V) > Transpose(0, 2, 1, 3), out as (N, windows, T, H D)."""
    rng = np.random.default_rng(seed)
    mask = np.where(rng.random((1, windows, 1, t, t)) < 0.3, -100.0, 0.0).astype(np.float32)
    weights = {"bias": rng.standard_normal((1, heads, t, t)).astype(np.float32), "mask": mask,
               "scale": np.array([d ** -0.5], np.float32), "merged": np.array([-1, heads, t, d], np.int64),
               "split": np.array([-1, windows, heads, t, t], np.int64), "scores": np.array([-1, heads, t, t], np.int64),
               "out": np.array([-1, windows, t, heads * d], np.int64)}
    nodes = [helper.make_node("Reshape", [name, "merged"], [f"{name}_w"], name=f"{name}_merge") for name in ("q", "k", "v")]
    nodes += [helper.make_node("Transpose", ["k_w"], ["kt"], name="k_transposed", perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q_w", "kt"], ["s"], name="qk"),
              helper.make_node("Mul", ["s", "scale"], ["scaled"], name="scale_scores"),
              helper.make_node("Add", ["scaled", "bias"], ["biased"], name="bias_add"),
              helper.make_node("Reshape", ["biased", "split"], ["by_window"], name="window_split"),
              helper.make_node("Add", ["by_window", "mask"], ["masked"], name="mask_add"),
              helper.make_node("Reshape", ["masked", "scores"], ["masked_scores"], name="window_merge"),
              helper.make_node("Softmax", ["masked_scores"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v_w"], ["heads_out"], name="pv"),
              helper.make_node("Transpose", ["heads_out"], ["tokens_heads"], name="merge_heads", perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["tokens_heads", "out"], ["y"], name="out_reshape")]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", windows, heads, t, d]) for name in ("q", "k", "v")]
    graph = helper.make_graph(nodes, "shifted_windows", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", windows, t, heads * d])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
