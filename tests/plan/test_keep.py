"""Kept tensors: a plan gives up the fusion, prologue or group output that would hide one, and a
run hands back the same values onnxruntime computes for that tensor; a name that is no tensor of
the graph as it runs is refused in one line saying why."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnx_builders import conv_bn_relu, identities_and_constants, save, tiny_cnn
from opplugin.errors import InputError
from opplugin.gpu.device import CPU
from opplugin.graph.model import load_model
from opplugin.ops.activation import Activation
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner
from prologue_models import bn_model, feeds
from residual_models import residual_model


def onnxruntime_values(proto: onnx.ModelProto, inputs: dict[str, np.ndarray], names: tuple[str, ...]) -> list[np.ndarray]:
    """onnxruntime's values of `names`, made graph outputs of a copy of the model."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    proto.graph.output.extend([onnx.ValueInfoProto(name=name) for name in names])
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(list(names), inputs)


def kept_values_match_onnxruntime(model, proto: onnx.ModelProto, inputs: dict[str, np.ndarray], keep: tuple[str, ...],
                                  **runner) -> Runner:
    batch = next(iter(inputs.values())).shape[0]
    made = Runner(model, batch, "cpu", keep=keep, **runner)
    result = made.run(inputs, keep=keep)
    for name, expected in zip(keep, onnxruntime_values(proto, inputs, keep)):
        assert result.kept[name].shape == expected.shape
        np.testing.assert_allclose(result.kept[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)
    return made


def step_of(plan, tensor: str):
    return next(step for step in plan.steps if tensor in step.outputs)


@pytest.mark.parametrize("kept, fused", [("conv1_out", ["Conv"]), ("relu1_out", ["Conv", "Relu"])])
def test_lenet86_gives_up_conv1s_fusion_for_a_kept_tensor_and_hands_back_onnxruntimes_values(kept, fused):
    model = load_model("lenet86")
    assert make_plan(model, 2, CPU).fusions_given_up == {}
    plan = make_plan(model, 2, CPU, keep=(kept,))
    assert step_of(plan, kept).name == "conv1" and step_of(plan, kept).ops == fused
    assert plan.fusions_given_up == {"conv1": f"Conv > Relu > MaxPool not fused: {kept} is kept, and the fused kernel would not write it"}
    assert plan.keep == (kept,) and [s.ops for s in plan.steps[-3:]] == [["Conv", "Relu", "MaxPool"], ["Gemm", "Relu"], ["Gemm", "Softmax"]]
    image = np.random.default_rng(3).random((3, 1, 86, 86), dtype=np.float32)
    kept_values_match_onnxruntime(model, model.original, {"input": image}, (kept,))


@pytest.mark.parametrize("kept, fused", [("c", ["Conv"]), ("s", ["Conv", "Add"])])
def test_a_residual_chain_stops_at_the_kept_tensor(tmp_path, kept, fused):
    proto = residual_model(Activation.plain("Relu"))
    model = load_model(save(proto, tmp_path / "residual.onnx"))
    plan = make_plan(model, 2, CPU, keep=(kept,))
    assert plan.steps[0].ops == fused and plan.steps[0].outputs == [kept]
    assert plan.fusions_given_up["conv"] == f"Conv > Add > Relu not fused: {kept} is kept, and the fused kernel would not write it"
    kept_values_match_onnxruntime(model, proto, feeds(proto, 3), (kept, "y"))


def test_a_prologue_that_would_hide_a_kept_tensor_is_given_up(tmp_path):
    proto = bn_model(Activation.plain("Relu"))
    model = load_model(save(proto, tmp_path / "bn.onnx"))
    assert make_plan(model, 2, CPU).steps[0].ops == ["BatchNormalization", "Relu", "Conv"]
    plan = make_plan(model, 2, CPU, keep=("normed",))
    assert plan.fusions_given_up == {"conv": "BatchNormalization > Relu not fused into conv's kernel as a prologue: normed is kept, "
                                             "and the fused kernel would not write it"}
    # the BatchNormalization and its Relu stay one group, which writes the kept tensor too
    assert plan.steps[0].ops == ["BatchNormalization", "Relu"] and "normed" in plan.steps[0].outputs
    kept_values_match_onnxruntime(model, proto, feeds(proto, 3), ("normed", "activated"))


def test_an_onnxruntime_step_writes_a_kept_tensor_it_would_keep_inside(tiny_model_path):
    model = load_model(tiny_model_path)
    runner = kept_values_match_onnxruntime(model, model.original, {"x": feeds(tiny_cnn(), 2)["x"]}, ("r1", "logits"), registry={})
    assert {s.kind for s in runner.plan.steps} == {"onnxruntime"} and runner.plan.fusions_given_up == {}


def test_a_runner_made_without_keep_says_how_to_keep_a_hidden_tensor(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 2, "cpu")
    with pytest.raises(InputError, match=r"^cannot keep r1: it lives inside step conv1; a Runner made with keep=\('r1',\)"):
        runner.run(feeds(tiny_cnn(), 2), keep=("r1",))


@pytest.mark.parametrize("build, name, why", [
    (tiny_cnn, "c_1", "tiny_cnn has no tensor of that name (did you mean c1"),
    (tiny_cnn, "w1", "it is a weight of tiny_cnn (a constant), not computed by a run"),
    (conv_bn_relu, "c", "the BatchNormalization after it is folded into the Conv that writes it, at load"),
    (identities_and_constants, "x_same", "an Identity, Dropout or no-op layout node is dropped at load; x holds the same values"),
    (identities_and_constants, "w", "it is folded into a constant at load: its value does not depend on the inputs"),
])
def test_a_name_no_step_can_hand_back_is_refused_saying_why(tmp_path, build, name, why):
    model = load_model(save(build(), tmp_path / f"{build.__name__}.onnx"))
    with pytest.raises(InputError) as caught:
        make_plan(model, 2, CPU, keep=(name,))
    assert str(caught.value).startswith(f"cannot keep {name}: {why}") and "\n" not in str(caught.value)


@pytest.mark.parametrize("build, keep, left_out", [
    (conv_bn_relu, ("c",), {"folding BatchNormalization into Conv": ["c"]}),
    (identities_and_constants, ("x_same", "d"), {"dropping Identity, Dropout and no-op layout nodes": ["x_same", "d"]}),
    (identities_and_constants, ("w",), {"constant folding": ["w"]}),
])
def test_a_tensor_a_load_time_rewrite_removes_is_kept_by_leaving_that_rewrite_out(tmp_path, build, keep, left_out):
    """load_model(keep=...) (what --keep does) leaves out the passes that would remove a kept tensor, says
    which, and a run hands the tensor back with onnxruntime's values; the other passes still run."""
    proto = build()
    path = save(proto, tmp_path / f"{build.__name__}.onnx")
    model = load_model(path, keep=keep)
    assert {what: list(names) for what, names in model.simplification.kept_from.items()} == left_out
    assert model.simplification.as_json()["not_done_for_keep"] == left_out
    assert all(f"not done, for the kept {', '.join(names)}: {what}" in model.simplification.summary() for what, names in left_out.items())
    inputs = {"x": np.random.default_rng(3).standard_normal((2, *[d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim[1:]]))
              .astype(np.float32)}
    kept_values_match_onnxruntime(model, proto, inputs, keep)
    assert load_model(path).simplification.kept_from == {}  # without keep, every pass runs


def test_run_keeps_a_tensor_batchnorm_folding_removes_and_says_the_fold_is_not_done(tmp_path, capsys):
    from opplugin.cli import main

    path = save(conv_bn_relu(), tmp_path / "cbr.onnx")
    saved = tmp_path / "out.npz"
    assert main(["run", path, "--batch", "3", "--keep", "c", "--save-outputs", str(saved)]) == 0
    assert "Not done at load, for the kept c: folding BatchNormalization into Conv" in capsys.readouterr().err
    assert np.load(saved)["c"].shape == (3, 6, 10, 10)
    assert main(["plan", path, "--batch", "3", "--keep", "c"]) == 0
    assert "Simplified at load: not done, for the kept c: folding BatchNormalization into Conv" in capsys.readouterr().out
