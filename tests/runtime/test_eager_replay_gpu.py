"""On the GPU, eager steps replayed from their recorded launches (gpu/recorded_launches.py, runtime/eager_replay.py)
give what their kernels give, on fresh values written into the same buffers."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import conv_spec as conv
from resnet_block import bottleneck_block, resnet_block
from channel_last_models import convnext_block

from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.ops.conv import families
from opplugin.runtime import Runner
from opplugin.runtime.eager_replay import StepReplays

pytestmark = pytest.mark.gpu

RESNET = conv(2, 64, 64, (14, 14), (3, 3), pads=(1, 1, 1, 1))
DEPTHWISE = conv(2, 96, 96, (14, 14), (7, 7), pads=(3, 3, 3, 3), group=96)
GROUPED = conv(2, 64, 64, (14, 14), (3, 3), pads=(1, 1, 1, 1), group=8)


def _weights(spec, rng):
    return rng.standard_normal(spec.weight_shape, dtype=np.float32), rng.standard_normal(spec.out_channels, dtype=np.float32)


# every exact family that builds for these shapes and runs here: split K's second launch, constant memory, scratch
CASES = [(spec, family) for spec in (RESNET, DEPTHWISE, GROUPED)
         for family in families.usable_families(spec, _weights(spec, np.random.default_rng(0)))
         if families.FAMILIES[family].runs_here()]


def _fresh(cupy, shape, rng):
    return cupy.asarray(rng.standard_normal(shape, dtype=np.float32))


@pytest.mark.parametrize("spec, family", CASES, ids=[f"{s.in_channels}g{s.group}-{f}" for s, f in CASES])
def test_a_replayed_conv_follows_new_values_in_its_buffers(spec, family):
    import cupy

    rng = np.random.default_rng()
    w, b = _weights(spec, rng)
    kernel = families.build_kernel(spec, family, (w, b))
    x, out, expected = _fresh(cupy, spec.input_shape(), rng), cupy.empty(spec.output_shape(), cupy.float32), None
    inputs = [x, cupy.asarray(w), cupy.asarray(b)]
    replays = StepReplays()
    for turn in range(4):
        x[...] = _fresh(cupy, x.shape, rng)  # new values, same buffer
        out.fill(cupy.nan)
        [y] = replays.call("conv", kernel, inputs, None, out, spec.batch)
        [expected] = kernel(inputs, None)  # the kernel's own call, into an array of its own
        assert y is out
        # not bit for bit: reduce_atomic adds in whatever order its atomics land
        np.testing.assert_allclose(cupy.asnumpy(y), cupy.asnumpy(expected), rtol=1e-5, atol=1e-5, err_msg=f"call {turn}")
    if kernel.workspace_bytes(spec.batch):  # scratch allocated per call (im2col columns, split-K partials, split operands)
        assert "allocates device memory" in replays.refused["conv"]
    else:
        assert replays.refused == {} and len(replays) == 1


@pytest.mark.parametrize("name, build", [("lenet86", None), ("resnet block", resnet_block), ("bottleneck", bottleneck_block),
                                         ("convnext block", convnext_block)])
@pytest.mark.parametrize("chunk", [4, 2])
def test_eager_runs_replay_their_steps_and_match_graphed_runs(name, build, chunk, tmp_path):
    """Fresh inputs each run, in one chunk or two on the one lane (each run of steps replayed twice a run, so
    each replay's step events must be its own); then a run that keeps an intermediate (another run key)."""
    if build is None:
        model = load_model(name)
    else:
        path = tmp_path / "model.onnx"
        import onnx

        onnx.save(build(), path)
        model = load_model(path)
    runner = Runner(model, 4, "cuda", chunk=chunk, streams=1, cuda_graphs=False)
    graphed = Runner(model, 4, "cuda", chunk=4, streams=1, cuda_graphs=True)
    feeds = [make_inputs(model, 4, "random", seed).feeds for seed in (1, 2, 3, 4, 5)]
    for f in feeds:
        result, expected = runner.run(f, step_times=True), graphed.run(f).outputs
        for output, value in expected.items():
            np.testing.assert_allclose(result.outputs[output], value, rtol=0, atol=0, err_msg=f"{name}: {output}")
        steps = [t for t in result.times if t.kind == "plugin"]
        assert steps and all(t.ms >= 0 for t in steps) and sum(t.ms for t in steps) > 0
    lane = runner.scheduler.lanes[0]
    assert len(lane.replays) > 0, f"{name}: no step replayed; refused: {lane.replays.refused}"
    # runs of steps kept whole, except where steps are watched for NaN and Inf (lenet86's fused max pools)
    assert bool(lane.replays.runs) == (not runner.executor.watched), f"{name}: {len(lane.replays.runs)} runs kept whole"
    inner = runner.plan.plugin_steps[0].outputs[0]
    for f in feeds[:3]:
        kept = runner.run(f, keep=(inner,)).kept[inner]
        np.testing.assert_allclose(kept, graphed.run(f, keep=(inner,)).kept[inner], rtol=0, atol=0, err_msg=f"{name}: {inner}")
