import os
import sys
from pathlib import Path

# numpy's OpenBLAS in one thread (unless set otherwise), here before anything imports numpy, and in
# the processes the tests start: on a 2-CPU machine its second thread mostly spins, on the CPU the
# compile check's compiles would use, without making the tests quicker (the suite without the
# compile check: the same 28 s, 29 CPU-s instead of 41; the README's blocks 12 instead of 21).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))  # the builders and cases the tests share

# ops/test_kernel_compile.py's NVRTC compiles take most of the CPU suite's time: they begin before
# the suite is collected where the run will collect the module (else once it is), in one process at
# the lowest priority that uses a CPU the other tests leave idle, and the module's tests run last
# (compile_cache.py). A path, not a file name: the module's
# test_its_compiles_began_once_the_suite_was_collected fails if this stops naming it.
COMPILE_CHECK = Path(__file__).parent / "ops" / "test_kernel_compile.py"  # as pytest gives item.path


def _collects_the_compile_check(config) -> bool:
    """Whether this run collects the compile check (it or a folder above it among the arguments) and
    selects its tests without reading the collection (-k, -m, --deselect, --lf may deselect them all)."""
    option = config.option
    if option.collectonly or option.keyword or option.markexpr or option.deselect or option.ignore or option.ignore_glob \
            or getattr(option, "lf", False):
        return False
    if getattr(option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return False  # pytest-xdist's controller runs no test
    target = COMPILE_CHECK.resolve()
    for argument in config.args:
        path = (config.invocation_params.dir / argument.split("::")[0]).resolve()
        if path == target or path in target.parents:
            return True
    return False


def pytest_sessionstart(session):
    """Where the run collects the compile check, its compiles begin now, while the suite is
    collected: the background process reads the module's job list itself."""
    from opplugin.lab import nvrtc_check

    if _collects_the_compile_check(session.config) and nvrtc_check.nvrtc_available():
        import compile_cache

        compile_cache.use_pytest_cache(session.config)
        compile_cache.head_start(COMPILE_CHECK)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip, with the reason, where CuPy sees no CUDA device; the compile
    check's tests go last."""
    from opplugin.gpu import cuda

    items.sort(key=lambda item: item.path == COMPILE_CHECK)  # stable: the rest keep their order
    if cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (CuPy missing or no GPU visible)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a keyword: tests/gpu/ is a folder's name
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start the compile check's compiles in the background (or add what the head start lacks) if
    any of its tests will run; else stop those begun."""
    from opplugin.lab import nvrtc_check

    modules = {item.module for item in session.items if item.path == COMPILE_CHECK}
    if modules and not session.config.option.collectonly and nvrtc_check.nvrtc_available():
        modules.pop().start_compiles(session.config, background=True)
    elif "compile_cache" in sys.modules:
        sys.modules["compile_cache"].cancel()


def pytest_sessionfinish(session):
    """A run that stops early (-x, Ctrl-C) does not wait for compiles nobody will read."""
    if "compile_cache" in sys.modules:
        sys.modules["compile_cache"].cancel()


@pytest.fixture
def tiny_model_path(tmp_path):
    from onnx_builders import save, tiny_cnn

    return save(tiny_cnn(), tmp_path / "tiny.onnx")
