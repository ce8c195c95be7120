"""Load-time simplification as a whole (graph/simplify.py): the original model untouched, constants
folded and identities dropped with the graph outputs keeping their names, the rule that names
survive for `check`, and a failing simplification running the graph as loaded. Each pass has its
own tests in passes/."""
import os

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_builders import conv_bn_relu, identities_and_constants, save, x_feeds

import opplugin.graph.model as model_module
from opplugin.gpu.device import Device
from opplugin.graph import simplify as simplify_module
from opplugin.graph.ir import Graph
from opplugin.graph.model import load_model
from opplugin.graph.simplify import NamesLost, simplify_apart
from opplugin.ort.sessions import Reference
from opplugin.plan.partition import OrtStep, PluginStep, make_plan
from opplugin.runtime import Runner
from opplugin.verify import check as check_module
from opplugin.verify.check import check
from plan_text import describe

CPU = Device("cpu", "cpu")

# A simplification that fails falls back to the graph as loaded with a warning: here that is an error,
# so a broken pass cannot hide behind the fallback.
pytestmark = pytest.mark.filterwarnings("error::opplugin.graph.model.SimplificationWarning")


def test_original_model_is_kept_untouched(tmp_path):
    proto = conv_bn_relu()
    model = load_model(save(proto, tmp_path / "m.onnx"))
    assert [n.op_type for n in model.original.graph.node] == ["Conv", "BatchNormalization", "Relu", "MaxPool"]
    assert [n.op_type for n in model.proto.graph.node] == ["Conv", "Relu", "MaxPool"]
    onnx.checker.check_model(model.proto, full_check=True)


def test_each_tensor_no_node_writes_after_simplification_is_recorded_with_what_removed_it(tmp_path):
    removed = load_model(save(identities_and_constants(), tmp_path / "ids.onnx")).simplification.removed
    assert {name for name, why in removed.items() if why == simplify_module.REMOVED_BY[simplify_module.drop_identities]} == {
        "x_same", "d", "r"}
    assert {"w", "b", "y_shape", "flat_shape"} <= {name for name, why in removed.items() if "constant" in why}
    # the BatchNormalization's output stays: the Conv writes it now; the Conv's own output goes
    assert load_model(save(conv_bn_relu(), tmp_path / "cbr.onnx")).simplification.removed == {
        "c": simplify_module.REMOVED_BY[simplify_module.fold_batchnorms]}


def test_constants_fold_identities_drop_and_outputs_keep_their_names(tmp_path):
    model = load_model(save(identities_and_constants(), tmp_path / "ids.onnx"))
    done = model.simplification
    assert done.dropped == {"Identity": 2, "Dropout": 1}
    assert done.constants_folded["ConstantOfShape"] == 1 and done.constants_folded["Constant"] == 2
    assert done.constants_folded["Shape"] == 1 and done.constants_folded["Concat"] == 1
    assert [n.op_type for n in model.proto.graph.node] == ["Conv", "Relu", "Reshape"]
    assert model.outputs == ["y", "flat"]
    assert [o.name for o in model.proto.graph.output] == ["y", "flat"]

    plan = make_plan(model, 2, CPU)
    conv = plan.steps[0]
    assert isinstance(conv, PluginStep) and conv.ops == ["Conv", "Relu"] and conv.outputs == ["y"]
    assert np.all(conv.node.constants["w"] == np.float32(0.25))
    runner = Runner(model, 2, "cpu")
    feeds = x_feeds((2, 2, 6, 6))
    result = check(runner.run, runner.plan_record(2), feeds)
    assert result.passed
    theirs = Reference(model.original)(feeds)
    ours = runner.run(feeds).outputs
    assert np.allclose(ours["flat"], theirs["flat"], atol=1e-5) and ours["flat"].shape == (2, 144)


@pytest.mark.parametrize("name", ["lenet86", "ece408_high", "mlp_onehidden"])
def test_shipped_models_are_not_changed(name):
    model = load_model(name)
    assert not model.simplification.changed
    assert model.proto.SerializeToString() == model.original.SerializeToString()
    assert "Simplified" not in describe(make_plan(model, 2, CPU))


def _light_model(name):
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"the installed onnx package has no {path}")
    return path


def test_light_resnet50_plans_no_onnxruntime_step():
    model = load_model(_light_model("resnet50"))
    assert model.simplification.batchnorms_folded == 53
    assert model.simplification.constants_folded == {"ConstantOfShape": 239}
    plan = make_plan(model, 1, CPU)
    assert not [s for s in plan.steps if isinstance(s, OrtStep)]  # the pools have plugins of their own
    # 53 Convs (16 with their Sum > Relu fused), the two pools and Gemm > Softmax (reading the Reshape as a view)
    assert len(plan.plugin_steps) == 56
    fused = [step.ops for step in plan.plugin_steps if "Sum" in step.ops]
    assert len(fused) == 16 and all(ops == ["Conv", "Sum", "Relu"] for ops in fused)


def test_a_failing_simplification_warns_and_runs_the_graph_as_loaded(tmp_path, monkeypatch):
    def broken(proto, keep=()):
        raise RuntimeError("boom")

    monkeypatch.setattr(model_module, "simplify_apart", broken)
    with pytest.warns(model_module.SimplificationWarning, match="graph simplification failed.*boom"):
        model = load_model(save(conv_bn_relu(), tmp_path / "m.onnx"))
    assert not model.simplification.changed
    assert "BatchNormalization" in [n.op_type for n in model.proto.graph.node]


def test_unnamed_nodes_keep_their_names_through_simplification(tmp_path):
    proto = conv_bn_relu()
    for node in proto.graph.node:
        node.name = ""
    model = load_model(save(proto, tmp_path / "unnamed.onnx"))
    assert [n.name for n in model.proto.graph.node] == ["Conv_0", "Relu_2", "MaxPool_3"]
    assert [n.name for n in model.original.graph.node] == ["Conv_0", "BatchNormalization_1", "Relu_2", "MaxPool_3"]


def test_runs_agreement_compares_with_the_original_graph(tmp_path, references):
    model = load_model(save(conv_bn_relu(seed=5), tmp_path / "conv_bn.onnx"))
    runner = Runner(model, 3, "cpu")
    feeds = x_feeds((3, 3, 10, 10))
    figures = check_module.agreement(runner.plan_record(3), feeds, runner.run(feeds).outputs["y"])
    assert figures["passed"]
    assert "BatchNormalization" in [n.op_type for n in references[0].graph.node]




def _relu_writes(name: str):
    """A pass that has the Relu write `name` (and its reader read it): a new tensor or a renamed output."""
    def rename(graph: Graph) -> dict[str, int]:
        relu = next(n for n in graph.nodes if n.op_type == "Relu")
        graph.rename_reads(relu.output[0], name)
        relu.output[0] = name
        return {}
    return rename


def _with_pass(monkeypatch, extra) -> None:
    monkeypatch.setattr(simplify_module, "PASSES", (*simplify_module.PASSES, (extra, "constants_folded")))


def test_a_pass_that_writes_a_tensor_the_original_graph_lacks_is_caught(tmp_path, monkeypatch):
    _with_pass(monkeypatch, _relu_writes("invented"))
    with pytest.raises(NamesLost, match="'relu' writes 'invented'"):
        simplify_apart(conv_bn_relu())
    with pytest.warns(model_module.SimplificationWarning, match="graph simplification failed.*'invented'"):
        model = load_model(save(conv_bn_relu(), tmp_path / "m.onnx"))
    assert "BatchNormalization" in [n.op_type for n in model.proto.graph.node]  # the graph as loaded


def test_a_pass_that_renames_a_graph_output_is_caught(monkeypatch):
    def rename_output(graph: Graph) -> dict[str, int]:
        pool = next(n for n in graph.nodes if n.op_type == "MaxPool")
        pool.output[0] = graph.proto.graph.output[0].name = graph.new_name("pooled")
        return {}

    _with_pass(monkeypatch, rename_output)
    with pytest.raises(NamesLost, match="outputs"):
        simplify_apart(conv_bn_relu())


def test_a_new_intermediate_tensor_named_by_new_name_keeps_the_rule(monkeypatch):
    def copy_before_relu(graph: Graph) -> dict[str, int]:
        relu = next(n for n in graph.nodes if n.op_type == "Relu")
        copy = graph.new_name("relu_input")
        graph.nodes.insert(graph.nodes.index(relu), helper.make_node("Neg", [relu.input[0]], [copy], name="neg"))
        relu.input[0] = copy
        return {}

    _with_pass(monkeypatch, copy_before_relu)
    simplified, _, _ = simplify_apart(conv_bn_relu())
    assert [n.op_type for n in simplified.graph.node] == ["Conv", "Neg", "Relu", "MaxPool"]
