"""Channel-last regions rewritten to NCHW, on the GPU: a ConvNeXt block (its MLP as 1x1 Convs with
GELU and the layer scale fused), a downsampling LayerNorm and regions that keep a Transpose, each run
eagerly and as CUDA graphs and compared with onnxruntime CPU on the ORIGINAL graph (fresh random
inputs), and `check` passing on every step, the transposed ones included."""
from __future__ import annotations

import numpy as np
import pytest

from channel_last_models import convnext_block, downsampling, read_channel_last
from onnx_builders import save
from opplugin.verify.check import check
from opplugin.graph.model import load_model
from opplugin.runtime import Runner
from opplugin.ort.sessions import session
from reduction_cases import fresh

pytestmark = pytest.mark.gpu

MODELS = {
    "convnext block, 96 channels": lambda: convnext_block(channels=96, size=14),
    "convnext block, 8 channels, GELU as (x * 0.5) * p": lambda: convnext_block(gelu_form="half_first"),
    "downsampling": lambda: downsampling(channels=16, size=12),
    "a Reshape reads the MatMul's output": lambda: read_channel_last("reshape"),
    "a ReduceMean over H and W reads the LayerNorm's output": lambda: read_channel_last("reduce"),
}


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda graphs"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_rewritten_region_matches_onnxruntime_on_the_original_graph(name, graphs, tmp_path):
    model = MODELS[name]()
    batch = 4
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    x = fresh((batch, *dims), seed=len(name))
    names = [o.name for o in model.graph.output]
    expected = dict(zip(names, session(model).run(names, {"x": x})))
    runner = Runner(load_model(save(model, tmp_path / "m.onnx")), batch, "cuda", cuda_graphs=graphs)
    plan = runner.plan_record()
    assert all(step.kind == "plugin" for step in plan.steps), plan.fallbacks
    for _ in range(2):  # the second run replays the graph where there is one
        ours = runner.run({"x": x}).outputs
        for output, value in expected.items():
            np.testing.assert_allclose(ours[output], value, rtol=1e-4, atol=1e-4, err_msg=output)
    fresh_runner = Runner(load_model(save(model, tmp_path / "m.onnx")), batch, "cuda", cuda_graphs=graphs)
    result = check(fresh_runner.run, fresh_runner.plan_record(), {"x": x})  # as `opplugin check` does: a runner of its own
    assert result.passed, [r for r in result.records if not r["passed"]]


def test_the_convnext_mlp_runs_on_conv_kernels_with_gelu_and_the_residual_fused(tmp_path):
    runner = Runner(load_model(save(convnext_block(channels=96, size=14), tmp_path / "m.onnx")), 8, "cuda")
    plan = runner.plan_record()
    assert [list(step.ops) for step in plan.steps] == [["Conv"], ["LayerNormalization"], ["Conv", "Gelu"], ["Conv", "Add"]]
    names = [runner.kernels[step.name].name for step in plan.steps]
    assert names[2].startswith("conv.") and names[2].endswith("+gelu") and names[3].endswith("+add"), names
