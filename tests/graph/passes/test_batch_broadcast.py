"""Load-time rewrite of an Expand to the batch's shape (graph/passes/batch_broadcast.py): a class token, a constant
(1, 1, D) expanded to (batch, 1, D) by Shape > Concat > Expand and joined to the tokens, becomes
Where(True, token, probe) with a probe of (batch, 1, 1) cut from the input. The rewritten graph
computes what the original does at every batch, NaN in the input included; its plan keeps no
onnxruntime step; `check` passes and names the helper tensors it cannot compare; an Expand that
also widens a later axis stays."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import finish, save

from opplugin.graph.passes.batch_broadcast import COUNT_KEY
from opplugin.cli import main
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.plan.partition import OrtStep, make_plan
from opplugin.graph.simplify import simplify

pytestmark = pytest.mark.filterwarnings("error::opplugin.graph.model.SimplificationWarning")

TOKENS, WIDTH = 4, 6


def class_token_model(expand_tokens: int = 1) -> onnx.ModelProto:
    """x (N, TOKENS, WIDTH); Concat(Expand(token, [N, expand_tokens, 1]), x) on axis 1, then Relu."""
    token = np.random.default_rng(5).standard_normal((1, 1, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
        helper.make_node("Concat", ["batch", "tokens", "one"], ["target"], axis=0),
        helper.make_node("Expand", ["token", "target"], ["expanded"]),
        helper.make_node("Concat", ["expanded", "x"], ["joined"], axis=1),
        helper.make_node("Relu", ["joined"], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(token, "token"),
        numpy_helper.from_array(np.array([expand_tokens], np.int64), "tokens"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", TOKENS, WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", TOKENS + expand_tokens, WIDTH])
    return finish(helper.make_graph(nodes, "class_token", [x], [y], initializers))


def outputs(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_class_token_broadcasts_to_the_batch_without_its_shape_arithmetic():
    model = class_token_model()
    folded, done = simplify(model)
    assert [n.op_type for n in folded.graph.node] == ["Slice", "Reshape", "Where", "Concat", "Relu"]
    assert done.constants_folded.get(COUNT_KEY) == 1
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, TOKENS, WIDTH)).astype(np.float32)
        np.testing.assert_array_equal(outputs(folded, x), outputs(model, x))


def test_the_probes_values_never_reach_the_output():
    model = class_token_model()
    folded, _ = simplify(model)
    x = np.full((2, TOKENS, WIDTH), np.nan, np.float32)
    ours = outputs(folded, x)
    assert not np.isnan(ours[:, 0]).any()  # the class token's row: nothing of x in it
    np.testing.assert_array_equal(ours, outputs(model, x))


def test_the_plan_has_no_onnxruntime_step_and_check_names_the_helpers(tmp_path, capsys):
    path = save(class_token_model(), tmp_path / "class_token.onnx")
    plan = make_plan(load_model(path), 3, Device("cpu", "cpu"))
    assert not [s for s in plan.steps if isinstance(s, OrtStep)]
    assert main(["check", path, "--batch", "3", "--device", "cpu", "--data", "random"]) == 0
    out = capsys.readouterr().out
    # the probe's Reshape is read as a view by the Where's step: only the probe itself is a step's tensor
    assert "Not compared: 1 tensor made at load" in out and "expanded_batch_probe" in out


def test_an_expand_that_also_widens_an_axis_stays():
    folded, done = simplify(class_token_model(expand_tokens=2))
    assert "Expand" in [n.op_type for n in folded.graph.node] and COUNT_KEY not in done.constants_folded


def test_an_expand_of_integers_stays():
    """Where takes the probe's type too: an int64 constant (position ids, say) is left to onnxruntime."""
    model = class_token_model()
    token = next(t for t in model.graph.initializer if t.name == "token")
    token.CopyFrom(numpy_helper.from_array(np.arange(WIDTH, dtype=np.int64).reshape(1, 1, WIDTH), "token"))
    model.graph.node[3].input[0] = "expanded_float"
    model.graph.node.insert(3, helper.make_node("Cast", ["expanded"], ["expanded_float"], to=TensorProto.FLOAT))
    folded, done = simplify(model)
    assert "Expand" in [n.op_type for n in folded.graph.node] and COUNT_KEY not in done.constants_folded
