"""The kernel cache and the parallel compile of a plan's kernels, on the CPU: NVRTC through
cuda-bindings compiles for sm_90 without a GPU, and a plan for an offline sm_90 device says
which kernels its steps' builds will compile without building them (Plugin.compile_jobs;
gpu/kernel_cache.py, gpu/parallel_compile.py, runtime/prebuild.py)."""
from __future__ import annotations

import functools
import io
import re

import pytest

from opplugin.gpu import cuda, dependent_launch, kernel_cache, nvrtc, parallel_compile
from opplugin.core import paths
from opplugin.gpu.device import Device
from opplugin.errors import KernelCompileError
from opplugin.graph.model import load_model
from opplugin.plan.partition import make_plan
from opplugin.runtime import prebuild

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC (cuda-bindings) is not installed")

OFFLINE = Device("cuda", "offline", "9.0")
BROKEN = 'extern "C" __global__ void broken(float* x) { x[0] = UNDEFINED_NAME; }\n'


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh kernel cache, and sm_90 as the current device's architecture."""
    monkeypatch.setenv("OPPLUGIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda, "device_arch", lambda: "sm_90")
    return tmp_path / "kernels"


SHIPPED = ("lenet86", "ece408_high", "mlp_onehidden")


def declared_jobs(model_name: str, graphed: bool = True) -> list[kernel_cache.CompileJob]:
    """What the steps of the model's offline plan declare their builds compile, in plan order."""
    plan = make_plan(load_model(str(paths.models_dir() / f"{model_name}.onnx")), 2, OFFLINE)
    return [job for step in plan.plugin_steps for job in step.compile_jobs(OFFLINE, graphed=graphed)]


def real_jobs() -> list[kernel_cache.CompileJob]:
    """The kernels of the shipped CNNs' Conv steps."""
    jobs = [job for job in declared_jobs("lenet86") + declared_jobs("ece408_high") if job.label.startswith("conv_")]
    assert len(jobs) == 3 and len({job.file_name for job in jobs}) == 3
    assert all(job.arch == "sm_90" and job.label.endswith(".cu") for job in jobs)
    return jobs


@functools.lru_cache(maxsize=None)
def serial_cubin(job: kernel_cache.CompileJob) -> bytes | None:
    """The job compiled here, once for the module: both pools' tests compare against it."""
    return kernel_cache.compile_job(job)[0]


def defines(*own: str) -> str:
    """The -D options a compile error names: the switches every kernel is compiled with, then the kernel's own."""
    return " ".join(dependent_launch.compile_options() + own)


def tiny_job(value: int, source: str | None = None) -> kernel_cache.CompileJob:
    text = source or 'extern "C" __global__ void fill(float* x) { x[threadIdx.x] = VALUE; }\n'
    return kernel_cache.CompileJob(f"tiny{value}.cu", text, cuda.nvrtc_options({"VALUE": value}), "sm_90")


def cache_files(folder) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


@needs_nvrtc
@pytest.mark.parametrize("pool", ["processes", "threads"])
def test_a_parallel_compile_writes_the_cubins_a_serial_compile_makes(cache, pool):
    jobs = real_jobs()
    serial = {job.file_name: serial_cubin(job) for job in jobs}
    stream = io.StringIO()
    assert parallel_compile.compile_missing(jobs, workers=2, pool=pool, stream=stream) == 3
    assert cache_files(cache) == sorted(serial)  # nothing else: no temporary file left
    for name, cubin in serial.items():
        assert cubin and (cache / name).read_bytes() == cubin
    noun = "threads" if pool == "threads" else "processes"
    [line] = stream.getvalue().splitlines()
    assert line.startswith(f"compiling 3 kernels on 2 {noun} ... done in ") and line.endswith(" s")


@needs_nvrtc
def test_a_cache_hit_compiles_nothing_and_prints_nothing(cache, monkeypatch):
    jobs = [tiny_job(1), tiny_job(2)]
    assert parallel_compile.compile_missing(jobs, workers=1, stream=io.StringIO()) == 2
    before = {name: (cache / name).stat().st_mtime_ns for name in cache_files(cache)}

    def no_compile(*args):
        raise AssertionError("a cached kernel was compiled again")

    monkeypatch.setattr(kernel_cache, "compile_job", no_compile)
    stream = io.StringIO()
    assert parallel_compile.compile_missing(jobs, pool="threads", stream=stream) == 0
    assert stream.getvalue() == ""
    assert all(kernel_cache.binary_path(job).read_bytes() for job in jobs)  # the serial path finds them too
    assert {name: (cache / name).stat().st_mtime_ns for name in cache_files(cache)} == before


@needs_nvrtc
@pytest.mark.parametrize("workers", [1, 3])
def test_a_rejected_kernel_is_named_in_one_line_and_nothing_of_it_is_cached(cache, workers):
    good = [tiny_job(1), tiny_job(2)]
    broken = tiny_job(3, BROKEN)
    stream = io.StringIO()
    with pytest.raises(KernelCompileError) as info:
        parallel_compile.compile_missing([good[0], broken, good[1]], workers=workers, pool="threads", stream=stream)
    first, *log = str(info.value).splitlines()
    assert first.startswith(f"kernel tiny3.cu failed to compile with NVRTC ({defines('-DVALUE=3')}): ")
    assert "UNDEFINED_NAME" in first and any("error" in line for line in log)
    assert stream.getvalue().endswith(" failed\n") and stream.getvalue().count("\n") == 1
    files = cache_files(cache)
    assert broken.file_name not in files and not [name for name in files if not name.endswith(".cubin")]
    assert good[0].file_name in files  # what compiled before the failure stays, whole
    # the serial path gives the same error
    with pytest.raises(KernelCompileError, match=rf"^kernel tiny3.cu failed to compile with NVRTC \({re.escape(defines('-DVALUE=3'))}\): "):
        kernel_cache.binary_path(broken)


@needs_nvrtc
def test_a_worker_process_reports_a_rejection_like_a_thread(cache):
    with pytest.raises(KernelCompileError, match="tiny7.cu"):
        parallel_compile.compile_missing([tiny_job(6), tiny_job(7, BROKEN)], workers=2, stream=io.StringIO())


@needs_nvrtc
def test_the_shipped_models_declare_every_plugin_kernel_and_each_compiles(cache):
    """Each step's declared kernels (graphed or eager: the shipped layers pick alike) compile with NVRTC,
    the runtime's flag kernel with them; a view step declares none."""
    jobs = list(prebuild.runtime_jobs(OFFLINE))
    for name in SHIPPED:
        plan = make_plan(load_model(str(paths.models_dir() / f"{name}.onnx")), 2, OFFLINE)
        for step in plan.plugin_steps:
            declared = list(step.compile_jobs(OFFLINE))
            assert [j.file_name for j in declared] == [j.file_name for j in step.compile_jobs(OFFLINE, graphed=False)]
            assert declared if step.node.op_type in ("Conv", "Gemm") else not declared, step.name
            jobs += declared
    assert {job.label for job in jobs} >= {"nonfinite.cu", "conv_const_tile.cu", "gemm_rowwarp.cu"}
    assert parallel_compile.compile_missing(jobs, workers=2, pool="threads", stream=io.StringIO()) == len(set(jobs))
    assert all(kernel_cache.cached_path(job) for job in jobs)


class FakeStep:
    """A step whose build loads the cubins of its jobs one after another, as a plugin does; it
    declares them unless told not to."""

    def __init__(self, name: str, jobs: list[kernel_cache.CompileJob], declares: bool = True):
        self.name, self.jobs, self.declares, self.builds = name, jobs, declares, 0

    def compile_jobs(self) -> list[kernel_cache.CompileJob]:
        return self.jobs if self.declares else []

    def build(self) -> list[bytes]:
        self.builds += 1
        return [kernel_cache.binary_path(job).read_bytes() for job in self.jobs]


@needs_nvrtc
def test_prebuild_compiles_what_the_steps_declare_at_once_then_builds_each_step_once(cache):
    shared = tiny_job(1)
    steps = [FakeStep("a", [shared, tiny_job(2)]), FakeStep("b", [shared]), FakeStep("c", [tiny_job(3)])]
    compiles = []

    def compile_jobs(jobs):
        compiles.append(sorted(job.label for job in jobs))
        return parallel_compile.compile_missing(jobs, workers=2, pool="threads", stream=io.StringIO())

    kernels = prebuild.build_all(steps, FakeStep.build, FakeStep.compile_jobs, [tiny_job(4)], compile_jobs)
    assert list(kernels) == ["a", "b", "c"]
    # one compile of everything declared (the shared job asked twice, compiled once), the extra job first
    assert compiles == [["tiny1.cu", "tiny1.cu", "tiny2.cu", "tiny3.cu", "tiny4.cu"]]
    assert cache_files(cache) == sorted(job.file_name for job in [*steps[0].jobs, *steps[2].jobs, tiny_job(4)])
    assert [step.builds for step in steps] == [1, 1, 1]
    assert kernels["a"] == [kernel_cache.compile_job(job)[0] for job in steps[0].jobs]


@needs_nvrtc
def test_a_step_that_declares_nothing_compiles_as_it_builds(cache, monkeypatch):
    step = FakeStep("a", [tiny_job(1), tiny_job(2)], declares=False)
    compiled = []
    kernels = prebuild.build_all([step], FakeStep.build, FakeStep.compile_jobs, [], lambda jobs: compiled.extend(jobs) or 0)
    assert compiled == [] and step.builds == 1
    assert kernels["a"] == [kernel_cache.compile_job(job)[0] for job in step.jobs]  # the build compiled both itself


def test_compile_errors_pass_through_prebuild_unchanged(cache):
    def build(step):
        raise KernelCompileError("x.cu", ("-DA=1",), "x.cu(1): error: no")

    with pytest.raises(KernelCompileError, match=r"^kernel x.cu failed to compile with NVRTC \(-DA=1\): x.cu\(1\): error: no"):
        prebuild.build_all([FakeStep("a", [])], build, FakeStep.compile_jobs, [], lambda jobs: 0)


def test_workers_follow_the_cores_the_jobs_and_the_memory(monkeypatch):
    monkeypatch.setattr(parallel_compile, "usable_cores", lambda: 16)
    monkeypatch.setattr(parallel_compile, "available_memory", lambda: 64 << 30)
    assert parallel_compile.worker_count(57) == 16 and parallel_compile.worker_count(3) == 3
    monkeypatch.setattr(parallel_compile, "available_memory", lambda: 3 << 30)
    assert parallel_compile.worker_count(57) == 3
    monkeypatch.setattr(parallel_compile, "available_memory", lambda: 1 << 20)
    assert parallel_compile.worker_count(57) == 1
    monkeypatch.setattr(parallel_compile, "available_memory", lambda: None)
    monkeypatch.setattr(parallel_compile, "usable_cores", lambda: 2)
    assert parallel_compile.worker_count(57) == 2


def test_the_cache_key_follows_source_options_and_architecture(monkeypatch):
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (13, 0))
    job = tiny_job(1)
    changed = [tiny_job(2), kernel_cache.CompileJob(job.label, job.source + "\n", job.options, job.arch),
               kernel_cache.CompileJob(job.label, job.source, job.options, "sm_80")]
    assert len({job.file_name, *(other.file_name for other in changed)}) == 4
    assert kernel_cache.CompileJob("another label", job.source, job.options, job.arch).file_name == job.file_name
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (13, 1))
    assert kernel_cache.CompileJob(job.label, job.source, job.options, job.arch).file_name != job.file_name


def test_an_unwritable_cache_folder_falls_back_to_a_folder_of_the_process(monkeypatch, tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("OPPLUGIN_CACHE_DIR", str(blocker / "cache"))  # under a file: mkdir fails
    folder = kernel_cache.cache_dir()
    assert folder.is_dir() and blocker not in folder.parents


def test_plans_and_cpu_runs_compile_nothing(monkeypatch):
    from opplugin.inputs.feeds import make_inputs
    from opplugin.runtime import Runner

    def no_compile(*args, **kwargs):
        raise AssertionError("NVRTC was called")

    monkeypatch.setattr(nvrtc, "compile_program", no_compile)
    monkeypatch.setattr(parallel_compile, "compile_missing", no_compile)
    model = load_model(str(paths.models_dir() / "lenet86.onnx"))
    assert make_plan(model, 4, OFFLINE).plugin_steps
    runner = Runner(model, 4, device="cpu")
    [output] = runner.run(make_inputs(model, 4, "random", seed=1).feeds).outputs.values()
    assert output.shape[0] == 4
