"""The command line, as a user runs it: output, files, exit status, one-line errors."""
import json
import os
import stat
import subprocess
import sys

import pytest

from opplugin.cli import commands as cli
from opplugin.gpu import cuda
from opplugin.cli import main
from opplugin.runtime import Runner


def test_run_on_a_shipped_model_prints_the_report(tmp_path, capsys):
    code = main(["run", "lenet86", "--batch", "40", "--repeat", "2", "--warmup", "1", "--device", "cpu",
                 "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")])
    out, err = capsys.readouterr()
    assert code == 0
    assert "numpy reference backend" in err
    assert out.count("Op Time:") == 5  # conv1, conv2, the Flatten view, fc1, fc2
    assert "Test Accuracy:" in out
    assert "Against onnxruntime CPU: PASS" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["batch"] == 40 and data["model"] == "lenet86" and 0 <= data["accuracy"] <= 1
    assert data["agreement"]["passed"] and data["agreement"]["top1_agreement"] == 1.0
    assert (tmp_path / "r.csv").read_text().startswith("step,kind,ops")


def test_check_passes_on_the_cpu(capsys):
    assert main(["check", "ece408_high", "--batch", "50", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "Test Accuracy:" in out and "Top-1 agreement with onnxruntime: 1.0000" in out


def test_check_at_zero_tolerance_differs_from_onnxruntime_and_float64_arbitrates(tiny_model_path, capsys):
    # at zero tolerance the reference and onnxruntime's Conv round differently somewhere; re-run
    # alone, each such step is within its op's FP32 bound of float64, so the check passes and says so
    # (a wrong kernel still exits 1: tests/verify/test_first_bad.py, user_kernels/test_plugin.py)
    assert main(["check", tiny_model_path, "--batch", "3", "--device", "cpu", "--atol", "0", "--rtol", "0"]) == 0
    out = capsys.readouterr().out
    assert "pass*" in out and "passed by float64 arbitration (*)" in out and "PASS at atol 0, rtol 0" in out


def test_plan_command(tiny_model_path, capsys):
    assert main(["plan", tiny_model_path, "--device", "cpu"]) == 0
    assert "conv1" in capsys.readouterr().out


# Bad flags and output paths: each is refused before the model is even loaded.
FLAG_ERRORS = [
    (["run", "lenet86", "--batch", "2", "--repeat", "0", "--warmup", "-1"], "--repeat must be a positive integer, got 0"),
    (["run", "lenet86", "--batch", "2", "--repeat", "3", "--warmup", "-1"], "--warmup must be a non-negative integer, got -1"),
    (["plan", "lenet86", "--batch", "-2"], "--batch must be a positive integer, got -2"),
    (["check", "lenet86", "--batch", "0"], "--batch must be a positive integer, got 0"),
    (["check", "lenet86", "--chunk", "-1"], "--chunk must be a positive integer, got -1"),
    (["plan", "lenet86", "--streams", "0"], "--streams must be a positive integer, got 0"),
    (["tune", "lenet86", "--batch", "0"], "--batch must be a positive integer, got 0"),
    (["bench", "--warmup", "-1"], "--warmup must be a non-negative integer, got -1"),
    (["bench", "--repeat", "0"], "--repeat must be a positive integer, got 0"),
    (["check", "lenet86", "--atol", "-1"], "--atol must be a finite number of at least 0, got -1"),
    (["check", "lenet86", "--rtol", "nan"], "--rtol must be a finite number of at least 0, got nan"),
    (["check", "lenet86", "--atol", "inf"], "--atol must be a finite number of at least 0, got inf"),
    (["run", "lenet86", "--json", "."], "--json . is a folder; give a file path"),
    (["check", "lenet86", "--json", "/"], "--json / is a folder"),
    (["run", "lenet86", "--csv", ""], "--csv needs a file path, got an empty one"),
    (["run", "lenet86", "--json", "/proc/opplugin.json"], "--json /proc/opplugin.json: cannot create a file in /proc"),
    (["run", "lenet86", "--csv", "no/such/folder/r.csv"], "--csv no/such/folder/r.csv: folder no/such/folder does not exist"),
    (["run", "lenet86", "--json", "/dev/null"], "--json /dev/null is not a regular file"),
    (["run", "lenet86", "--json", "r.json", "--csv", "./r.json"], "--csv ./r.json is the same file as --json"),
    (["bench", "--json", "/proc/bench.json"], "--json /proc/bench.json: cannot create a file in /proc"),
]


@pytest.mark.parametrize(
    "argv, message",
    [
        *FLAG_ERRORS,
        (["run", "missing.onnx"], "model file not found"),
        (["run", "lenet86", "--batch", "0", "--device", "cpu"], "--batch must be a positive integer, got 0"),
        (["run", "lenet86", "--batch", "-5", "--device", "cpu"], "--batch must be a positive integer, got -5"),
        (["run", "lenet86", "--batch", "2", "--chunk", "0", "--device", "cpu"], "--chunk must be a positive integer, got 0"),
        (["run", "lenet86", "--batch", "2", "--streams", "0", "--device", "cpu"], "--streams must be a positive integer, got 0"),
        (["run", "lenet86", "--batch", "2", "--repeat", "0", "--device", "cpu"], "--repeat must be a positive integer, got 0"),
        (["run", "lenet86", "--batch", "2", "--warmup", "-1", "--device", "cpu"], "--warmup must be a non-negative integer, got -1"),
        (["run", "lenet86", "--batch", "20000", "--device", "cpu"], "bundled test set has 10000"),
        (["run", "lenet86", "--batch", "100000000000000", "--data", "random", "--device", "cpu"], "out of memory"),
        (["run", "lenet86", "--variant", "warp9", "--device", "cpu", "--batch", "2"], "unknown Conv variant 'warp9'"),
        (["run", "lenet86", "--variant", "const_mo_m8", "--device", "cpu", "--batch", "2"], "needs a CUDA device"),
        (["run", "lenet86", "--data", "imagenet", "--device", "cpu", "--batch", "2"], "unknown data source"),
        (["check", "lenet86", "--batch", "2", "--variant", "nope", "--device", "cpu"], "unknown Conv variant 'nope'"),
        (["check", "lenet86", "--batch", "2", "--variant", "const_tile", "--device", "cpu"], "needs a CUDA device"),
        (["check", "lenet86", "--batch", "2", "--device", "cpu", "--check-chunk", "0"], "--check-chunk must be a positive integer, got 0"),
        (["plan", "lenet86", "--batch", "0", "--device", "cpu"], "--batch must be a positive integer, got 0"),
        (["check", "lenet86", "--batch", "2", "--device", "cpu", "--repeat", "1"], None),
    ],
)
def test_bad_requests_give_one_line_errors(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative output paths land here: nothing may be left behind
    if message is None:  # argparse's own usage error
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        return
    assert main(argv) == 2
    out, err = capsys.readouterr()
    err = err.strip()
    assert err.startswith("opplugin: error:") and message in err and "\n" not in err and "Traceback" not in err
    assert out == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", FLAG_ERRORS)
def test_bad_flags_are_refused_before_any_work(argv, message, monkeypatch, capsys, tmp_path):
    import opplugin.graph.model

    def no_work(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(opplugin.graph.model, "load_model", no_work)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_output_path_given_twice_or_naming_the_model_clobbers_nothing(tmp_path, tiny_model_path, capsys):
    report = tmp_path / "r.json"
    report.write_text("old")
    model_bytes = open(tiny_model_path, "rb").read()
    assert main(["run", "lenet86", "--json", str(report), "--csv", f"{tmp_path}/./r.json"]) == 2
    assert main(["run", tiny_model_path, "--csv", tiny_model_path]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("is the same file as --json; give each output its own file")
    assert err[1] == f"opplugin: error: --csv {tiny_model_path} is the same file as the model, which the command reads; give the output another path"
    assert report.read_text() == "old" and open(tiny_model_path, "rb").read() == model_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "tiny.onnx"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_a_folder_without_write_permission_is_refused(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert main(["run", "lenet86", "--json", str(locked / "r.json")]) == 2
    finally:
        locked.chmod(0o755)
    assert f"cannot create a file in {locked} (Permission denied)" in capsys.readouterr().err
    assert list(locked.iterdir()) == []


def test_report_files_follow_the_umask(tmp_path, capsys):
    old = os.umask(0o027)
    try:
        assert main(["run", "ece408_high", "--batch", "2", "--repeat", "1", "--device", "cpu",
                     "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "r.csv").stat().st_mode) == 0o640


def test_asking_for_cuda_without_a_device_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    assert main(["run", "lenet86", "--batch", "2", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("opplugin: error: --device cuda was asked for, but no CUDA device is usable "
                   "(is CuPy installed and a GPU visible?)")


def test_plan_of_a_file_that_is_not_onnx_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "notes.onnx"
    bad.write_text("these are notes, not a model")
    assert main(["plan", str(bad), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"opplugin: error: {bad} is not an ONNX model") and "\n" not in err


def test_an_interrupt_exits_130_and_says_so(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Runner, "profile", interrupted)
    assert main(["run", "lenet86", "--batch", "2", "--device", "cpu"]) == 130
    err = capsys.readouterr().err
    assert err.strip().endswith("opplugin: interrupted") and "Traceback" not in err


def test_tune_that_cannot_write_its_cache_says_so_and_keeps_its_table(monkeypatch, tmp_path, capsys):
    from opplugin.gpu.device import Device
    from opplugin.lab import tune
    from opplugin.lab.trial import Trial

    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("OPPLUGIN_CACHE_DIR", str(blocker / "cache"))  # under a file: mkdir fails
    monkeypatch.setattr(tune, "cuda_device", lambda device: Device("cuda", "Test GPU", "9.0"))
    monkeypatch.setattr(tune, "make_problem", lambda spec, weights, epilogue: None)
    monkeypatch.setattr(tune, "evaluate_config", lambda problem, config, warmup, repeat: Trial(config.name(), "ok", ms=1.0, rel_error=1e-8))
    from opplugin.ops.conv.tuning_cache import TuningCacheWarning

    with pytest.warns(TuningCacheWarning, match="Not a directory"):  # reading it first, to keep other entries
        assert main(["tune", "lenet86", "--batch", "16"]) == 0
    out = capsys.readouterr().out
    assert "config" in out and "pass: rel L2 1.0e-08" in out
    assert f"Tuning cache NOT written: could not write {blocker / 'cache' / 'tuning.json'}" in out
    assert blocker.read_text() == ""


def test_console_entry_point_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "opplugin", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("opplugin ")


def test_check_on_any_model_uses_seeded_random_inputs(tmp_path, capsys):
    from onnx_builders import save, single_conv

    path = save(single_conv((1, 2, 7, 7), (3, 2, 3, 3), {"dilations": [2, 1]}, bias=False, weights_as_input=True),
                tmp_path / "conv.onnx")
    assert main(["check", path, "--batch", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "random uniform" in out and "PASS" in out


def test_run_any_batch_of_random_data_in_chunks_with_progress_in_the_log(tiny_model_path, tmp_path, capsys):
    code = main(["run", tiny_model_path, "--batch", "30000", "--data", "random", "--device", "cpu", "--repeat", "1",
                 "--chunk", "400", "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["batch"] == 30000 and data["chunks"] == 75 and data["images_per_s"] > 0
    assert data["agreement"]["passed"]
    assert "Host to host:" in out and "images/s" in out
    # stderr is not a terminal here: a plain line per quarter, no carriage returns
    assert _progress_shares(err) == ["25%", "50%", "76%", "100%"]
    assert "\r" not in err


def _progress_shares(err: str) -> list[str]:
    """The shares of the plain progress lines in `err`, each checked against the image count beside it."""
    shares = []
    for line in err.splitlines():
        if line.startswith("progress:"):
            share, counts = line.split()[1:3]
            done, total = (int(n.replace(",", "")) for n in counts.strip("(").split("/"))
            assert share == f"{100 * done // total}%", line
            shares.append(share)
    return shares


def test_a_short_run_prints_no_progress(capsys):
    assert main(["run", "ece408_high", "--batch", "20", "--device", "cpu", "--repeat", "1", "--no-compare"]) == 0
    assert "progress" not in capsys.readouterr().err


def test_check_of_a_large_batch_is_compared_in_passes_with_progress(tiny_model_path, tmp_path, capsys):
    code = main(["check", tiny_model_path, "--batch", "30", "--data", "random", "--device", "cpu",
                 "--check-chunk", "7", "--json", str(tmp_path / "c.json")])
    out, err = capsys.readouterr()
    assert code == 0 and "PASS" in out
    assert "Compared in 5 passes of up to 7 images" in out
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["passed"] and data["check_chunks"] == 5 and data["check_chunk_size"] == 7
    assert all(r["elements"] > 0 for r in data["records"])
    # passes of 7 of 30 images: the lines come after passes 2 to 5, and say how far each got
    assert _progress_shares(err) == ["46%", "70%", "93%", "100%"]


def test_check_in_one_pass_prints_no_progress(capsys):
    assert main(["check", "ece408_high", "--batch", "20", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "passes" not in out and "progress" not in err


def _fixed_batch_model(tmp_path, batch: int) -> str:
    from onnx_builders import save, tiny_cnn

    proto = tiny_cnn()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch
    return save(proto, tmp_path / "fixed.onnx")


@pytest.mark.parametrize("command", ["run", "check", "plan"])
def test_a_fixed_batch_model_runs_at_its_batch_by_default(command, tmp_path, capsys):
    path = _fixed_batch_model(tmp_path, 3)
    assert main([command, path, "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "Batch 3: fixed's fixed batch" in err
    assert "batch 3" in out.splitlines()[0]


@pytest.mark.parametrize("command", ["run", "check", "plan"])
def test_a_fixed_batch_model_asked_for_another_batch_is_a_one_line_error(command, tmp_path, capsys):
    path = _fixed_batch_model(tmp_path, 1)
    assert main([command, path, "--device", "cpu", "--batch", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("opplugin: error: --batch 4: fixed has a fixed batch of 1 (input 'x' is [1, 3, 12, 12]); "
                   "leave --batch out or give 1")


def test_a_model_with_a_free_batch_gets_a_small_default_and_says_so(tiny_model_path, tmp_path, capsys):
    assert main(["run", tiny_model_path, "--device", "cpu", "--json", str(tmp_path / "r.json")]) == 0
    out, err = capsys.readouterr()
    assert "Batch 8: the default for a model with a free batch (--batch N to choose)" in err
    assert out.splitlines()[0].startswith("opplugin ") and ": tiny, batch 8, on CPU" in out.splitlines()[0]
    assert json.loads((tmp_path / "r.json").read_text())["batch"] == 8


def test_shipped_models_keep_the_whole_test_set_as_their_default(monkeypatch, capsys):
    seen = {}

    def stop(self, model, batch, *args, **kwargs):
        seen["batch"] = batch
        raise KeyboardInterrupt  # enough: the batch is chosen

    monkeypatch.setattr(Runner, "__init__", stop)
    assert main(["check", "lenet86", "--device", "cpu"]) == 130
    assert seen["batch"] == 10000 and "Batch" not in capsys.readouterr().err


@pytest.mark.parametrize("where", ["another folder", "the model's folder"])
def test_a_model_with_external_data_runs_from_any_working_directory(where, tmp_path, monkeypatch, capsys):
    import onnx
    from onnx_builders import tiny_cnn

    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save_model(tiny_cnn(), str(folder / "tiny.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="tiny.weights", size_threshold=0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere if where == "another folder" else folder)
    path = str(folder / "tiny.onnx") if where == "another folder" else "tiny.onnx"
    assert main(["run", path, "--batch", "4", "--device", "cpu", "--repeat", "1"]) == 0
    assert "Against onnxruntime CPU: PASS" in capsys.readouterr().out
    assert main(["check", path, "--batch", "4", "--device", "cpu"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["plan", path, "--device", "cpu"]) == 0
    assert "conv1" in capsys.readouterr().out


def test_conv_weights_fed_as_graph_inputs_are_named_in_the_header(tmp_path, capsys):
    from onnx_builders import save, single_conv

    path = save(single_conv(("N", 2, 7, 7), (3, 2, 3, 3), {}, bias=True, weights_as_input=True), tmp_path / "conv.onnx")
    assert main(["check", path, "--batch", "2", "--device", "cpu"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("; Conv weights w, b are graph inputs, filled with random data too")
    assert main(["run", path, "--batch", "2", "--device", "cpu", "--repeat", "1"]) == 0
    assert "Conv weights w, b are graph inputs: this run fills them with random data" in capsys.readouterr().err


def test_unnamed_nodes_show_as_op_type_and_index(tmp_path, capsys):
    from onnx_builders import save, tiny_cnn

    proto = tiny_cnn()
    for node in proto.graph.node:
        node.name = ""
    assert main(["plan", save(proto, tmp_path / "tiny.onnx"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Conv_0" in out and "Conv_3" in out


def test_any_integer_seed_is_accepted(tiny_model_path, capsys):
    assert main(["check", tiny_model_path, "--batch", "2", "--device", "cpu", "--seed", "-7"]) == 0
    assert "random uniform [0, 1), seed -7" in capsys.readouterr().out


def test_run_exits_1_when_its_comparison_fails(monkeypatch, capsys):
    import opplugin.verify.check

    def failed(plan, feeds, ours):
        return {"passed": False, "top1_agreement": 0.5, "max_abs_error": 1.0, "rel_l2": 1.0}

    monkeypatch.setattr(opplugin.verify.check, "agreement", failed)
    assert main(["run", "ece408_high", "--batch", "2", "--device", "cpu", "--repeat", "1"]) == 1
    assert "Against onnxruntime CPU: FAIL" in capsys.readouterr().out
    assert main(["run", "ece408_high", "--batch", "2", "--device", "cpu", "--repeat", "1", "--no-compare"]) == 0


def test_an_unforeseen_error_exits_3_with_its_traceback_not_1(monkeypatch, capsys):
    # 1 means a failed comparison to scripts; a bug must not look like one
    def broken(args):
        raise RuntimeError("something opplugin did not foresee")

    monkeypatch.setitem(cli.COMMANDS, "plan", broken)
    assert main(["plan", "lenet86", "--device", "cpu"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: something opplugin did not foresee" in err
    assert err.strip().splitlines()[-1].startswith("opplugin: internal error")
