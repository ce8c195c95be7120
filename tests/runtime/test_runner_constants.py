"""Weights, biases and folded constants go to the device once per runner: a run copies
only tensors that depend on its input, never a constant, whichever onnxruntime build."""
from __future__ import annotations

from onnx_builders import save
from resnet_block import resnet_block

from opplugin.graph.model import load_model
from opplugin.plan.partition import OrtStep
from opplugin.runtime import Runner


def per_run_tensors(runner: Runner) -> set[str]:
    """What a run makes afresh: the graph's inputs and every step's outputs."""
    return {value.name for value in runner.plan.model.inputs} | {n for step in runner.plan.steps for n in step.outputs}


def test_every_tensor_a_plugin_step_reads_is_per_run_or_a_constant_held_by_the_runner(tmp_path):
    model = load_model(save(resnet_block(), tmp_path / "block.onnx"))
    runner = Runner(model, 4, "cpu")
    made = per_run_tensors(runner)
    for step in runner.plan.plugin_steps:
        for name in filter(None, step.inputs):
            assert name in made or name in runner.constants, f"{step.name} reads {name}, which a run would have to copy"
    # the Identity copies of the shared bias are gone, so no onnxruntime step computes a constant each run
    assert not {"onnx::Conv_1", "onnx::Conv_2"} & made
    biases = [step.inputs[2] for step in runner.plan.plugin_steps if len(step.inputs) > 2]
    # conv1 and conv2: folded biases, and the fc Gemm's C, all on the device
    assert len(biases) == 3 and set(biases) <= set(runner.constants)


def test_no_onnxruntime_step_computes_from_constants_alone(tmp_path):
    model = load_model(save(resnet_block(), tmp_path / "block.onnx"))
    runner = Runner(model, 4, "cpu")
    made = {value.name for value in model.inputs}
    for step in runner.plan.steps:
        if isinstance(step, OrtStep):
            assert set(step.inputs) & made, f"{step.name} reads no per-run tensor: its outputs are constants made every run"
        made |= set(step.outputs)
