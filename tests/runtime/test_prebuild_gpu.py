"""Compile jobs are declared, not caught: every kernel a step's build asks the kernel cache for
was declared beforehand by its plugin's compile_jobs, so a runner's one parallel compile
(runtime/prebuild.py) leaves its builds nothing to compile (GPU tests, marker `gpu`)."""
from __future__ import annotations

import pytest

from layout_cases import channel_shuffle, dense_block, inception_like
from matmul_cases import matmul_model, mlp_block
from onnx_builders import tiny_cnn
from pointwise_cases import batchnorm_model, se_gelu_model
from pool_cases import pool_cnn
from prologue_models import bn_model
from reduction_cases import planned
from resnet_block import resnet_block
from opplugin.core import paths
from opplugin.gpu import cuda, kernel_cache
from opplugin.gpu.device import current_cuda_device
from opplugin.graph.model import load_model
from opplugin.ops.activation import Activation
from opplugin.plan.partition import make_plan
from opplugin.runtime.prebuild import runtime_jobs

pytestmark = pytest.mark.gpu

SHIPPED = ("lenet86", "ece408_high", "mlp_onehidden")
# small models whose plans hold the other plugins' steps: pointwise groups, layouts, reductions, pools, GEMMs
MODELS = {
    "tiny_cnn": tiny_cnn,
    "se_gelu (pointwise groups)": se_gelu_model,
    "batchnorm relu (a pointwise group)": lambda: batchnorm_model(then_relu=True),
    "inception_like (Concat)": inception_like,
    "dense_block (Concats in place)": dense_block,
    "channel_shuffle (Reshape, Transpose)": channel_shuffle,
    "mlp_block (LayerNorm, MatMul, Softmax, ReduceMean)": mlp_block,
    "batched MatMul": lambda: matmul_model((2, 3, 17, 33), (2, 3, 33, 9), constant=""),
    "pool_cnn (pools, Gemm)": pool_cnn,
    "resnet_block (residual Conv)": resnet_block,
    "bn relu conv (a Conv prologue)": lambda: bn_model(Activation.plain("Relu"), channels=64, maps=64, size=28),
}


def asked_while_building(monkeypatch, plan, device, graphed: bool) -> list[kernel_cache.CompileJob]:
    """The jobs the steps' builds ask the kernel cache for, every module loaded afresh."""
    monkeypatch.setattr(cuda, "_modules", {})  # as a new process: every load goes through the cache
    asked = []
    looked_up = kernel_cache.binary_path

    def recording(job):
        asked.append(job)
        return looked_up(job)

    monkeypatch.setattr(kernel_cache, "binary_path", recording)
    for step in plan.plugin_steps:
        step.build(device, graphed=graphed)
    monkeypatch.setattr(kernel_cache, "binary_path", looked_up)
    return asked


def declared(plan, device, graphed: bool) -> set[str]:
    jobs = [*runtime_jobs(device), *(job for step in plan.plugin_steps for job in step.compile_jobs(device, graphed=graphed))]
    return {job.file_name for job in jobs}


def assert_builds_ask_only_what_was_declared(monkeypatch, plan, device, graphed: bool) -> None:
    promised = declared(plan, device, graphed)
    asked = asked_while_building(monkeypatch, plan, device, graphed)
    undeclared = [job.label for job in asked if job.file_name not in promised]
    assert not undeclared, f"built without being declared: {undeclared}"
    kinds = {step.node.op_type for step in plan.plugin_steps}
    if kinds & {"Conv", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool", "LayerNormalization", "Softmax"}:
        assert asked, "a plan of kernel steps asked the cache for nothing: the wrapper saw no load"


@pytest.mark.parametrize("graphed", [True, False])
@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_models_builds_load_only_declared_kernels(monkeypatch, name, graphed):
    device = current_cuda_device()
    plan = make_plan(load_model(str(paths.models_dir() / f"{name}.onnx")), 8, device)
    assert_builds_ask_only_what_was_declared(monkeypatch, plan, device, graphed)


@pytest.mark.parametrize("graphed", [True, False])
@pytest.mark.parametrize("name", MODELS)
def test_test_models_builds_load_only_declared_kernels(monkeypatch, name, graphed):
    device = current_cuda_device()
    for batch in (1, 4):  # batch 1: the Conv picks that split K, and views of a Concat's rows
        plan = planned(MODELS[name](), batch, device)
        assert plan.plugin_steps, name
        assert_builds_ask_only_what_was_declared(monkeypatch, plan, device, graphed)
