"""NaN and Inf cases the exact-path tests share: poisoned inputs, a pooling net, a Conv plugin that never fuses, and the comparison with onnxruntime's NaN placement."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from opplugin.graph.model import load_model
from opplugin.ops.conv.plugin import ConvPlugin
from opplugin.runtime import Runner


def poisoned(x):
    x = x.copy()
    x[0, 0, 5, 5] = np.nan
    x[1, 0, 3:6, 3:6] = np.inf
    x[2] = -np.inf
    x[3, 0, 0, 0] = np.nan
    x[3, 0, 9, 9] = np.inf
    return x


class UnfusedConv(ConvPlugin):
    """The built-in Conv plugin without fusion: Relu and MaxPool stay in onnxruntime."""

    def fuse(self, node, followers, device):
        return 0


MAP_WEIGHTS = (1.5, -0.7, 0.3)  # conv1 is 1x1: input poison lands at the same place, +inf turning -inf in map 1


def pool_net(activation, pool, size, outputs=("p1", "y")):
    """x -> Conv 1x1 -> activation -> MaxPool(pool) = p1 -> Conv 3x3 (pad 1) -> activation
    -> MaxPool 2 = p2 -> Flatten = y: two fused steps, p1 a graph output too."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx_builders import finish

    rng = np.random.default_rng(3)
    w1 = np.array(MAP_WEIGHTS, np.float32).reshape(3, 1, 1, 1)
    b1 = np.array([0.05, -0.02, 0.01], np.float32)
    w2 = (rng.standard_normal((4, 3, 3, 3)) * 0.4).astype(np.float32)
    h, w = size[0] // pool, size[1] // pool
    shapes = {"p1": ["N", 3, h, w], "p2": ["N", 4, h // 2, w // 2], "y": ["N", 4 * (h // 2) * (w // 2)]}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1"),
        helper.make_node(activation, ["c1"], ["a1"], name="act1"),
        helper.make_node("MaxPool", ["a1"], ["p1"], name="pool1", kernel_shape=[pool, pool], strides=[pool, pool]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node(activation, ["c2"], ["a2"], name="act2"),
        helper.make_node("MaxPool", ["a2"], ["p2"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["y"], name="flatten"),
    ]
    graph = helper.make_graph(
        nodes, "pool_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, *size])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shapes[name]) for name in outputs],
        initializer=[numpy_helper.from_array(a, n) for a, n in [(w1, "w1"), (b1, "b1"), (w2, "w2")]],
    )
    return finish(graph)


def window_places(pool, size):
    """(row, column) of conv1's output: each corner of the first window, the first and last
    element of the last whole window in row 0, and a column the floor-mode pool drops."""
    k = pool
    last = (size[1] // k - 1) * k
    places = [(0, 0), (0, k - 1), (k - 1, 0), (k - 1, k - 1), (1, 1), (k, last), (k + k - 1, last + k - 1)]
    if size[1] % k:
        places.append((0, size[1] - 1))
    return places


def poisoned_batch(pool, size):
    """One image per (value, place), then two clean ones."""
    cases = [(value, place) for value in (np.nan, np.inf, -np.inf) for place in window_places(pool, size)]
    x = np.random.default_rng(11).uniform(-1, 1, (len(cases) + 2, 1, *size)).astype(np.float32)
    for image, (value, (row, column)) in enumerate(cases):
        x[image, 0, row, column] = value
    return x, cases


def same_as_onnxruntime(ours, reference, rtol=1e-5, atol=1e-6):
    """NaN and +-inf at exactly onnxruntime's places, the rest within tolerance."""
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(reference))
    np.testing.assert_array_equal(np.isposinf(ours), np.isposinf(reference))
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(reference))
    np.testing.assert_allclose(ours, reference, rtol=rtol, atol=atol)


def conv_chain_without_pool(seed: int = 0, channels: int = 3, maps: int = 8, size: int = 12):
    """Conv > Relu > Conv > Tanh, batch axis "N": fused steps whose NaN and Inf need no watch."""
    from onnx import TensorProto, helper, numpy_helper

    from onnx_builders import finish

    rng = np.random.default_rng(seed)
    weights = {"w1": rng.standard_normal((maps, channels, 3, 3)), "b1": rng.standard_normal(maps),
               "w2": rng.standard_normal((maps, maps, 3, 3)) * 0.2, "b2": rng.standard_normal(maps)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Tanh", ["c2"], ["y"], name="tanh2"),
    ]
    graph = helper.make_graph(
        nodes, "conv_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", maps, size, size])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    return finish(graph)


def nan_through_fused_steps_without_pool(device: str, tmp_path):
    """A poisoned batch through Conv > Relu and Conv > Tanh, both fused: no step is watched, no chunk
    runs again, and NaN and Inf land where onnxruntime's CPU provider puts them."""
    from onnx_builders import save

    path = save(conv_chain_without_pool(), tmp_path / "conv_chain.onnx")
    x = poisoned(np.random.default_rng(1).uniform(-1, 1, (6, 3, 12, 12)).astype(np.float32))
    runner = Runner(load_model(path), len(x), device, chunk=2)
    assert [s.ops for s in runner.plan.plugin_steps] == [["Conv", "Relu"], ["Conv", "Tanh"]]
    assert not runner.exact.watched
    result = runner.run({"x": x})
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert result.exact_reruns == 0 and np.isnan(reference).any()
    np.testing.assert_array_equal(np.isnan(result.outputs["y"]), np.isnan(reference))
    np.testing.assert_allclose(result.outputs["y"], reference, rtol=1e-4, atol=1e-5)  # equal NaN and Inf, near elsewhere
