"""The command line's entry, as a user meets it: one-line errors and exit status 2 for bad
requests, before any work; 130 for an interrupt, 3 for a bug; `python -m opplugin`."""
import os
import subprocess
import sys

import pytest

from opplugin.cli import plan
from opplugin.gpu import cuda
from opplugin.cli import main
from opplugin.runtime import Runner


FLAG_ERRORS = [
    (["run", "lenet86", "--batch", "2", "--repeat", "0", "--warmup", "-1"], "--repeat must be a positive integer, got 0"),
    (["run", "lenet86", "--batch", "2", "--repeat", "3", "--warmup", "-1"], "--warmup must be a non-negative integer, got -1"),
    (["plan", "lenet86", "--batch", "-2"], "--batch must be a positive integer, got -2"),
    (["check", "lenet86", "--batch", "0"], "--batch must be a positive integer, got 0"),
    (["check", "lenet86", "--chunk", "-1"], "--chunk must be a positive integer, got -1"),
    (["check", "lenet86", "--streams", "0"], "--streams must be a positive integer, got 0"),
    (["run", "lenet86", "--rtol", "-1"], "--rtol must be a finite number of at least 0, got -1"),
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
    from opplugin.cli import bench, loading

    def no_work(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(loading, "load_model", no_work)
    monkeypatch.setattr(bench, "load_model", no_work)
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


# Ctrl-C stands in as a KeyboardInterrupt raised by the first import of the module named, in a
# fresh interpreter started as the `opplugin` console script starts: `from opplugin.cli import main`
INTERRUPT_AT_IMPORT = """
import builtins, sys
real = builtins.__import__
def interrupting(name, *args, **kwargs):
    if name == sys.argv[1]:
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = interrupting
from opplugin.cli import main
raise SystemExit(main(["plan", "lenet86"]))
"""


@pytest.mark.parametrize("module", ["numpy", "argparse", "onnx"])
def test_an_interrupt_while_the_modules_load_exits_130_and_says_so(module):
    done = subprocess.run([sys.executable, "-c", INTERRUPT_AT_IMPORT, module], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    assert (done.returncode, done.stderr) == (130, "opplugin: interrupted\n")


def test_an_interrupt_exits_130_and_says_so(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Runner, "profile", interrupted)
    assert main(["run", "lenet86", "--batch", "2", "--device", "cpu"]) == 130
    err = capsys.readouterr().err
    assert err.strip().endswith("opplugin: interrupted") and "Traceback" not in err


def test_console_entry_point_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "opplugin", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("opplugin ")


def test_an_unforeseen_error_exits_3_with_its_traceback_not_1(monkeypatch, capsys):
    # 1 means a failed comparison to scripts; a bug must not look like one
    def broken(options):
        raise RuntimeError("something opplugin did not foresee")

    monkeypatch.setattr(plan, "execute", broken)
    assert main(["plan", "lenet86", "--device", "cpu"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: something opplugin did not foresee" in err
    assert err.strip().splitlines()[-1].startswith("opplugin: internal error")


@pytest.mark.parametrize("argv, absent", [
    (["--help"], ("opplugin.lab", "opplugin.graph", "opplugin.runtime", "onnxruntime")),
    (["run", "--help"], ("opplugin.lab", "opplugin.cli.bench")),
    (["plan", "--help"], ("opplugin.lab", "opplugin.cli.run")),
])
def test_a_command_starts_without_the_other_commands_imports(argv, absent):
    script = ("import sys\nfrom opplugin.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
              "print(' '.join(sys.modules))")
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True)
    loaded = done.stdout.splitlines()[-1].split()
    assert "opplugin.cli.commands" in loaded
    assert [m for m in loaded if m.split(".")[0] in absent or any(m == a or m.startswith(a + ".") for a in absent)] == []


@pytest.mark.parametrize("command", [["run", "lenet86", "--batch", "4"], ["check", "lenet86", "--batch", "4"], ["plan", "lenet86"]])
def test_a_stream_that_cannot_encode_unicode_gets_question_marks_not_a_traceback(command):
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, "-m", "opplugin", *command], env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode("ascii", "replace")[-800:]
    assert b"Traceback" not in done.stderr and max(done.stdout + done.stderr) < 128


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("command", [["run", "lenet86", "--batch", "4"], ["plan", "lenet86"]])
def test_a_full_device_under_standard_output_is_one_line_and_exit_2(command):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "opplugin", *command], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "opplugin: error: cannot write (standard output): No space left on device"


def test_a_closed_standard_output_still_runs_the_command_and_writes_its_files(tmp_path):
    report = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "opplugin", "run", "lenet86", "--batch", "4", "--json", str(report)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "standard output is closed: the report goes nowhere" in done.stderr and report.exists()


@pytest.mark.parametrize("argv, flag", [
    (["run", "lenet86", "--json", "a.json", "--json", "b.json"], "--json is given twice (a.json and b.json); give it once"),
    (["check", "lenet86", "--batch", "2", "--batch", "3"], "--batch is given twice (2 and 3); give it once"),
    (["bench", "--repeat", "3", "--repeat", "4"], "--repeat is given twice (3 and 4); give it once"),
])
def test_a_flag_of_one_value_given_twice_is_refused(argv, flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(flag)
    assert list(tmp_path.iterdir()) == []


def test_repeatable_flags_still_repeat():
    from opplugin.cli.commands import build_parser

    args = build_parser(["run"]).parse_args(["run", "--variant", "a=b", "--variant", "c=d", "--kernel", "Conv=k.cu"])
    assert args.variant == ["a=b", "c=d"] and args.kernel == ["Conv=k.cu"]
