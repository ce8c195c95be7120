"""The kernel cache and the parallel compile of a plan's kernels, on the CPU: NVRTC through
cuda-bindings compiles for sm_90 without a GPU, and builds of a plan for an offline
sm_90 device reach their first compile before they need CuPy (gpu/kernel_cache.py,
gpu/parallel_compile.py, runtime/prebuild.py)."""
from __future__ import annotations

import io

import pytest

from opplugin.gpu import cuda, kernel_cache, nvrtc, parallel_compile
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


def first_compiles(model_name: str) -> list[kernel_cache.CompileJob]:
    """The compile job each step of the model's offline plan stops at (its first kernel), in plan order."""
    plan = make_plan(load_model(str(paths.models_dir() / f"{model_name}.onnx")), 2, OFFLINE)
    jobs = []
    with kernel_cache.deferring_misses():
        for step in plan.plugin_steps:
            try:
                step.build(OFFLINE)
            except kernel_cache.MissingKernel as missing:
                jobs.append(missing.job)
            except ImportError:
                pass  # a build that needs CuPy before it compiles (the GEMMs): none here
    return jobs


def real_jobs() -> list[kernel_cache.CompileJob]:
    """The first kernels of the Conv steps (with CuPy installed, the GEMMs' too reach their compile)."""
    jobs = [job for job in first_compiles("lenet86") + first_compiles("ece408_high") if job.label.startswith("conv_")]
    assert len(jobs) == 3 and len({job.file_name for job in jobs}) == 3
    assert all(job.arch == "sm_90" and job.label.endswith(".cu") for job in jobs)
    return jobs


def tiny_job(value: int, source: str | None = None) -> kernel_cache.CompileJob:
    text = source or 'extern "C" __global__ void fill(float* x) { x[threadIdx.x] = VALUE; }\n'
    return kernel_cache.CompileJob(f"tiny{value}.cu", text, cuda.nvrtc_options({"VALUE": value}), "sm_90")


def cache_files(folder) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


@needs_nvrtc
@pytest.mark.parametrize("pool", ["processes", "threads"])
def test_a_parallel_compile_writes_the_cubins_a_serial_compile_makes(cache, pool):
    jobs = real_jobs()
    serial = {job.file_name: kernel_cache.compile_job(job)[0] for job in jobs}
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
    assert first.startswith("kernel tiny3.cu failed to compile with NVRTC (-DVALUE=3): ")
    assert "UNDEFINED_NAME" in first and any("error" in line for line in log)
    assert stream.getvalue().endswith(" failed\n") and stream.getvalue().count("\n") == 1
    files = cache_files(cache)
    assert broken.file_name not in files and not [name for name in files if not name.endswith(".cubin")]
    assert good[0].file_name in files  # what compiled before the failure stays, whole
    # the serial path gives the same error
    with pytest.raises(KernelCompileError, match=r"^kernel tiny3.cu failed to compile with NVRTC \(-DVALUE=3\): "):
        kernel_cache.binary_path(broken)


@needs_nvrtc
def test_a_worker_process_reports_a_rejection_like_a_thread(cache):
    with pytest.raises(KernelCompileError, match="tiny7.cu"):
        parallel_compile.compile_missing([tiny_job(6), tiny_job(7, BROKEN)], workers=2, stream=io.StringIO())


class FakeStep:
    """A step whose build loads the cubins of its jobs one after another, as a plugin does."""

    def __init__(self, name: str, jobs: list[kernel_cache.CompileJob]):
        self.name, self.jobs, self.builds = name, jobs, 0

    def build(self) -> list[bytes]:
        self.builds += 1
        return [kernel_cache.binary_path(job).read_bytes() for job in self.jobs]


@needs_nvrtc
def test_prebuild_compiles_every_step_s_kernels_in_rounds_before_building(cache):
    shared = tiny_job(1)
    steps = [FakeStep("a", [shared, tiny_job(2)]), FakeStep("b", [shared]), FakeStep("c", [tiny_job(3)])]
    rounds = []

    def compile_jobs(jobs):
        rounds.append(sorted(job.label for job in jobs))
        return parallel_compile.compile_missing(jobs, workers=2, pool="threads", stream=io.StringIO())

    kernels = prebuild.build_all(steps, FakeStep.build, compile_jobs)
    assert list(kernels) == ["a", "b", "c"]
    # round 1: each step's first missing kernel (the shared one asked twice, compiled once); round 2: a's second
    assert rounds == [["tiny1.cu", "tiny1.cu", "tiny3.cu"], ["tiny2.cu"]]
    assert [step.builds for step in steps] == [3, 2, 2]
    assert kernels["a"] == [kernel_cache.compile_job(job)[0] for job in steps[0].jobs]

    rounds.clear()  # warm: one round, nothing to compile
    again = prebuild.build_all(steps, FakeStep.build, compile_jobs)
    assert rounds == [] and again == kernels


@needs_nvrtc
def test_prebuild_gives_up_deferring_after_its_rounds(cache, monkeypatch):
    monkeypatch.setattr(prebuild, "MAX_ROUNDS", 1)
    step = FakeStep("a", [tiny_job(1), tiny_job(2)])
    compiled = []
    kernels = prebuild.build_all([step], FakeStep.build, lambda jobs: compiled.extend(jobs) or len(jobs))
    assert [job.label for job in compiled] == ["tiny1.cu"]  # a fake: it compiled nothing
    # the plain build that followed the one round compiled both itself
    assert kernels["a"] == [kernel_cache.compile_job(job)[0] for job in step.jobs] and step.builds == 2


def test_compile_errors_pass_through_prebuild_unchanged(cache):
    def build(step):
        raise KernelCompileError("x.cu", ("-DA=1",), "x.cu(1): error: no")

    with pytest.raises(KernelCompileError, match=r"^kernel x.cu failed to compile with NVRTC \(-DA=1\): x.cu\(1\): error: no"):
        prebuild.build_all([FakeStep("a", [])], build, lambda jobs: pytest.fail("nothing to compile"))


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
