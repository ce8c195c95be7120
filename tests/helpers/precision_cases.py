"""Models and inputs for the precision tests: check --precision's (a small CNN's feeds, and a model whose values pass
FP16's range), and a run's --precision's (a model with a step of each kind, a product alone, a batched product, a
transformer's MLP block, for mixed two product steps, the second past FP16's range at will, Convs wide enough for
wg_fp16 and wg_bf16, and MobileNet-V2's block, whose depthwise Conv runs on dw_fp16 and dw_bf16)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import finish


def feeds_for(model: onnx.ModelProto, batch: int = 16, seed: int = 1) -> dict[str, np.ndarray]:
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    return {model.graph.input[0].name: np.random.default_rng(seed).standard_normal((batch, *dims)).astype(np.float32)}


def overflowing_model() -> onnx.ModelProto:
    """y = Relu(x * 1000): past FP16's 65504 wherever x > 65.5, within BF16's range."""
    graph = helper.make_graph([helper.make_node("Mul", ["x", "big"], ["scaled"], name="scale"),
                               helper.make_node("Relu", ["scaled"], ["y"], name="relu")], "overflow",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                              [numpy_helper.from_array(np.array(1000.0, np.float32), "big")])
    return finish(graph)


def conv_mlp_model(seed: int = 0) -> onnx.ModelProto:
    """A run's --precision meets every kind of step: Conv > Relu (Conv stays FP32: 4 maps, as lenet86's first), Flatten
    (a view), MatMul (256 -> 64) > Add (its bias) > Relu (a flat product: FP16-able), Gemm (64 -> 10) > Softmax
    (rowwarp's fused Softmax, which no reduced-precision family fuses), then a Transpose no plugin takes where the
    registry is cut down to these ops."""
    rng = np.random.default_rng(seed)
    weights = {"cw": rng.standard_normal((4, 3, 3, 3)) * 0.3, "mw": rng.standard_normal((256, 64)) * 0.07,
               "mb": rng.standard_normal(64) * 0.1, "gw": rng.standard_normal((10, 64)) * 0.2, "gb": rng.standard_normal(10) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "mw"], ["m"], name="fc1"),
             helper.make_node("Add", ["m", "mb"], ["mbias"], name="fc1_bias"),
             helper.make_node("Relu", ["mbias"], ["h"], name="fc1_relu"),
             helper.make_node("Gemm", ["h", "gw", "gb"], ["logits"], name="fc2", transB=1),
             helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "conv_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
                              [numpy_helper.from_array(np.asarray(value, np.float32), name) for name, value in weights.items()])
    return finish(graph)


def product_model(k: int = 64, n: int = 48, op: str = "MatMul", seed: int = 0) -> onnx.ModelProto:
    """One flat product of (N, k) by a constant weight, (k, n) for MatMul, (n, k) with transB for Gemm: the step alone."""
    w = (np.random.default_rng(seed).standard_normal((k, n) if op == "MatMul" else (n, k)) / np.sqrt(k)).astype(np.float32)
    node = helper.make_node(op, ["x", "w"], ["y"], name="product", **({} if op == "MatMul" else {"transB": 1}))
    graph = helper.make_graph([node], "product", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])], [numpy_helper.from_array(w, "w")])
    return finish(graph)


def attention_scores_model(tokens: int = 8, width: int = 16) -> onnx.ModelProto:
    """A batched product: (N, T, D) by its own transpose, (N, D, T), both computed at run time."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="transpose", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["y"], name="scores")]
    graph = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", tokens, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", tokens, tokens])])
    return finish(graph)


LN_EPSILON = 1e-5


def mlp_block_model(tokens: int = 50, width: int = 64, hidden: int = 256, seed: int = 0, layernorm: bool = False) -> onnx.ModelProto:
    """A transformer's MLP block on (N, tokens, width): x + MatMul(Gelu(MatMul(x', W1) + b1), W2) + b2, x' = x or (with
    `layernorm`) LayerNorm(x) over the last axis, the prologue of the first product's step; the residual Add joins the
    second product's step where wg's epilogue adds it."""
    rng = np.random.default_rng(seed)
    weights = {"w1": rng.standard_normal((width, hidden)) / np.sqrt(width), "b1": rng.standard_normal(hidden) * 0.1,
               "w2": rng.standard_normal((hidden, width)) / np.sqrt(hidden), "b2": rng.standard_normal(width) * 0.1,
               "root2": np.sqrt(2.0), "one": 1.0, "half": 0.5}
    norm = []
    if layernorm:
        weights |= {"ln_scale": 1 + 0.2 * rng.standard_normal(width), "ln_bias": 0.1 * rng.standard_normal(width)}
        norm = [helper.make_node("LayerNormalization", ["x", "ln_scale", "ln_bias"], ["xn"], name="ln", axis=-1, epsilon=LN_EPSILON)]
    nodes = [*norm, helper.make_node("MatMul", ["xn" if layernorm else "x", "w1"], ["h0"], name="fc1"),
             helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
             # GELU written out as torch exports it, h1 * (0.5 * (1 + erf(h1 / sqrt 2))): one Gelu node at load
             helper.make_node("Div", ["h1", "root2"], ["g0"], name="gelu_div"),
             helper.make_node("Erf", ["g0"], ["g1"], name="gelu_erf"),
             helper.make_node("Add", ["g1", "one"], ["g2"], name="gelu_add"),
             helper.make_node("Mul", ["half", "g2"], ["g3"], name="gelu_half"),
             helper.make_node("Mul", ["h1", "g3"], ["h"], name="gelu"),
             helper.make_node("MatMul", ["h", "w2"], ["o0"], name="fc2"),
             helper.make_node("Add", ["o0", "b2"], ["o1"], name="fc2_bias"),
             helper.make_node("Add", ["x", "o1"], ["y"], name="residual")]
    graph = helper.make_graph(nodes, "mlp_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", tokens, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", tokens, width])],
                              [numpy_helper.from_array(np.asarray(value, np.float32), name) for name, value in weights.items()])
    return finish(graph)


def two_products_model(scale: float = 1.0, seed: int = 0) -> onnx.ModelProto:
    """Two flat products a mixed run can run in FP16, each its own step: MatMul (32 -> 64) > Relu, then MatMul (64 -> 10)
    > Add, whose weights and bias are scaled by `scale`: at 1e6 the second step's outputs pass FP16's 65504, so a budget
    keeps it (and only it) in FP32."""
    rng = np.random.default_rng(seed)
    weights = {"w1": rng.standard_normal((32, 64)) / np.sqrt(32), "w2": rng.standard_normal((64, 10)) * scale / 8,
               "b2": rng.standard_normal(10) * 0.1 * scale}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
             helper.make_node("Relu", ["h0"], ["h"], name="fc1_relu"),
             helper.make_node("MatMul", ["h", "w2"], ["o"], name="fc2"),
             helper.make_node("Add", ["o", "b2"], ["y"], name="fc2_bias")]
    graph = helper.make_graph(nodes, "two_products", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
                              [numpy_helper.from_array(np.asarray(value, np.float32), name) for name, value in weights.items()])
    return finish(graph)


def mobilenet_block_model(channels: int = 32, expand: int = 3, size: int = 12) -> onnx.ModelProto:
    """A stem (3 -> channels, 3x3) > Relu (t0), then MobileNet-V2's inverted residual block on it: a 1x1 expand
    (channels -> expand x channels) > Clip(0, 6) (t1), a depthwise 3x3 > Clip(0, 6) (t2), a 1x1 project back to
    `channels` > + t0 (y, the output), with realistic weights and biases."""
    rng = np.random.default_rng(1)
    wide = channels * expand
    weights = {"w0": rng.standard_normal((channels, 3, 3, 3)) / np.sqrt(27), "b0": rng.standard_normal(channels) * 0.1,
               "we": rng.standard_normal((wide, channels, 1, 1)) / np.sqrt(channels), "be": rng.standard_normal(wide) * 0.1,
               "wd": rng.standard_normal((wide, 1, 3, 3)) / 3, "bd": rng.standard_normal(wide) * 0.1,
               "wp": rng.standard_normal((channels, wide, 1, 1)) / np.sqrt(wide), "bp": rng.standard_normal(channels) * 0.1,
               "lo": 0.0, "hi": 6.0}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["t0"], name="stem_relu"),
             helper.make_node("Conv", ["t0", "we", "be"], ["ce"], name="expand"),
             helper.make_node("Clip", ["ce", "lo", "hi"], ["t1"], name="expand_clip"),
             helper.make_node("Conv", ["t1", "wd", "bd"], ["cd"], name="depthwise", pads=[1, 1, 1, 1], group=wide),
             helper.make_node("Clip", ["cd", "lo", "hi"], ["t2"], name="depthwise_clip"),
             helper.make_node("Conv", ["t2", "wp", "bp"], ["cp"], name="project"),
             helper.make_node("Add", ["cp", "t0"], ["y"], name="residual")]
    return _graph("mobilenet_block", nodes, weights, size, ["N", channels, size, size])


def resnext_block_model(channels: int = 32, size: int = 10) -> onnx.ModelProto:
    """A stem (3 -> channels, 3x3) > Relu (t0), then a ResNeXt-like bottleneck on it: a 1x1 reduce > Relu (t1), a
    grouped 3x3 of 4 channels a group > Relu (t2), a grouped 3x3 of 8 channels a group + t1 (t3: a residual inside),
    a 1x1 project + t0 (y, the output), with realistic weights and biases."""
    rng = np.random.default_rng(2)
    c = channels
    weights = {"w0": rng.standard_normal((c, 3, 3, 3)) / np.sqrt(27), "b0": rng.standard_normal(c) * 0.1,
               "wr": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c), "br": rng.standard_normal(c) * 0.1,
               "wg4": rng.standard_normal((c, 4, 3, 3)) / 6, "bg4": rng.standard_normal(c) * 0.1,
               "wg8": rng.standard_normal((c, 8, 3, 3)) / np.sqrt(72), "bg8": rng.standard_normal(c) * 0.1,
               "wp": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c), "bp": rng.standard_normal(c) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["t0"], name="stem_relu"),
             helper.make_node("Conv", ["t0", "wr", "br"], ["cr"], name="reduce"),
             helper.make_node("Relu", ["cr"], ["t1"], name="reduce_relu"),
             helper.make_node("Conv", ["t1", "wg4", "bg4"], ["cg4"], name="grouped4", pads=[1, 1, 1, 1], group=c // 4),
             helper.make_node("Relu", ["cg4"], ["t2"], name="grouped4_relu"),
             helper.make_node("Conv", ["t2", "wg8", "bg8"], ["cg8"], name="grouped8", pads=[1, 1, 1, 1], group=c // 8),
             helper.make_node("Add", ["cg8", "t1"], ["t3"], name="inner_residual"),
             helper.make_node("Conv", ["t3", "wp", "bp"], ["cp"], name="project"),
             helper.make_node("Add", ["cp", "t0"], ["y"], name="residual")]
    return _graph("resnext_block", nodes, weights, size, ["N", c, size, size])


def se_block_model(channels: int = 64, squeezed: int = 16, size: int = 12) -> onnx.ModelProto:
    """EfficientNet's squeeze-and-excitation in small: a stem (3 -> channels) > Relu (t0), a depthwise 3x3 > SiLU (d,
    as Sigmoid and Mul), its global average pool > 1x1 (-> squeezed) > Relu > 1x1 (-> channels) > Sigmoid (s),
    d * s (m, the prologue of the projection) > a 1x1 projection > + t0 (y)."""
    rng = np.random.default_rng(3)
    weights = {"w0": rng.standard_normal((channels, 3, 3, 3)) / np.sqrt(27), "b0": rng.standard_normal(channels) * 0.1,
               "wd": rng.standard_normal((channels, 1, 3, 3)) / 3, "bd": rng.standard_normal(channels) * 0.1,
               "wr": rng.standard_normal((squeezed, channels, 1, 1)) / np.sqrt(channels), "br": rng.standard_normal(squeezed) * 0.1,
               "we": rng.standard_normal((channels, squeezed, 1, 1)) / np.sqrt(squeezed), "be": rng.standard_normal(channels) * 0.1,
               "wp": rng.standard_normal((channels, channels, 1, 1)) / np.sqrt(channels), "bp": rng.standard_normal(channels) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["t0"], name="stem_relu"),
             helper.make_node("Conv", ["t0", "wd", "bd"], ["cd"], name="depthwise", pads=[1, 1, 1, 1], group=channels),
             helper.make_node("Sigmoid", ["cd"], ["gate"], name="depthwise_sigmoid"),
             helper.make_node("Mul", ["cd", "gate"], ["d"], name="depthwise_silu"),
             helper.make_node("GlobalAveragePool", ["d"], ["g"], name="squeeze"),
             helper.make_node("Conv", ["g", "wr", "br"], ["cr"], name="reduce"),
             helper.make_node("Relu", ["cr"], ["tr"], name="reduce_relu"),
             helper.make_node("Conv", ["tr", "we", "be"], ["ce"], name="expand"),
             helper.make_node("Sigmoid", ["ce"], ["s"], name="excite"),
             helper.make_node("Mul", ["d", "s"], ["m"], name="scale"),
             helper.make_node("Conv", ["m", "wp", "bp"], ["cp"], name="project"),
             helper.make_node("Add", ["cp", "t0"], ["y"], name="residual")]
    return _graph("se_block", nodes, weights, size, ["N", channels, size, size])


def conv_pair_model(channels: int = 64) -> onnx.ModelProto:
    """Conv (3 -> channels, a stem) > Relu > Conv (channels -> channels, 3x3) > Relu > Conv (1x1) > +
    the first Relu's output (a residual), with realistic weights."""
    rng = np.random.default_rng(0)
    weights = {"w0": rng.standard_normal((channels, 3, 3, 3)) / np.sqrt(27), "w1": rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels),
               "b1": rng.standard_normal(channels) * 0.1, "w2": rng.standard_normal((channels, channels, 1, 1)) / np.sqrt(channels)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="stem_relu"),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], name="conv3x3", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv1x1"),
             helper.make_node("Add", ["c2", "r0"], ["y"], name="residual")]
    return _graph("conv_pair", nodes, weights, 12, ["N", channels, 12, 12])


def _convs(channels: int, rng) -> tuple[dict[str, np.ndarray], list[onnx.NodeProto]]:
    """The weights and nodes of stem (3 -> channels, 3x3) > Relu (r0), the start of the pooled models."""
    weights = {"w0": rng.standard_normal((channels, 3, 3, 3)) / np.sqrt(27)}
    return weights, [helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
                     helper.make_node("Relu", ["c0"], ["r0"], name="stem_relu")]


def _graph(name: str, nodes, weights, size: int, output: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()])
    return finish(graph)


def conv_pool_model(pool: str = "MaxPool", channels: int = 64) -> onnx.ModelProto:
    """ResNet's stem and first block in small: stem > Relu (r0) > `pool` 3x3 stride 2 pads 1 (p, a window no Conv
    fuses) > Conv 3x3 > Relu (r1) > Conv 1x1 > + p (y)."""
    rng = np.random.default_rng(1)
    weights, nodes = _convs(channels, rng)
    weights |= {"w1": rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels), "b1": rng.standard_normal(channels) * 0.1,
                "w2": rng.standard_normal((channels, channels, 1, 1)) / np.sqrt(channels)}
    nodes += [helper.make_node(pool, ["r0"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
              helper.make_node("Conv", ["p", "w1", "b1"], ["c1"], name="conv3x3", pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
              helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv1x1"),
              helper.make_node("Add", ["c2", "p"], ["y"], name="residual")]
    return _graph("conv_pool", nodes, weights, 16, ["N", channels, 8, 8])


HEADS = ("GlobalAveragePool", "ReduceMean", "ReduceMean_flat")  # the last with keepdims 0: (N, C), no Flatten


def conv_head_model(head: str = "GlobalAveragePool", channels: int = 64, classes: int = 10) -> onnx.ModelProto:
    """A network's end in small: stem > Relu (r0) > Conv 3x3 > Relu (r1) > `head` over H and W (g) > Flatten (f) >
    Gemm (y, the classes)."""
    rng = np.random.default_rng(2)
    weights, nodes = _convs(channels, rng)
    weights |= {"w1": rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels),
                "fc_w": rng.standard_normal((classes, channels)) / np.sqrt(channels), "fc_b": rng.standard_normal(classes) * 0.1}
    nodes += [helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv3x3", pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c1"], ["r1"], name="relu")]
    if head == "GlobalAveragePool":
        nodes.append(helper.make_node(head, ["r1"], ["g"], name="head"))
    else:
        nodes.append(helper.make_node("ReduceMean", ["r1"], ["g"], name="head", axes=[2, 3], keepdims=int(head == "ReduceMean")))
    flat = head != "ReduceMean_flat"
    if flat:
        nodes.append(helper.make_node("Flatten", ["g"], ["f"], name="flatten"))
    nodes.append(helper.make_node("Gemm", ["f" if flat else "g", "fc_w", "fc_b"], ["y"], name="fc", transB=1))
    return _graph("conv_head", nodes, weights, 12, ["N", classes])
