"""Which onnxruntime build an install gets: the extras never give both, the CLI says
what to do when neither or both are there, and a GPU run on the CPU build warns with
the copy time it cost."""
from __future__ import annotations

import re
import sys
from importlib import metadata
from types import SimpleNamespace

import pytest

from opplugin.cli import commands as cli, ort_builds
from repository import ROOT


tomllib = pytest.importorskip("tomllib")


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def distribution_names(requirements: list[str]) -> list[str]:
    return [re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements]


def test_no_extra_and_not_the_base_gives_both_onnxruntime_builds():
    base = distribution_names(project()["dependencies"])
    assert ort_builds.CPU_BUILD not in base and ort_builds.GPU_BUILD not in base
    extras = project()["optional-dependencies"]
    for name, requirements in extras.items():
        names = distribution_names(requirements)
        assert not (ort_builds.CPU_BUILD in names and ort_builds.GPU_BUILD in names), name
    assert ort_builds.CPU_BUILD in distribution_names(extras["cpu"])
    assert not {ort_builds.CPU_BUILD, ort_builds.GPU_BUILD} & set(distribution_names(extras["dev"]))
    for cuda in (12, 13):
        names = distribution_names(extras[f"cuda{cuda}"])
        assert f"cupy-cuda{cuda}x" in names and ort_builds.GPU_BUILD in names
        # the install command the warning gives asks for what the extra does
        assert ort_builds.GPU_REQUIREMENT[cuda] in extras[f"cuda{cuda}"]


def test_uv_is_told_the_onnxruntime_extras_conflict():
    conflicts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["conflicts"]
    assert [{"extra": "cpu"}, {"extra": "cuda12"}, {"extra": "cuda13"}] in conflicts


@pytest.mark.parametrize("installed, warned", [([], False), (["onnxruntime"], False), (["onnxruntime-gpu"], False),
                                               (["onnxruntime", "onnxruntime-gpu"], True)])
def test_both_builds_installed_is_warned_about(installed, warned, monkeypatch):
    def distribution(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return name

    monkeypatch.setattr(ort_builds.metadata, "distribution", distribution)
    assert ort_builds.installed_builds() == installed
    line = ort_builds.both_builds_warning()
    assert (line is not None) == warned
    if warned:
        assert "uninstall -y onnxruntime onnxruntime-gpu" in line and "\n" not in line


def test_the_install_command_matches_the_cuda_version():
    assert ort_builds.gpu_install_command(12).endswith("'onnxruntime-gpu[cuda,cudnn]>=1.20,<1.27'")
    assert ort_builds.gpu_install_command(13).endswith("'onnxruntime-gpu[cuda,cudnn]>=1.27'")
    assert ort_builds.gpu_install_command(None) == ort_builds.gpu_install_command(13)
    assert ort_builds.gpu_install_command(12).startswith("python3 -m pip uninstall -y onnxruntime && ")


def test_without_onnxruntime_the_cli_says_how_to_install_it(monkeypatch, capsys):
    import opplugin.cli.plan  # noqa: F401  the command's module and what it imports, loaded while onnxruntime is here

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    assert cli.main(["plan", "lenet86"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opplugin: error: onnxruntime is not installed")
    assert ".[cpu]" in err[0]


def fake_profile(is_cuda: bool = True, provider: str = "CPUExecutionProvider", plugin: bool = True):
    """A Profile as cpu_provider_warning reads it: conv (plugin) > onnxruntime1 > conv2 (plugin)."""
    steps = [SimpleNamespace(name="conv", kind="plugin", inputs=("x",), outputs=("a",)),
             SimpleNamespace(name="onnxruntime1", kind="onnxruntime", inputs=("a",), outputs=("b",)),
             SimpleNamespace(name="conv2", kind="plugin", inputs=("b",), outputs=("y",))]
    if not plugin:  # the same tensors, every step left to onnxruntime
        steps = [SimpleNamespace(name=s.name, kind="onnxruntime", inputs=s.inputs, outputs=s.outputs) for s in steps]
    plan = SimpleNamespace(device=SimpleNamespace(is_cuda=is_cuda), steps=steps, onnxruntime_provider=provider,
                           plugin_steps=[s for s in steps if s.kind == "plugin"],
                           model=SimpleNamespace(inputs=[SimpleNamespace(name="x")], outputs=["y"]))
    step_ms = {"copy H2D x": [5.0, 5.0, 5.0], "conv": [1.0], "copy D2H a": [2.0, 3.0, 4.0], "onnxruntime1": [9.0],
               "stage H2D b": [0.5], "copy H2D b": [1.5, 1.5, 100.0], "conv2": [1.0], "copy D2H y": [7.0]}
    kinds = {name: ("copy" if name.startswith(("copy", "stage")) else "step") for name in step_ms}
    return SimpleNamespace(plan=plan, step_ms=step_ms, kinds=kinds)


def test_a_gpu_run_on_the_cpu_build_warns_with_its_copy_time():
    line = ort_builds.cpu_provider_warning(fake_profile(), 13)
    # medians of the copies of a and b (3.0 + 0.5 + 1.5); the graph's own input and output copies are left out
    assert "its 1 step ran on the CPU" in line and "added up to 5.000 ms per run" in line
    assert line.endswith(ort_builds.gpu_install_command(13)) and "\n" not in line


@pytest.mark.parametrize("profile", [fake_profile(is_cuda=False), fake_profile(provider="CUDAExecutionProvider"),
                                     fake_profile(plugin=False)])
def test_no_warning_without_gpu_plugin_steps_or_with_the_cuda_provider(profile):
    assert ort_builds.cpu_provider_warning(profile, 13) is None
