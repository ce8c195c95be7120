"""Models onnxruntime runs are run as it runs them, by plan, run and check and by the Runner, and
those it cannot run (nor a run give anything back) are refused in one line, exit status 2: control
flow whose subgraphs read outer tensors by name, axes of size 0, float64 between casts, graphs
without outputs. Spans graph/ (load, passes), plan/ (steps' inputs), ort/ and runtime/ (refusals)."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_builders import save
from onnxruntime_runs_models import (conv_in_float64, conv_over_empty_image, empty_axis_models, fixed_empty_batch,
                                     if_reading_outer_tensors, loop_with_nested_if, output_is_the_input, relu_in_float64_between_casts,
                                     scan_reading_outer_tensor, without_outputs)
from opplugin.cli import main
from opplugin.errors import ModelError
from opplugin.graph.model import load_model
from opplugin.inputs.feeds import make_inputs
from opplugin.ort.sessions import session
from opplugin.plan.partition import OrtStep
from opplugin.runtime import Runner

RUNS = {"if_outer": if_reading_outer_tensors, "loop_nested": loop_with_nested_if, "scan_outer": scan_reading_outer_tensor,
        **{name: (lambda m=model: m) for name, model in empty_axis_models().items()}, "relu_f64": relu_in_float64_between_casts}
BATCH = {"scan_outer": 4}  # its batch is fixed


def _cli(command: str, path: str, batch: int, *extra: str) -> int:
    return main([command, path, "--batch", str(batch), "--device", "cpu", *extra])


@pytest.mark.parametrize("name", RUNS)
def test_plan_run_and_check_run_it_as_onnxruntime_does(name, tmp_path, capsys):
    path, batch = save(RUNS[name](), tmp_path / f"{name}.onnx"), BATCH.get(name, 3)
    assert _cli("plan", path, batch) == 0
    assert _cli("run", path, batch, "--repeat", "1") == 0
    assert "Against onnxruntime CPU: PASS" in capsys.readouterr().out
    assert _cli("check", path, batch) == 0
    assert "PASS at atol" in capsys.readouterr().out

    model = load_model(path)
    feeds = make_inputs(model, batch, "random", seed=5).feeds
    ours = Runner(model, batch, "cpu").run(feeds).outputs
    theirs = session(model.original).run(model.outputs, feeds)
    for name_out, expected in zip(model.outputs, theirs):
        assert ours[name_out].shape == expected.shape
        np.testing.assert_allclose(ours[name_out], expected, rtol=1e-5, atol=1e-6)


def test_the_step_of_an_if_gets_what_its_branches_read_and_the_conv_keeps_its_output(tmp_path):
    model = load_model(save(if_reading_outer_tensors(), tmp_path / "if.onnx"))
    plan = Runner(model, 2, "cpu").plan
    conv = next(s for s in plan.plugin_steps if s.node.op_type == "Conv")
    assert conv.fused == [] and conv.outputs == ["y"]  # a branch reads y: no Relu fused over it
    step = next(s for s in plan.steps if isinstance(s, OrtStep) and "If" in s.ops)
    assert "y" in step.inputs  # read by name inside the branches
    assert "scale" in {t.name for t in step.model.graph.initializer}  # a weight only a branch reads
    assert "Identity" not in [n.op_type for n in model.nodes]  # dropped, its reader in the branch renamed


def test_a_loops_body_gets_the_outer_tensors_an_earlier_onnxruntime_step_writes(tmp_path):
    model = load_model(save(loop_with_nested_if(), tmp_path / "loop.onnx"))
    steps = Runner(model, 2, "cpu").plan.steps
    loop = next(s for s in steps if "Loop" in s.ops)
    assert {"u", "y"} <= set(loop.inputs)
    writer = next(s for s in steps if "u" in s.outputs)  # the CumSum's step hands u on, though only the body reads it
    assert writer is not loop


def test_a_node_with_an_empty_tensor_is_left_to_onnxruntime_with_the_reason(tmp_path, capsys):
    path = save(empty_axis_models()["empty_matmul"], tmp_path / "m.onnx")
    assert _cli("plan", path, 2) == 0
    out = capsys.readouterr().out
    assert "MatMul_0: x is empty ([2, 0]): onnxruntime runs nodes with empty tensors" in out


@pytest.mark.parametrize("build, says", [
    (conv_in_float64, "onnxruntime cannot run this model either: Could not find an implementation for Conv"),
    (conv_over_empty_image, "onnxruntime cannot run this model either: Non-zero status code returned while running Conv"),
])
def test_a_model_onnxruntime_cannot_run_is_refused_in_one_line(build, says, tmp_path, capsys):
    path = save(build(), tmp_path / "refused.onnx")
    for command in ("run", "check"):
        assert _cli(command, path, 2) == 2
        out, err = capsys.readouterr()
        errors = [line for line in err.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and says in errors[0] and "Traceback" not in err
        assert errors[0].startswith("opplugin: error: ")


def test_the_runner_refuses_a_float64_conv_before_compiling_anything(tmp_path, monkeypatch):
    from opplugin.runtime import runner as runner_module

    model = load_model(save(conv_in_float64(), tmp_path / "f64.onnx"))
    monkeypatch.setattr(runner_module, "build_all", lambda *a, **k: pytest.fail("kernels built before the refusal"))
    with pytest.raises(ModelError, match="Conv"):
        Runner(model, 2, "cpu")


@pytest.mark.parametrize("build, says", [
    (without_outputs, "its graph has no outputs"),
    (output_is_the_input, "output 'x' is a graph input or a weight that no node computes"),
])
def test_a_graph_whose_run_gives_nothing_back_is_refused_at_load(build, says, tmp_path, capsys):
    import onnx

    path = tmp_path / "bad.onnx"
    onnx.save(build(), str(path))
    for command in ("plan", "run", "check"):
        assert _cli(command, str(path), 2) == 2
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and says in err and not out
    with pytest.raises(ModelError, match=says):
        load_model(path)


def test_a_fixed_batch_of_0_is_refused_in_one_line_with_or_without_batch(tmp_path, capsys):
    path = save(fixed_empty_batch(), tmp_path / "zero_batch.onnx")
    for arguments in (["run", path, "--device", "cpu"], ["check", path, "--batch", "0", "--device", "cpu"],
                      ["plan", path, "--batch", "2", "--device", "cpu"]):
        assert main(arguments) == 2
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and not out
    assert main(["run", path, "--device", "cpu"]) == 2
    assert "has a fixed batch of 0 (input 'x' is [0, 3]): an empty batch" in capsys.readouterr().err
