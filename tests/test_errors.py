"""Hard inputs: kernels that fail to compile, NaN and Inf, bad requests; each gives a
typed error with a clear first line, or propagates exactly as onnxruntime does."""
import numpy as np
import pytest

from opplugin.gpu import cuda, dependent_launch, nvrtc
from opplugin.cli import main
from opplugin.errors import InputError, KernelCompileError, PluginError
from opplugin.graph.model import load_model
from opplugin.runtime import Runner

NVRTC_LOG = 'conv_baseline.cu(31): error: identifier "oops" is undefined\n\n1 error detected in the compilation of "conv_baseline.cu".'


@pytest.fixture
def failing_nvrtc(monkeypatch, tmp_path):
    """An NVRTC that rejects every source, for a device of sm_90 (CuPy itself needs a GPU here)."""
    monkeypatch.setenv("OPPLUGIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(nvrtc, "compile_program", lambda source, options, name: (None, NVRTC_LOG))
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (13, 0))


def test_compile_failure_names_the_source_and_defines_and_carries_the_log(failing_nvrtc, tmp_path):
    with pytest.raises(KernelCompileError) as info:
        cuda.compile_module("conv_baseline.cu", {"C": 1, "OW": "oops", "PADDED": True})
    err = info.value
    assert isinstance(err, PluginError)
    first, *rest = str(err).splitlines()
    switches = "".join(f"{option} " for option in dependent_launch.compile_options())
    assert first.startswith(f"kernel conv_baseline.cu failed to compile with NVRTC ({switches}-DC=1 -DOW=oops -DPADDED=1)")
    assert first.endswith('error: identifier "oops" is undefined')
    assert rest[-1].startswith("1 error detected")
    assert err.log == NVRTC_LOG and "-DOW=oops" in err.options
    assert not any("oops" in str(key) for key in cuda._modules)  # a failed compile is not cached
    assert not list((tmp_path / "kernels").iterdir())  # nor written


def test_the_cli_prints_the_compile_error_then_the_log(monkeypatch, capsys):
    from opplugin.cli import workload

    def broken_runner(options, loaded, poison=False, budget=None):
        raise KernelCompileError("conv_const.cu", ("--std=c++17", "-DC=1", "-DMO=4"), NVRTC_LOG)

    monkeypatch.setattr(workload, "make_runner", broken_runner)
    assert main(["run", "lenet86", "--device", "cpu", "--batch", "2"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("opplugin: error: kernel conv_const.cu failed to compile with NVRTC (-DC=1 -DMO=4): ")
    assert "1 error detected" in lines[-1]


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({"input": np.ones((2, 1, 86, 86), np.float16)}, "float32"),
        ({"input": np.ones((2, 86, 86), np.float32)}, "rank 3"),
        ({"input": np.ones((2, 1, 28, 28), np.float32)}, r"the model takes \[N, 1, 86, 86\]"),
        ({"image": np.ones((2, 1, 86, 86), np.float32)}, "do not match"),
        ([np.ones((2, 1, 86, 86), np.float32)], "must be a dict"),
    ],
)
def test_wrong_inputs_through_the_api_are_input_errors(feeds, message):
    runner = Runner(load_model("lenet86"), 2, "cpu")
    with pytest.raises(InputError, match=message):
        runner.run(feeds)
