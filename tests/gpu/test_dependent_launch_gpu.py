"""On the GPU, kernels launched programmatically inside a graph capture (gpu/dependent_launch.py) start while the
kernel before them ends, and still read what it wrote and write nothing it still reads."""
from __future__ import annotations

import numpy as np
import pytest

from opplugin.core.paths import kernels_dir
from opplugin.gpu import cuda, dependent_launch

pytestmark = pytest.mark.gpu

# Each step reads a value another block of the step before wrote, late (after a spin), into the buffer the step
# before read: a step that began before the previous one had finished would read or overwrite a value too early.
SOURCE = r'''
#include "grid_dependency.cuh"

AWAITS_PREVIOUS_GRID(late_step)
extern "C" __global__ void late_step(const float* __restrict__ x, float* __restrict__ y, int n, long long spin)
{
    await_previous_grid();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const long long start = clock64();
    while (clock64() - start < spin) {
    }
    if (i < n) y[i] = x[(i + 97) % n] * 0.5f + 1.0f;
}

extern "C" __global__ void plain_step(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[(i + 97) % n] * 0.5f + 1.0f;
}
'''
STEPS, N = 40, 64 * 256


def _module():
    options = cuda.BASE_OPTIONS + (f"-I{kernels_dir()}", f"-D{dependent_launch.DEFINE}=1")
    return cuda.compile_source(SOURCE, options, "dependent launch test")


def test_the_module_says_which_kernels_await_the_previous_grid():
    if not dependent_launch.supported_arch(cuda.device_arch()):
        pytest.skip("the declaration is compiled for sm_90 on")
    module = _module()
    assert module.get_function("late_step").awaits_previous_grid
    assert not module.get_function("plain_step").awaits_previous_grid


def test_a_graph_of_programmatic_launches_computes_what_plain_launches_do(monkeypatch):
    import cupy

    monkeypatch.setenv(dependent_launch.SWITCH, "1")
    if not dependent_launch.supported(cuda.device_arch()):
        pytest.skip("programmatic dependent launch needs sm_90 on and CUDA 12")
    launched = []
    driver_launch = dependent_launch.launch
    monkeypatch.setattr(dependent_launch, "launch", lambda *a: (launched.append(a[0]), driver_launch(*a)))
    module = _module()
    late, plain = module.get_function("late_step"), module.get_function("plain_step")
    start = np.random.default_rng(5).standard_normal(N, dtype=np.float32)
    expected = start.copy()
    for step in range(STEPS):
        expected = np.roll(expected, -97) * np.float32(0.5) + np.float32(1.0)
    stream = cupy.cuda.Stream(non_blocking=True)
    buffers = [cupy.asarray(start), cupy.full(N, np.nan, dtype=cupy.float32)]
    with stream:
        stream.begin_capture()
        with dependent_launch.enabled(cuda.device_arch()):
            for step in range(STEPS):
                x, y = buffers[step % 2], buffers[(step + 1) % 2]
                if step % 10 == 9:  # a plain launch among them: the next waits on it as on any other
                    plain((N // 256,), (256,), (x, y, np.int32(N)))
                else:
                    late((N // 256,), (256,), (x, y, np.int32(N), np.int64(4000 * (step % 3))))
        graph = stream.end_capture()
    assert len(launched) == STEPS - STEPS // 10  # every awaiting launch went programmatic
    for _ in range(3):
        buffers[0][...] = cupy.asarray(start)
        buffers[1].fill(np.nan)
        graph.launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(buffers[STEPS % 2].get(), expected)
