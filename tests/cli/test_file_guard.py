"""Nothing a user types destroys a file, and every bad request is one line and exit 2:
the cases of issue 26's table, each with its exit status, its one line, no traceback,
and the files around it as they were."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import finish, save, tiny_cnn

from opplugin.cli import main
from opplugin.gpu.nvrtc import nvrtc_available
from opplugin.core.paths import models_dir
from repository import ROOT


STARTER_EDIT = "// opplugin: block=256"
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (cuda-bindings) is not installed")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(capsys, message: str) -> str:
    out, err = capsys.readouterr()
    err = err.strip()
    assert err.startswith("opplugin: error:") or err.split(":")[0].endswith(".cu"), err
    assert message in err and "\n" not in err and "Traceback" not in err, err
    return out


# --- 1. nothing the run reads is written ----------------------------------------------------


@pytest.mark.parametrize("command", ["run", "check", "plan"])
@pytest.mark.parametrize("flag", ["--json", "--csv", "--trace", "--save-outputs"])
def test_an_output_naming_the_shipped_model_by_name_is_refused_and_the_model_kept(command, flag, capsys):
    shipped = models_dir() / "lenet86.onnx"
    before = shipped.read_bytes()
    argv = [command, "lenet86", flag, str(shipped), "--device", "cpu", "--batch", "2"]
    known = {"run": ("--json", "--csv", "--trace", "--save-outputs"), "check": ("--json", "--save-outputs"), "plan": ("--json",)}
    if flag not in known[command]:
        with pytest.raises(SystemExit):  # argparse: the command has no such flag
            main(argv)
        return
    assert main(argv) == 2
    one_line_error(capsys, f"{flag} {shipped} is the same file as the model, which the command reads")
    assert shipped.read_bytes() == before


def test_outputs_are_compared_by_inode_kernel_sources_inputs_and_external_data(tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save_model(tiny_cnn(), str(folder / "tiny.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="tiny.weights", size_threshold=0)
    kernel = tmp_path / "k.cu"
    assert main(["new", "conv", str(kernel)]) == 0
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones((2, 3, 12, 12), np.float32))
    (tmp_path / "hard.json").hardlink_to(folder / "tiny.weights")
    (tmp_path / "link.csv").symlink_to(kernel)
    capsys.readouterr()
    before = snapshot(tmp_path)
    model = str(folder / "tiny.onnx")
    cases = [
        (["run", model, "--json", str(folder / "tiny.weights")], "is the same file as external data of the model (tiny.weights)"),
        (["check", model, "--json", str(tmp_path / "hard.json")], "is the same file as external data of the model"),
        (["run", "lenet86", "--kernel", f"Conv={kernel}", "--csv", str(tmp_path / "link.csv")], "is the same file as a --kernel source"),
        (["run", model, "--load-inputs", str(inputs), "--save-outputs", str(inputs)], "is the same file as the --load-inputs file"),
    ]
    for argv, message in cases:
        assert main([*argv, "--device", "cpu"]) == 2, argv
        one_line_error(capsys, message)
    assert snapshot(tmp_path) == before


def test_external_data_files_are_read_from_the_models_header(tmp_path):
    from opplugin.cli.file_guard import external_data_files

    onnx.save_model(tiny_cnn(), str(tmp_path / "outside.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    onnx.save_model(tiny_cnn(), str(tmp_path / "inline.onnx"))
    assert external_data_files(tmp_path / "outside.onnx") == ["w.bin"]
    assert external_data_files(tmp_path / "inline.onnx") == []


def test_an_output_beside_the_model_that_is_not_its_data_is_written(tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save_model(tiny_cnn(), str(folder / "tiny.onnx"), save_as_external_data=True, location="tiny.weights", size_threshold=0)
    report = folder / "plan.json"
    report.write_text("old")
    assert main(["plan", str(folder / "tiny.onnx"), "--json", str(report), "--device", "cpu"]) == 0
    assert json.loads(report.read_text())["model"] == "tiny"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_model_is_one_line(tmp_path, tiny_model_path, capsys):
    os.chmod(tiny_model_path, 0)
    try:
        assert main(["plan", tiny_model_path, "--device", "cpu"]) == 2
    finally:
        os.chmod(tiny_model_path, 0o644)
    one_line_error(capsys, f"{tiny_model_path} (the model): cannot read it (Permission denied)")


def test_a_model_the_user_cannot_read_is_one_line_as_root_too(tiny_model_path, monkeypatch, capsys):
    import builtins

    real_open = builtins.open

    def refusing(path, *args, **kwargs):  # what open() does for a file without read permission
        if os.path.realpath(str(path)) == os.path.realpath(tiny_model_path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)
    for command in ("plan", "run", "check"):
        assert main([command, tiny_model_path, "--device", "cpu"]) == 2
        one_line_error(capsys, f"{tiny_model_path} (the model): cannot read it (Permission denied)")


# --- 1b. links, pipes and folders -------------------------------------------------------------


def test_every_output_is_written_through_a_link_and_the_link_kept(tmp_path, capsys):
    outputs = {"--json": "r.json", "--csv": "r.csv", "--trace": "r.trace.json", "--save-outputs": "r.npz"}
    real = tmp_path / "real"
    real.mkdir()
    argv = ["run", "lenet86", "--device", "cpu", "--batch", "2"]
    for flag, name in outputs.items():
        (real / name).write_text("old")
        (tmp_path / name).symlink_to(real / name)
        argv += [flag, str(tmp_path / name)]
    assert main(argv) == 0
    for name in outputs.values():
        assert (tmp_path / name).is_symlink() and os.readlink(tmp_path / name) == str(real / name)
        assert (real / name).read_bytes() != b"old"
    assert json.loads((real / "r.json").read_text())["model"] == "lenet86"
    assert np.load(real / "r.npz").files  # a whole .npz
    assert sorted(p.name for p in real.iterdir()) == sorted(outputs.values())  # no temporary file left


def test_an_output_linked_to_the_model_or_an_ops_file_is_refused(tmp_path, tiny_model_path, capsys):
    ops = tmp_path / "ops.py"
    ops.write_text("")  # no declaration: the guard refuses before it is read
    (tmp_path / "model_link.json").symlink_to(tiny_model_path)
    (tmp_path / "ops_link.json").symlink_to(ops)
    before = snapshot(tmp_path)
    cases = [
        (["plan", tiny_model_path, "--json", str(tmp_path / "model_link.json")], "is the same file as the model"),
        (["run", tiny_model_path, "--ops", str(ops), "--csv", str(tmp_path / "ops_link.json")], "is the same file as an --ops file"),
        (["check", tiny_model_path, "--ops", str(ops), "--json", str(ops)], "is the same file as an --ops file"),
        (["plan", tiny_model_path, "--ops", str(ops), "--json", str(ops)], "is the same file as an --ops file"),
    ]
    for argv, message in cases:
        assert main([*argv, "--device", "cpu"]) == 2, argv
        one_line_error(capsys, message)
    assert snapshot(tmp_path) == before and (tmp_path / "model_link.json").is_symlink()


@pytest.mark.parametrize("flag", ["model", "--kernel", "--ops"])
def test_a_pipe_where_a_file_is_read_is_one_line_not_a_wait(flag, tmp_path):
    # a FIFO blocks whoever opens it until a writer comes: the command must refuse it without opening it
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    argv = {"model": [str(pipe)], "--kernel": ["lenet86", "--kernel", f"Conv={pipe}"],
            "--ops": ["lenet86", "--ops", str(pipe)]}[flag]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "opplugin", "plan", *argv, "--device", "cpu"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    what = {"model": "the model", "--kernel": "a --kernel source", "--ops": "an --ops file"}[flag]
    assert done.stderr == f"opplugin: error: {pipe} ({what}) is not a regular file (a pipe, socket or device); give a file\n"


@pytest.mark.parametrize("flag", ["model", "--kernel"])
def test_a_folder_where_a_file_is_read_is_one_line(flag, tmp_path, capsys):
    folder = tmp_path / "folder.onnx"
    folder.mkdir()
    argv = [str(folder)] if flag == "model" else ["lenet86", "--kernel", f"Conv={folder}"]
    assert main(["plan", *argv, "--device", "cpu"]) == 2
    one_line_error(capsys, f"{folder} ({'the model' if flag == 'model' else 'a --kernel source'}) is a folder; give a file")


# --- 2. the table's other rows --------------------------------------------------------------


def no_input_model() -> onnx.ModelProto:
    c = numpy_helper.from_array(np.ones((1, 4), np.float32), "c")
    graph = helper.make_graph([helper.make_node("Relu", ["c"], ["y"], name="relu")], "constant_only", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[c])
    return finish(graph)


def dynamic_spatial_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 4, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "dynamic",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "OH", "OW"])], initializer=[w])
    return finish(graph)


@pytest.mark.parametrize("command", ["run", "check", "plan"])
def test_a_model_with_no_graph_inputs_is_one_line(command, tmp_path, capsys):
    path = save(no_input_model(), tmp_path / "constant_only.onnx")
    assert main([command, path, "--device", "cpu"]) == 2
    one_line_error(capsys, "constant_only has no graph inputs")


@pytest.mark.parametrize("command", ["run", "check", "plan"])
def test_free_spatial_sizes_need_input_shape_and_run_with_it(command, tmp_path, capsys):
    path = save(dynamic_spatial_model(), tmp_path / "dynamic.onnx")
    assert main([command, path, "--device", "cpu", "--batch", "2"]) == 2
    one_line_error(capsys, "input 'x' is ?x4x?x?: only the batch axis may be free; give the others with --input-shape x:Nx4xHxH")
    assert main([command, path, "--device", "cpu", "--batch", "2", "--input-shape", "x:Nx4x9x7"]) == 0
    out = capsys.readouterr().out
    assert ("[2, 4, 9, 7]" in out) if command == "plan" else ("PASS" in out)


def test_loaded_inputs_give_the_free_sizes(tmp_path, capsys):
    path = save(dynamic_spatial_model(), tmp_path / "dynamic.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((2, 4, 9, 7), dtype=np.float32))
    assert main(["check", path, "--device", "cpu", "--load-inputs", str(tmp_path / "x.npy")]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("shape, message", [
    ("x:Nx3x9x9", "fixes axis 1 of 'x' at 4"),
    ("x:Nx4x9", "has rank 3"),
    ("z:Nx4x9x9", "has no input 'z'"),
    ("x:Nx4x0x9", "each dimension is a positive whole number"),
    ("x", "--input-shape takes NAME:DIMS"),
])
def test_a_conflicting_input_shape_is_one_line(shape, message, tmp_path, capsys):
    path = save(dynamic_spatial_model(), tmp_path / "dynamic.onnx")
    assert main(["run", path, "--device", "cpu", "--input-shape", shape]) == 2
    one_line_error(capsys, message)


def test_a_number_at_the_batch_axis_fixes_the_batch(tmp_path, capsys):
    path = save(dynamic_spatial_model(), tmp_path / "dynamic.onnx")
    assert main(["plan", path, "--device", "cpu", "--input-shape", "x:3x4x8x8"]) == 0
    assert "batch 3" in capsys.readouterr().out
    assert main(["run", path, "--device", "cpu", "--input-shape", "x:3x4x8x8", "--batch", "2"]) == 2
    one_line_error(capsys, "has a fixed batch of 3")


def test_plan_refuses_an_unknown_variant_as_run_does(capsys):
    for command in ("run", "plan", "check"):
        assert main([command, "lenet86", "--variant", "foo", "--device", "cpu", "--batch", "2"]) == 2
        one_line_error(capsys, "unknown Conv variant 'foo'")


@pytest.mark.parametrize("where", ["/proc/my_conv.cu", "no/such/folder/my_conv.cu"])
def test_new_into_a_folder_it_cannot_write_is_one_line(where, capsys):
    assert main(["new", "conv", where]) == 2
    one_line_error(capsys, where)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_new_into_a_read_only_folder_is_one_line(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert main(["new", "conv", str(locked / "k.cu")]) == 2
    finally:
        locked.chmod(0o755)
    one_line_error(capsys, "cannot create a file in")
    assert list(locked.iterdir()) == []


def test_new_over_a_folder_with_force_is_one_line(tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    assert main(["new", "conv", str(tmp_path / "sub"), "--force"]) == 2
    one_line_error(capsys, "is a folder")
    assert list((tmp_path / "sub").iterdir()) == []


@needs_nvrtc
@pytest.mark.parametrize("command", ["plan", "run", "check"])
def test_a_grid_naming_no_macro_is_reported_at_its_line(command, tmp_path, capsys):
    kernel = tmp_path / "k.cu"
    assert main(["new", "conv", str(kernel)]) == 0
    text = kernel.read_text()
    assert STARTER_EDIT in text
    kernel.write_text(text.replace(STARTER_EDIT, STARTER_EDIT + "\n// opplugin: grid=cdiv(bogus, 2)"))
    capsys.readouterr()
    assert main([command, "lenet86", "--kernel", f"Conv={kernel}", "--device", "cpu", "--batch", "2"]) == 2
    line = kernel.read_text().splitlines().index("// opplugin: grid=cdiv(bogus, 2)") + 1
    _, err = capsys.readouterr()
    assert err.strip() == f"{kernel}:{line}: the grid expression 'cdiv(bogus, 2)' names bogus, which is not a macro of this node"


@needs_nvrtc
@pytest.mark.parametrize("command", ["run", "check"])
def test_run_and_check_compile_the_kernel_without_a_gpu(command, tmp_path, capsys):
    kernel = tmp_path / "broken.cu"
    assert main(["new", "conv", str(kernel)]) == 0
    kernel.write_text(kernel.read_text().replace("acc += b[m];", "acc += b[m] + oops;"))
    capsys.readouterr()
    assert main([command, "lenet86", "--kernel", f"Conv={kernel}", "--device", "cpu", "--batch", "2"]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines()[0].startswith(f"{kernel}:") and 'identifier "oops" is undefined' in err.splitlines()[0]
    assert "PASS" not in out and "Traceback" not in err


def test_cuda_graphs_typed_on_a_cpu_device_is_one_line_and_the_default_is_silent(capsys):
    assert main(["run", "lenet86", "--device", "cpu", "--batch", "2", "--cuda-graphs"]) == 2
    one_line_error(capsys, "--cuda-graphs needs a CUDA device")
    assert main(["run", "lenet86", "--device", "cpu", "--batch", "2"]) == 0
    assert "graph" not in capsys.readouterr().err.lower()


def cli(*argv: str, cwd: Path, **options) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "opplugin", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, **options)


@pytest.mark.parametrize("argv", [
    ["check", "lenet86", "--batch", "50", "--device", "cpu"],
    ["plan", "lenet86", "--device", "cpu", "--json", "-"],
])
def test_a_closed_pipe_exits_quietly(argv, tmp_path):
    # `opplugin check ... | head -1` where head has gone before the first line: the reading end is
    # closed before the command starts, so its first write meets the closed pipe every time
    reading, writing = os.pipe()
    os.close(reading)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([sys.executable, "-m", "opplugin", *argv], cwd=tmp_path, env=env, stdout=writing,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(writing)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr and "Exception ignored" not in done.stderr
    assert list(tmp_path.iterdir()) == []


# --- 3. `-` is standard output --------------------------------------------------------------


def test_json_to_standard_output_sends_the_text_to_stderr(tmp_path):
    done = cli("plan", "lenet86", "--device", "cpu", "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"] == "opplugin-plan/7"
    assert "Plan for lenet86" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no file named -
    done = cli("run", "lenet86", "--device", "cpu", "--batch", "4", "--csv", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("step,kind,ops") and "Op Time:" in done.stderr and "Op Time:" not in done.stdout
    assert list(tmp_path.iterdir()) == []
    done = cli("check", "lenet86", "--device", "cpu", "--batch", "4", "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == "lenet86" and "PASS" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["run", "lenet86", "--json", "-", "--csv", "-"], "--json and --csv both name standard output"),
    (["run", "lenet86", "--save-outputs", "-"], "--save-outputs writes a binary file; give a file path, not -"),
    (["run", "lenet86", "--trace", "-"], "--trace writes a binary file"),
])
def test_standard_output_once_and_for_text_only(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    one_line_error(capsys, message)
    assert list(tmp_path.iterdir()) == []


# --- 6. the plan's JSON names the user kernels ------------------------------------------------


@needs_nvrtc
def test_plan_json_carries_the_user_kernels(tmp_path, capsys):
    kernel = tmp_path / "my_conv.cu"
    assert main(["new", "conv", str(kernel)]) == 0
    report = tmp_path / "plan.json"
    assert main(["plan", "lenet86", "--device", "cpu", "--kernel", f"Conv={kernel}", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    uses = json.loads(report.read_text())["user_kernels"]
    assert [(u["step"], u["kernel"], u["status"], u["fused"], u["fused_by_kernel"]) for u in uses] == [
        ("conv1", "my_conv.cu", "compiled", ["Relu", "MaxPool"], False),
        ("conv2", "my_conv.cu", "compiled", ["Relu", "MaxPool"], False),
    ]
    assert all(f"{u['step']}: my_conv.cu; then Relu > MaxPool" in out for u in uses)
    assert main(["plan", "lenet86", "--device", "cpu", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["user_kernels"] == []
