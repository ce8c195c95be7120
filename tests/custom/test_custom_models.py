"""Models with custom nodes, from a declaration file alone, on the CPU: they plan (no custom node
is left to onnxruntime), run on the reference backend, and pass `check`, which holds each
custom node to its float64 reference on onnxruntime's values before it; a wrong kernel fails
there and is named first bad; a node nobody can run, and every broken declaration file, is one
line and exit 2 before any work."""
import json
from pathlib import Path

import numpy as np
import pytest

from custom_models import conv_swish_model, function_model, ops_file, save, split_max_op, swish_op, two_custom_ops_model
from opplugin.cli import main
from opplugin.custom import CustomOp, load_ops
from opplugin.custom.functions import function_ids
from opplugin.graph.model import load_model
from opplugin.plan.partition import OrtStep
from opplugin.runtime import Runner
from opplugin.verify.check import check


def feeds(batch: int, seed: int = 3) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((batch, 3, 12, 12)).astype(np.float32)}


def float64_forward(x: np.ndarray, model, beta: float) -> np.ndarray:
    """The conv_swish_model in float64, by hand: what the run must come near."""
    w = next(t for t in model.graph.initializer if t.name == "W")
    weight = np.frombuffer(w.raw_data, np.float32).reshape(tuple(w.dims)).astype(np.float64)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # n c h w 3 3
    conv = np.einsum("nchwij,mcij->nmhw", windows, weight)
    swish = conv / (1 + np.exp(-beta * conv))
    return swish.mean(axis=(2, 3))


def test_a_model_with_a_custom_node_runs_on_its_declaration_alone(tmp_path):
    proto = conv_swish_model(beta=1.5)
    model = load_model(save(proto, tmp_path))
    runner = Runner(model, 4, "cpu", ops=[swish_op()])
    assert not any(isinstance(step, OrtStep) for step in runner.plan.steps)
    [swish] = [s for s in runner.plan.plugin_steps if s.name == "swish"]
    assert swish.node.op_key == "com.example::Swish2" and runner.kernels["swish"].name == "Swish2.reference"
    x = feeds(4)["x"]
    y = runner.run({"x": x}).outputs["y"]
    assert y.shape == (4, 8) and np.allclose(y, float64_forward(x, proto, 1.5), rtol=1e-4, atol=1e-5)


def test_check_compares_custom_nodes_with_their_reference_on_onnxruntime_values(tmp_path):
    model = load_model(save(two_custom_ops_model(), tmp_path))
    runner = Runner(model, 6, "cpu", ops=[swish_op(), split_max_op()])
    result = check(runner.run, runner.plan_record(6), feeds(6))
    compared = {(r["tensor"], r["step"]) for r in result.records}
    assert {("s", "swish1"), ("high", "halves"), ("mean", "halves"), ("s2", "swish2"), ("y", "model output")} <= compared
    assert result.passed and all(r["max_abs_error"] < 1e-5 for r in result.records)


def test_plan_run_and_check_take_the_declarations_from_ops_files(tmp_path, capsys):
    model = save(conv_swish_model(), tmp_path)
    ops = ops_file(tmp_path)
    assert main(["plan", str(model), "--ops", str(ops), "--batch", "2"]) == 0
    plan = capsys.readouterr().out
    assert "Swish2.reference" in plan and "onnxruntime" not in plan
    assert main(["run", str(model), "--ops", str(ops), "--batch", "3"]) == 0
    assert "Swish2.reference" in capsys.readouterr().out
    report = tmp_path / "check.json"
    assert main(["check", str(model), "--ops", str(ops), "--batch", "5", "--json", str(report)]) == 0
    records = json.loads(report.read_text())["records"]
    assert any(r["step"] == "swish" and r["passed"] for r in records)


WRONG_KERNEL = '''import numpy as np
from opplugin.custom import CustomOp, load_ops
from opplugin.custom.reference import ReferenceKernel


class Off(ReferenceKernel):
    """The reference, off by 0.05 everywhere: a wrong kernel."""

    def __call__(self, inputs, stream=None):
        return [y + np.float32(0.05) for y in super().__call__(inputs, stream)]


class OffSwish(CustomOp):
    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        return Off(self, node, node.spec, device)


swish = OffSwish("com.example", "Swish2", inputs=["X"], outputs=["Y"], attributes={"beta": 1.0},
                 reference=lambda x, beta: x / (1.0 + np.exp(-beta * x)))
'''


def test_a_wrong_custom_kernel_fails_check_and_is_the_first_bad_node(tmp_path, capsys):
    model = save(conv_swish_model(), tmp_path)
    ops = ops_file(tmp_path, WRONG_KERNEL)
    report = tmp_path / "check.json"
    assert main(["check", str(model), "--ops", str(ops), "--batch", "4", "--json", str(report)]) == 1
    data = json.loads(report.read_text())
    assert not data["passed"]
    [swish] = [r for r in data["records"] if r["step"] == "swish"]
    assert not swish["passed"] and swish["max_abs_error"] == pytest.approx(0.05, rel=1e-3)
    first_bad = data["steps_alone"]["first_bad_node"]
    assert first_bad["step"] == "swish" and not first_bad["sound"]
    # float64 arbitration ran the custom node's own reference: ours is 0.05 off it, onnxruntime's side is not
    assert first_bad["float64_max_abs"]["opplugin"] == pytest.approx(0.05, rel=1e-3)
    assert first_bad["float64_max_abs"]["onnxruntime"] < 1e-6
    assert "first bad" in capsys.readouterr().out.lower()


def test_a_node_that_neither_onnxruntime_nor_a_declaration_runs_is_refused_in_one_line(tmp_path, capsys):
    model = save(conv_swish_model(), tmp_path)
    assert main(["plan", str(model), "--batch", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("opplugin: error: custom: node swish is com.example::Swish2, which onnxruntime does not know and no "
                   "declaration runs; declare it in a Python file (opplugin.custom.CustomOp) and pass --ops FILE.py")


BAD_FILES = [
    ("import numpy as np\nraise RuntimeError('no GPU here')\n", "{path}:2: the file does not import: RuntimeError: no GPU here"),
    ("def broken(:\n", "{path}:1: the file does not import: SyntaxError: invalid syntax"),
    ("x = 1\n", "--ops {path}: the file defines no CustomOp at its top level"),
    ("import numpy as np\nfrom opplugin.custom import CustomOp\n"
     "a = CustomOp('com.example', 'Swish2', inputs=['X'], outputs=['Y'], reference=lambda x: x)\n"
     "b = CustomOp('com.example', 'Swish2', inputs=['X'], outputs=['Y'], reference=lambda x: x)\n",
     "{path}: two declarations for com.example::Swish2; keep one"),
    ("import numpy as np\nfrom opplugin.custom import CustomOp\n"
     "a = CustomOp('com.example', 'Swish2', inputs=['X', 'Z'], outputs=['Y'], attributes={'beta': 1.0}, reference=lambda x, z: x)\n",
     "swish: com.example::Swish2 takes 2 inputs (X, Z), the node gives 1"),
    ("import numpy as np\nfrom opplugin.custom import CustomOp\n"
     "a = CustomOp('com.example', 'Swish2', inputs=['X'], outputs=['Y'], attributes={'beta': 1.0}, reference=lambda x, beta: x[:, :1])\n",
     "swish: the reference of com.example::Swish2 returned Y of shape [3, 1, 12, 12]; its shape function says [3, 8, 12, 12]"),
    ("import numpy as np\nfrom opplugin.custom import CustomOp\n"
     "a = CustomOp('com.example', 'Swish2', inputs=['X'], outputs=['Y'], attributes={'beta': 1.0}, reference=lambda x, beta: x.nope)\n",
     "swish: the reference of com.example::Swish2 raised AttributeError: 'numpy.ndarray' object has no attribute 'nope'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_a_broken_declaration_file_is_one_line_and_exit_2(tmp_path, capsys, text, message):
    model = save(conv_swish_model(), tmp_path)
    ops = ops_file(tmp_path, text)
    report = tmp_path / "run.json"
    assert main(["run", str(model), "--ops", str(ops), "--batch", "3", "--json", str(report)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "opplugin: error: " + message.format(path=ops) and not report.exists()
    assert not any("Traceback" in line for line in err)


def test_a_missing_ops_file_is_one_line(tmp_path, capsys):
    model = save(conv_swish_model(), tmp_path)
    assert main(["plan", str(model), "--ops", str(tmp_path / "none.py")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"--ops {tmp_path / 'none.py'}: no such file")


def test_a_declaration_for_an_onnx_op_takes_its_nodes_from_the_built_in_plugin():
    relu = CustomOp("", "Relu", reference=lambda x: np.maximum(x, 0.0))
    runner = Runner(load_model("lenet86"), 4, "cpu", ops=[relu])
    relus = [s for s in runner.plan.plugin_steps if s.node.op_type == "Relu"]
    assert len(relus) == 3 and all(s.plugin is relu and runner.kernels[s.name].name == "Relu.reference" for s in relus)
    assert "relu1" not in [f.name for s in runner.plan.plugin_steps for f in s.fused]  # no built-in Conv fuses it now
    x = np.random.default_rng(0).uniform(0, 1, (4, 1, 86, 86)).astype(np.float32)
    result = check(runner.run, runner.plan_record(4), {"input": x})
    assert result.passed


def test_a_call_of_a_model_function_is_inlined_so_plugins_run_its_body(tmp_path):
    model = load_model(save(function_model(), tmp_path))
    runner = Runner(model, 3, "cpu")
    ops = [op for step in runner.plan.plugin_steps for op in step.ops]
    assert "ScaledSiLU" not in ops and "Sigmoid" in ops and not any(isinstance(s, OrtStep) for s in runner.plan.steps)
    assert check(runner.run, runner.plan_record(3), feeds(3)).passed


def test_a_declaration_for_a_model_function_takes_each_call_as_one_node_its_body_the_reference(tmp_path):
    declared = CustomOp("local.fns", "ScaledSiLU")  # inputs, outputs and reference from the function itself
    model = load_model(save(function_model(), tmp_path), keep_functions=function_ids([declared]))
    runner = Runner(model, 3, "cpu", ops=[declared])
    [silu] = [s for s in runner.plan.plugin_steps if s.name == "silu"]
    assert silu.ops == ["local.fns::ScaledSiLU"] and runner.kernels["silu"].name == "ScaledSiLU.reference"
    x = feeds(3)["x"]
    result = check(runner.run, runner.plan_record(3), {"x": x})
    assert result.passed and any(r["step"] == "silu" for r in result.records)


def test_a_custom_node_inside_a_branch_is_refused_in_one_line(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    branch = helper.make_graph([helper.make_node("Swish2", ["x"], ["b"], domain="com.example")], "then", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["c"])], "else", [],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N", 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["positive"], name="gt"),
             helper.make_node("If", ["positive"], ["y"], then_branch=branch, else_branch=other, name="choose")]
    graph = helper.make_graph(nodes, "branchy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                              initializer=[helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "branchy.onnx"
    onnx.save(model, path)
    assert main(["plan", str(path), "--batch", "2", "--ops", str(ops_file(tmp_path))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and err[-1].endswith("custom ops run only at the top level of the graph")
    assert "node choose (If) holds com.example::Swish2 in a subgraph" in err[-1]


def test_bench_custom_needs_its_declarations_and_a_gpu(capsys):
    from opplugin.gpu import cuda

    assert main(["bench", "--custom", "lenet86_swish"]) == 2
    assert capsys.readouterr().err.strip().endswith("bench --custom MODEL needs --ops FILE.py, and --ops applies to bench --custom")
    if not cuda.is_available():
        ops = str(Path(__file__).resolve().parents[2] / "models" / "lenet86_swish_ops.py")
        assert main(["bench", "--custom", "lenet86_swish", "--ops", ops]) == 2
        assert capsys.readouterr().err.strip().endswith("bench --custom times kernels on a GPU, and CuPy sees none")


def shipped_declarations(name: str):
    from opplugin.custom.loading import load_ops

    return load_ops(str(Path(__file__).resolve().parents[2] / "models" / name))


@pytest.mark.parametrize("attributes, bias", [
    ({"strides": [2, 2], "pads": [3, 3, 3, 3], "kernel_shape": [7, 7]}, True),
    ({"group": 4, "pads": [1, 0, 2, 1], "dilations": [2, 1]}, False),
    ({"strides": [1, 2], "group": 8}, True),  # depthwise
])
def test_the_shipped_triton_convs_reference_agrees_with_onnxruntime(attributes, bias):
    import onnxruntime
    from onnx import TensorProto, helper

    [conv] = shipped_declarations("conv_triton_ops.py")
    rng = np.random.default_rng(5)
    group = attributes.get("group", 1)
    taps = attributes.get("kernel_shape", [3, 3])
    x = rng.standard_normal((2, 8, 15, 13)).astype(np.float32)
    w = rng.standard_normal((16, 8 // group, *taps)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    node = helper.make_node("Conv", inputs, ["y"], **attributes)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    values = {"x": x, "w": w, "b": b}
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {n: values[n] for n in inputs})[0]
    given = {**conv.attributes, **attributes}
    got = conv.reference_function(*(values[n].astype(np.float64) for n in inputs), **given)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_the_shipped_triton_conv_takes_every_conv_and_passes_check_on_its_reference():
    [conv] = shipped_declarations("conv_triton_ops.py")
    runner = Runner(load_model("lenet86"), 8, "cpu", ops=[conv])
    convs = [s for s in runner.plan.plugin_steps if s.node.op_type == "Conv"]
    assert len(convs) == 2 and all(runner.kernels[s.name].name == "Conv.reference" for s in convs)
    x = np.random.default_rng(1).uniform(0, 1, (8, 1, 86, 86)).astype(np.float32)
    assert check(runner.run, runner.plan_record(8), {"input": x}).passed


def test_watch_and_sanitize_find_the_cuda_files_of_the_declarations_a_model_uses(tmp_path, capsys):
    from custom_models import example_with_cuda_file
    from opplugin.cli.kernel_tools.cli_support import declared_device_code, declared_files
    from opplugin.cli.loading import load_declared

    ops, source = example_with_cuda_file(tmp_path)
    [code] = declared_device_code(load_ops(ops))  # CuPy's kernels have no name known in advance; no Triton on the CPU
    assert (code.label, code.entry, code.path, code.shared_memory) == ("cuda:swish.cu", "swish", str(source), False)
    assert declared_files(load_declared("lenet86_swish", (str(ops),))) == {
        "example.ops::Swish": str(source)}
    assert declared_files(load_declared("lenet86", (str(ops),))) == {}  # no Swish node in lenet86
    assert main(["check", "lenet86", "--ops", str(ops), "--watch"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--watch: no --kernel file, and no declaration of --ops with a CUDA C file, has a node in lenet86")


def test_an_ops_path_that_is_a_folder_or_a_pipe_is_refused_without_opening_it(tmp_path, capsys):
    import os

    pipe = tmp_path / "ops.py"
    os.mkfifo(pipe)
    for given in (pipe, tmp_path):
        assert main(["new", "example.ops::Swish", str(tmp_path / "s.cu"), "--ops", str(given)]) == 2
        assert capsys.readouterr().err.strip().endswith(f"--ops {given}: not a regular file; give a Python file")
