"""What a step declares its build will compile (Plugin.compile_jobs), on the CPU: a plan for an
offline sm_90 device is asked, nothing is compiled. The declared kernels follow the same choice
as the build and the plan's kernel name: graphed or eager, the variant asked for, the weights
of a constant-memory module."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_builders import conv_model, tiny_cnn
from opplugin.errors import PluginError
from opplugin.gpu.device import CPU, Device
from opplugin.ops.conv.families import base
from reduction_cases import planned

OFFLINE = Device("cuda", "offline", "9.0")


def conv_step(batch: int, channels: int, maps: int, size: int, seed: int = 0):
    """The one step of a 3x3 Conv (pads 1) with random weights, planned for the offline device."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((maps, channels, 3, 3)) * 0.1).astype(np.float32)
    model = conv_model((batch, channels, size, size), w, np.zeros(maps, np.float32), {"pads": [1, 1, 1, 1]})
    [step] = planned(model, batch, OFFLINE).plugin_steps
    return step


def test_a_conv_declares_the_kernel_of_the_pick_for_graphs_or_for_eager_launches():
    """ResNet's 128->128 at batch 1 goes to the wgmma GEMM split over K under graphs, to tc_3xtf32 eagerly
    (ops/conv/choice.py): each build's kernels, by the names the plan shows."""
    step = conv_step(1, 128, 128, 28)
    for graphed, family, source in [(True, "wg_3xtf32", "conv_wgmma.cu"), (False, "tc_3xtf32", "conv_tc_gemm.cu")]:
        assert step.kernel_name(OFFLINE, graphed=graphed).startswith(f"conv.{family}_")
        jobs = step.compile_jobs(OFFLINE, graphed=graphed)
        assert jobs and {job.label for job in jobs} == {source}
    assert {job.arch for job in step.compile_jobs(OFFLINE, graphed=True)} == {"sm_90a"}  # wgmma's code runs on 9.0 alone


def test_a_constant_memory_module_is_declared_with_the_digest_of_its_weights():
    one, again, other = conv_step(2, 3, 4, 12, seed=1), conv_step(2, 3, 4, 12, seed=1), conv_step(2, 3, 4, 12, seed=2)
    [job] = one.compile_jobs(OFFLINE)
    assert one.kernel_name(OFFLINE).startswith("conv.const") and any("OPPLUGIN_WEIGHTS_DIGEST" in o for o in job.options)
    assert [j.file_name for j in again.compile_jobs(OFFLINE)] == [job.file_name]
    assert [j.file_name for j in other.compile_jobs(OFFLINE)] != [job.file_name]  # its own constant bank


def test_a_variant_asked_for_is_the_one_declared_and_one_that_cannot_run_fails_as_the_build_does():
    step = conv_step(2, 3, 4, 12)
    [job] = step.compile_jobs(OFFLINE, "baseline")
    assert job.label == "conv_baseline.cu" and not any("WEIGHTS_DIGEST" in o for o in job.options)
    for device in (OFFLINE, CPU):
        with pytest.raises(PluginError) as declared:
            step.compile_jobs(device, "no_such_variant")
        with pytest.raises(PluginError) as built:
            step.build(device, "no_such_variant")
        assert str(declared.value) == str(built.value)


def test_the_units_a_family_declares_are_those_its_build_loads(monkeypatch):
    """Family.load and Family.compile_jobs share compile_units and module_constants: the jobs load_functions makes."""
    step = conv_step(2, 3, 4, 12)
    loaded = []
    monkeypatch.setattr(base.cuda, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(base.cuda, "load", lambda job: loaded.append(job) or FakeModule())
    monkeypatch.setattr(base, "upload_constant", lambda module, name, values: None)
    step.build(OFFLINE)
    assert loaded == list(step.compile_jobs(OFFLINE))


class FakeModule:
    def get_function(self, name):
        return name


def test_the_cpu_device_compiles_nothing():
    plan = planned(tiny_cnn(), 2, CPU)
    assert plan.plugin_steps and not [job for step in plan.plugin_steps for job in step.compile_jobs(CPU)]
