"""Bring your own kernel, on the CPU: the starter, the NVRTC compile path, compile errors
mapped to the user's lines, the plan with --kernel, the contract errors, the first bad
node, and the pieces of --sanitize and --watch that need no GPU."""
import threading
import time
from pathlib import Path

import pytest

from opplugin.cli import main
from opplugin.gpu.device import CPU
from opplugin.errors import PluginError
from opplugin.gpu import nvrtc
from opplugin.graph.model import load_model
from opplugin.registry import Kernel, Plugin, plugins
from opplugin.runtime import Runner
from opplugin.user_kernels import CudaSourcePlugin, KernelSource, UserKernelError, UserPlugin, starter_text, user_registry
from opplugin.user_kernels.source import evaluate, parse_directives
from opplugin.cli.kernel_tools.sanitize import device_code, format_findings, parse_findings, sanitize
from opplugin.cli.kernel_tools.watch import StepResult, describe, watch
from user_kernel_fixtures import FUSED, edited, new_starter
from repository import ROOT

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC (cuda-bindings) is not installed")


def line_of(path: Path, fragment: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if fragment in line)


# --- opplugin new ----------------------------------------------------------------------


def test_new_lists_the_op_types_with_starters(capsys):
    assert main(["new"]) == 0
    out = capsys.readouterr().out
    assert "conv " in out and "relu " in out
    assert 'extern "C" __global__ void conv(const float* x, const float* w, const float* b, float* y, int batch)' in out


def test_the_conv_starter_states_the_contract(tmp_path):
    starter = new_starter(tmp_path)
    text = starter.read_text()
    for fact in ("extern \"C\" __global__ void conv(", "HAS_BIAS", "KH, KW", "SH, SW", "PH, PW", "DH, DW", "C, M, G",
                 "weights=constant", "W_CONST", "grid=", "block=", "#error reject:", "fuses=epilogue"):
        assert fact in text, fact
    assert "my_conv.cu" in text  # the commands in its header name the file itself
    assert parse_directives(str(starter), text).block == 256


def test_new_writes_the_starter_and_refuses_to_overwrite_it_or_an_unknown_op_type(tmp_path, capsys):
    written = tmp_path / "mine.cu"
    assert main(["new", "Conv", str(written)]) == 0
    assert capsys.readouterr().out == f"Wrote {written}: a Conv kernel, one thread per output. Try: opplugin check --kernel Conv={written}\n"
    assert written.read_text() == starter_text("Conv").replace("THIS_FILE.cu", "mine.cu")
    starter = new_starter(tmp_path)
    assert main(["new", "conv", str(starter)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["new", "nosuchop", str(starter.with_name("g.cu"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no op type 'nosuchop'" in err and "conv, relu" in err


# --- compile and plan ------------------------------------------------------------------


@needs_nvrtc
@pytest.mark.parametrize("model", ["lenet86", "ece408_high"])
def test_plan_compiles_the_starter_without_a_gpu(tmp_path, model, capsys):
    starter = new_starter(tmp_path)
    assert main(["plan", model, "--device", "cpu", "--kernel", f"Conv={starter}"]) == 0
    out = capsys.readouterr().out
    assert "User kernels (compiled for sm_90 with NVRTC" in out
    assert "conv1: my_conv.cu; then" in out and "as a separate CuPy step (the source does not fuse its epilogue)" in out


def test_the_plan_names_what_runs_each_node_of_a_users_kernel(tmp_path, capsys):
    import json

    from opplugin.gpu.device import Device
    from opplugin.user_kernels import user_registry

    starter = new_starter(tmp_path)
    assert main(["plan", "lenet86", "--device", "cpu", "--kernel", f"Conv={starter}", "--json", str(tmp_path / "p.json")]) == 0
    assert "runs: conv.reference+relu+maxpool2 (my_conv.cu on a GPU)" in capsys.readouterr().out
    steps = json.loads((tmp_path / "p.json").read_text())["steps"]
    assert steps[0]["implementation"] == "conv.reference+relu+maxpool2 (my_conv.cu on a GPU)"
    # on a GPU: the source, the epilogue it leaves to CuPy, and the built-in choice where it rejected the node
    plugin = user_registry({"Conv": KernelSource(str(starter))}, probe=False)["Conv"]
    lenet = load_model("lenet86")
    conv1, relu1, pool1 = lenet.node_infos(4, lenet.infer(4))[:3]
    gpu = Device("cuda", "H200", "9.0")
    conv1 = type(conv1)(conv1.node, conv1.inputs, conv1.outputs, conv1.attributes, spec=plugin.make_spec(conv1), constants=conv1.constants)
    assert plugin.kernel_name(conv1, gpu) == "my_conv.cu"
    assert plugin.kernel_name(conv1, gpu, fused=[relu1, pool1]) == "my_conv.cu, then cupy+relu+maxpool2"
    plugin.rejections["conv1"] = "one input channel"
    assert plugin.kernel_name(conv1, gpu) == plugin.fallback.kernel_name(conv1, gpu)


@needs_nvrtc
def test_plan_says_where_a_fused_kernel_runs_its_epilogue(capsys, monkeypatch):
    # The plan compiles each node offline in NVRTC's fast-compile mode here (the same front end and
    # ptxas, less optimisation: 0.1 CPU-s instead of 10 for lenet86 conv2's fully unrolled loops):
    # this test reads what the plan says. CuPy's full build of conv_fused.cu on lenet86 is the GPU
    # tests' (user_kernels/test_plugin_gpu.py).
    from compile_cache import FAST_OPTIONS
    from opplugin.user_kernels import compiler

    full_options = compiler.options_for
    monkeypatch.setattr(compiler, "options_for", lambda digest=None: full_options(digest) + FAST_OPTIONS)
    assert main(["plan", "lenet86", "--device", "cpu", "--kernel", f"conv={FUSED}"]) == 0
    out = capsys.readouterr().out
    assert "conv1: conv_fused.cu, with Relu > MaxPool fused (fuses=epilogue)" in out


@needs_nvrtc
def test_a_fused_kernel_leaves_a_residual_add_and_other_activations_to_a_cupy_step(tmp_path, capsys):
    from onnx_builders import save
    from residual_models import residual_model

    from opplugin.ops.activation import Activation
    from opplugin.ops.conv.epilogue import Epilogue
    from opplugin.ops.conv.spec import ConvSpec
    from opplugin.user_kernels.contract import conv_user_defines, user_fusable

    path = save(residual_model(Activation.plain("Relu")), tmp_path / "residual.onnx")
    assert main(["plan", path, "--device", "cpu", "--batch", "2", "--kernel", f"conv={FUSED}"]) == 0
    out = capsys.readouterr().out
    assert "conv: conv_fused.cu; then Add > Relu as a separate CuPy step (the source fuses only ACT and the max pool)" in out
    assert user_fusable(Epilogue("Tanh", (2, 2))) and not user_fusable(Epilogue("Relu", residual=True))
    assert not user_fusable(Epilogue("Sigmoid")) and not user_fusable(Epilogue(Activation("LeakyRelu", 0.1)))
    lenet = load_model("lenet86")
    conv1 = next(info for info in lenet.node_infos(4, lenet.infer(4)) if info.op_type == "Conv")
    defines = conv_user_defines(ConvSpec.from_node(conv1), Epilogue("Tanh", (2, 2)))
    assert defines["ACT"] == 2 and defines["PKH"] == 2 and not {"RESIDUAL", "POOL_FIRST", "ACTIVATION(v)", "BLOCK"} & set(defines)


@needs_nvrtc
def test_a_compile_error_names_the_users_line_then_nvrtcs_log(tmp_path, capsys):
    starter = new_starter(tmp_path)
    bad = edited(starter, "acc += b[m];", "acc += b[m] + oops;", "bad.cu")
    assert main(["plan", "lenet86", "--kernel", f"Conv={bad}"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # the error comes before any of the plan
    lines = err.splitlines()
    assert lines[0] == f'{bad}:{line_of(bad, "oops")}: identifier "oops" is undefined'
    assert "NVRTC's log" in lines[1] and "C=1 M=4" in lines[1]
    assert any("acc += b[m] + oops;" in line for line in lines[2:])
    assert "Traceback" not in err


@needs_nvrtc
def test_a_rejected_shape_falls_back_with_the_reason_in_the_plan(tmp_path, capsys):
    starter = new_starter(tmp_path)
    picky = edited(starter, "#if G != 1\n#error reject: grouped convolution is not handled by this starter",
                   "#if C == 1\n#error reject: one input channel: the built-in kernel is better", "picky.cu")
    assert main(["plan", "lenet86", "--kernel", f"Conv={picky}"]) == 0
    out = capsys.readouterr().out
    assert "conv1: picky.cu rejects it (one input channel: the built-in kernel is better); the built-in choice runs it" in out
    assert "conv2: picky.cu; then Relu > MaxPool" in out


@needs_nvrtc
@pytest.mark.parametrize("old, new, message", [
    ("void conv(", "void conf(", ': no entry point: it must define extern "C" __global__ void conv('),
    ("int batch)\n{", "float batch)\n{", ": wrong signature for conv: it must be extern \"C\" __global__ void conv("),
    ("float* y, int batch)\n{", "float* y)\n{", ": wrong signature for conv"),
    ('extern "C" __global__', "__global__", ': the entry point conv must be declared extern "C" __global__'),
])
def test_contract_errors_are_one_line_with_exit_status_2(tmp_path, old, new, message, capsys):
    starter = new_starter(tmp_path)
    bad = edited(starter, old, new, "bad.cu")
    assert main(["plan", "--kernel", f"Conv={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(str(bad)) and message in err, err


@pytest.mark.parametrize("flag, message", [
    ("Conv=/nowhere/x.cu", "/nowhere/x.cu: no such kernel file"),
    ("Gemm=x.cu", "no user-kernel contract for op type 'Gemm'"),
    ("my_conv.cu", "--kernel takes OP=FILE.cu"),
])
def test_bad_kernel_flags_are_one_line_errors(flag, message, capsys):
    assert main(["plan", "--kernel", flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_bad_directives_name_their_line(tmp_path):
    text = "// header\n// opplugin: block=4096\n"
    with pytest.raises(UserKernelError, match=r"^k.cu:2: block must be a whole number from 1 to 1024"):
        parse_directives("k.cu", text)
    with pytest.raises(UserKernelError, match=r"^k.cu:1: unknown directive 'blocks'"):
        parse_directives("k.cu", "// opplugin: blocks=4\n")
    with pytest.raises(UserKernelError, match="may call is cdiv"):
        parse_directives("k.cu", "// opplugin: grid=__import__('os')\n")


def test_grid_expressions_are_integer_arithmetic_on_the_macros():
    launch = parse_directives("k.cu", "// opplugin: grid=cdiv(OW, 16), cdiv(OH, 16), batch * M\n")
    names = {"OW": 80, "OH": 34, "M": 4, "batch": 10}
    assert tuple(evaluate(e, names, "k.cu") for e in launch.grid) == (5, 3, 40)
    with pytest.raises(UserKernelError, match="names Q, which is not a macro"):
        evaluate("Q + 1", names, "k.cu")


# --- run and check without a GPU ---------------------------------------------------------


@needs_nvrtc
def test_check_on_the_cpu_says_once_that_the_reference_runs_instead(tmp_path, capsys):
    starter = new_starter(tmp_path)
    assert main(["check", "lenet86", "--batch", "16", "--device", "cpu", "--kernel", f"Conv={starter}"]) == 0
    out, err = capsys.readouterr()
    assert err.count("The user kernel cannot run without a GPU: the numpy reference backend runs its nodes instead.") == 1
    assert "PASS" in out


def test_the_api_takes_kernels_by_op_type(tmp_path):
    starter = new_starter(tmp_path)
    model = load_model("lenet86")
    runner = Runner(model, 4, CPU, kernels={"Conv": str(starter)})
    plugin = runner.plan.plugin_steps[0].plugin
    assert isinstance(plugin, UserPlugin) and plugin.source.label == "my_conv.cu"
    assert plugin.fallback is plugins()["Conv"]  # the built-in plugin runs what the source cannot
    source = KernelSource(str(starter), "Conv")
    registry = user_registry({"Conv": source}, poison=True)
    assert registry["Conv"].source is source and registry["Conv"].poison


# --- the first bad node ------------------------------------------------------------------


class OffByOne(Kernel):
    def __init__(self, inner):
        self.inner, self.name, self.variant = inner, inner.name + "+1", None

    def flops(self, batch):
        return self.inner.flops(batch)

    def bytes_moved(self, batch):
        return self.inner.bytes_moved(batch)

    def __call__(self, inputs, stream=None):
        return [y + 1.0 for y in self.inner(inputs, stream)]


class WrongOn(Plugin):
    """The built-in Conv plugin, wrong (by +1) on one named node."""

    op_type = "Conv"

    def __init__(self, bad):
        self.inner, self.bad = plugins()["Conv"], bad

    def supports(self, node, device):
        return self.inner.supports(node, device)

    def fuse(self, node, followers, device):
        return self.inner.fuse(node, followers, device)

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = self.inner.build(node, device, variant, fused, prologue, graphed)
        return OffByOne(kernel) if node.name == self.bad else kernel


@pytest.mark.parametrize("bad", ["conv1", "conv2"])
def test_check_names_the_first_bad_node_not_those_after_it(monkeypatch, bad, capsys):
    import opplugin.registry as registry

    monkeypatch.setitem(registry._registry, "Conv", WrongOn(bad))
    assert main(["check", "lenet86", "--batch", "8", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert f"First bad node: {bad} (conv.reference+relu+maxpool" in out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  conv")}
    assert "own max abs" in lines[bad] and "FAIL" in lines[bad].split(";")[0]
    if bad == "conv1":  # conv2 fails in the chain, but only because of what conv1 gave it
        assert "pass; chained" in lines["conv2"] and "(carried in from upstream)" in lines["conv2"]


# --- pieces of --sanitize and --watch ----------------------------------------------------

MEMCHECK_OUTPUT = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at conv+0x2d0 in /tmp/x/oob.cu:70
=========     by thread (31,0,0) in block (99,0,0)
=========     Address 0x7f00deadbeef is out of bounds
========= Invalid __global__ write of size 4 bytes
=========     at conv+0x2d0 in /tmp/x/oob.cu:70
=========     by thread (30,0,0) in block (99,0,0)
========= Invalid __global__ read of size 4 bytes
=========     at conv_baseline+0x10 in conv_baseline.cu:3
========= ERROR SUMMARY: 3 errors
"""


def test_sanitizer_findings_in_the_users_file_become_a_table_with_source_lines(tmp_path):
    path = tmp_path / "oob.cu"
    path.write_text("\n" * 69 + "    y[index + 64] = acc;\n" + 'extern "C" __global__ void conv(const float* x) {}\n')
    source = KernelSource(str(path), "Conv", text=path.read_text())
    findings = parse_findings("memcheck", MEMCHECK_OUTPUT, [device_code(source)])
    assert len(findings) == 1 and findings[0].count == 2 and findings[0].line == 70  # the built-in kernel's is not ours
    table = format_findings(findings, [device_code(source)])
    assert "Invalid __global__ write of size 4 bytes" in table and "oob.cu:70" in table and "y[index + 64] = acc;" in table


def test_sanitize_says_in_one_line_when_compute_sanitizer_is_missing(tmp_path, monkeypatch):
    starter = new_starter(tmp_path)
    monkeypatch.setattr("opplugin.cli.kernel_tools.sanitize.find_sanitizer", lambda: None)
    said = []
    sanitize("lenet86", [KernelSource(str(starter))], say=said.append)
    assert said == ["--sanitize: compute-sanitizer is not installed here (it comes with the CUDA toolkit); skipped"]


def test_watch_measures_again_after_a_save_and_prints_the_change(tmp_path):
    path = tmp_path / "k.cu"
    path.write_text("one")
    figures = iter([StepResult("k.cu", 1e-6, True, 2.0, 4.0), StepResult("k.cu", 3e-2, False, 1.0, 2.0)])
    said = []

    def edit_after_first_measure():
        while not any("measured:" in line for line in said):
            time.sleep(0.01)
        time.sleep(0.05)
        path.write_text("two")

    editor = threading.Thread(target=edit_after_first_measure)
    editor.start()
    assert watch([str(path)], lambda: {"conv1": next(figures)}, said.append, cycles=1, poll_s=0.02) == 0
    editor.join()
    assert "conv1 (k.cu): error 1.00e-06 -> 3.00e-02 FAIL, 2.000 -> 1.000 ms (-50%), 4.0 -> 2.0x floor" in "\n".join(said)


def test_watch_describes_a_first_result_without_a_diff():
    [line] = describe({"conv1": StepResult("k.cu", None, True, None, None)}, None)
    assert line == "  conv1 (k.cu): error - pass"


def test_the_starters_ship_as_package_data():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "opplugin.starters" in config["tool"]["setuptools"]["packages"]
    assert "opplugin.user_kernels" in config["tool"]["setuptools"]["packages"]
    assert "*.cu" in config["tool"]["setuptools"]["package-data"]["opplugin.starters"]
    assert "extern \"C\" __global__ void relu(" in starter_text("Relu")


# --- the CudaSourcePlugin helper ---------------------------------------------------------

SCALE_SOURCE = """// scales every element by SCALE
extern "C" __global__ void scale(const float* x, float* y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * SCALE;
}
"""


class Doubler(CudaSourcePlugin):
    op_type = "Relu"
    entry = "scale"
    source_path = "scale.cu"
    source_text = SCALE_SOURCE

    def defines(self, node):
        return {"SCALE": 2}


def test_a_cuda_source_plugin_needs_a_gpu_and_says_so():
    model = load_model("lenet86")
    plan_step = Runner(model, 2, CPU).plan.plugin_steps[0]
    plugin = Doubler()
    assert plugin.supports(plan_step.node, CPU) == "Doubler runs CUDA source only, and there is no GPU"
    with pytest.raises(PluginError, match="Doubler needs a CUDA device"):
        plugin.build(plan_step.node, CPU)


@needs_nvrtc
def test_a_cuda_source_plugins_compile_errors_name_its_own_lines():
    from opplugin.user_kernels.compiler import compile_node

    source = Doubler()._source()
    assert compile_node(source, {"SCALE": 2}, on_gpu=False).options  # compiles with its macros, no signature check
    broken = Doubler()
    broken.source_text = SCALE_SOURCE.replace("x[i] * SCALE", "x[i] * SCALE * k")
    with pytest.raises(UserKernelError, match=r'^scale.cu:5: identifier "k" is undefined'):
        compile_node(broken._source(), {"SCALE": 2}, on_gpu=False)
    missing = Doubler()
    missing.entry = "shrink"
    with pytest.raises(UserKernelError, match="scale.cu: no entry point"):
        missing._source()
