"""On the GPU: the bench's CUDA-graph timing replays exactly the calls it captured. A graph of
a Conv configuration's calls (a K split among them: a second kernel and a scratch buffer
from the graph's own pool) writes the float64 reference's answer into an output poisoned
after the capture; the cuDNN peer's torch graph does the same; a call that synchronises
cannot be captured and is timed eagerly, saying why."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import conv_spec as conv

from opplugin.lab import graphed, trial
from opplugin.lab.trial import Problem
from opplugin.ops.conv import families
from opplugin.ops.conv.epilogue import NONE
from opplugin.ops.conv.families import pipelined

pytestmark = pytest.mark.gpu

SPEC = conv(3, 64, 64, (14, 14), (3, 3), pads=(1, 1, 1, 1))
CONFIGS = {
    "split": pipelined.with_split(families.configure(SPEC, "tc_3xtf32"), 3),
    "const": families.configure(SPEC, "unrolled"),
}


def relative_error(got, expected) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - expected) / np.linalg.norm(expected))


@pytest.mark.parametrize("name", CONFIGS)
def test_a_replayed_graph_writes_what_its_calls_write(name):
    import cupy

    problem = Problem.random(SPEC, NONE)
    kernel = families.build_checked(SPEC, CONFIGS[name], problem.weights, NONE)
    out = cupy.empty(kernel.output_shape(SPEC.batch), dtype=cupy.float32)
    replay = graphed.cupy_replay(lambda: kernel(problem.inputs, None, out=out), calls=4)
    out.fill(cupy.nan)  # the capture ran nothing: only the replay writes
    cupy.cuda.get_current_stream().synchronize()
    replay()
    got = cupy.asnumpy(out)
    assert not np.isnan(got).any()
    assert relative_error(got[problem.indices], problem.expected) <= trial.EXACT_TOLERANCE


def test_the_cudnn_peers_graph_writes_the_convolution():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    problem = Problem.random(SPEC, NONE)
    w, b = (torch.tensor(np.asarray(a), device="cuda") for a in problem.weights)
    x = torch.from_dlpack(problem.x)
    out = torch.empty(SPEC.output_shape(SPEC.batch), device="cuda")
    torch.backends.cudnn.allow_tf32 = False
    replay = graphed.torch_replay(torch, lambda: out.copy_(F.conv2d(x, w, b, padding=1)), calls=3)
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    replay()
    torch.cuda.synchronize()
    got = out.cpu().numpy()
    assert not np.isnan(got).any()
    assert relative_error(got[problem.indices], problem.expected) <= 1e-4


def test_a_call_that_synchronises_is_timed_eagerly_and_says_why():
    import cupy

    problem = Problem.random(SPEC, NONE)
    kernel = families.build_checked(SPEC, CONFIGS["const"], problem.weights, NONE)

    def synchronising_call():
        [y] = kernel(problem.inputs, None)
        return float(y[0, 0, 0, 0])  # a copy to the host: not allowed while a stream is captured

    timing = trial.time_call(synchronising_call, warmup=1, repeat=3, capture=graphed.cupy_replay)
    assert timing.timer == "cuda-events" and timing.ms > 0 and "cannot be captured" in timing.note
    cupy.cuda.runtime.deviceSynchronize()  # the device is usable after the abandoned capture
    timing = trial.time_call(lambda: kernel(problem.inputs, None), warmup=1, repeat=3, capture=graphed.cupy_replay)
    assert timing.timer == "cuda-graph" and timing.note is None and timing.ms > 0
