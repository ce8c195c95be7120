"""A cold runner compiles its plan's kernels in parallel, into the kernel cache, and the
kernels it loads from there compute what onnxruntime does; a warm one compiles nothing
(GPU tests, marker `gpu`; gpu/kernel_cache.py, gpu/parallel_compile.py, runtime/prebuild.py)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from opplugin.gpu import cuda, kernel_cache, nvrtc
from opplugin.core import paths
from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu


def fresh_cache(monkeypatch, tmp_path):
    """An empty kernel cache, and no module this process loaded before."""
    monkeypatch.setenv("OPPLUGIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda, "_modules", {})
    return tmp_path / "kernels"


@pytest.mark.parametrize("name", ["lenet86", "ece408_high"])
def test_a_cold_runner_compiles_in_parallel_and_a_warm_one_not_at_all(monkeypatch, tmp_path, capfd, name):
    folder = fresh_cache(monkeypatch, tmp_path)
    path = str(paths.models_dir() / f"{name}.onnx")
    model = load_model(path)
    feeds = make_inputs(model, 8, "random", seed=3).feeds
    cold = Runner(model, 8, device="cuda")
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("compiling ")]
    assert len(lines) == 1 and " done in " in lines[0], lines
    compiled = int(lines[0].split()[1])
    cubins = sorted(folder.glob("*.cubin"))
    assert compiled >= 2 and len(cubins) == compiled and all(c.stat().st_size > 1000 for c in cubins)
    assert not [p for p in folder.iterdir() if p.suffix != ".cubin"]  # no temporary file left

    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    [got] = cold.run(feeds).outputs.values()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-4)

    monkeypatch.setattr(cuda, "_modules", {})  # as a new process would: every module loaded from the files

    def no_compile(*args, **kwargs):
        raise AssertionError("a warm runner compiled a kernel")

    monkeypatch.setattr(kernel_cache, "compile_job", no_compile)
    warm = Runner(model, 8, device="cuda")
    assert "compiling " not in capfd.readouterr().err
    [again] = warm.run(feeds).outputs.values()
    np.testing.assert_array_equal(again, got)


def test_the_cubin_of_the_cache_is_what_nvrtc_makes_for_this_device(monkeypatch, tmp_path):
    fresh_cache(monkeypatch, tmp_path)
    arch = cuda.device_arch()
    capability = cuda.current_properties()[1].replace(".", "")
    assert arch == f"sm_{capability}" or int(arch[3:]) == max(a for a in nvrtc.supported_archs() if a <= int(capability))
    job = kernel_cache.CompileJob("fill.cu", 'extern "C" __global__ void fill(float* x) { x[threadIdx.x] = VALUE; }\n',
                                  cuda.nvrtc_options({"VALUE": 2.5}), arch)
    module = cuda.compile_source(job.source, job.options, job.label)
    assert kernel_cache.binary_path(job).read_bytes() == kernel_cache.compile_job(job)[0]
    import cupy

    out = cupy.full(64, np.nan, dtype=cupy.float32)
    module.get_function("fill")((1,), (64,), (out,))
    assert (cupy.asnumpy(out) == 2.5).all()
