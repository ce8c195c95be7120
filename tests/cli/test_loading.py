"""The model a command loads: the batch it runs when none is asked for, and its external
data read from beside it, whatever the working directory."""
import json

import pytest

from opplugin.cli import main
from opplugin.runtime import Runner


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


def test_streams_beyond_one_on_a_cpu_device_is_one_line(capsys):
    assert main(["check", "lenet86", "--device", "cpu", "--batch", "2", "--streams", "4"]) == 2
    err = capsys.readouterr().err
    assert err == ("opplugin: error: --streams 4 needs a CUDA device; here plugin steps run the numpy reference on the CPU, "
                   "one chunk at a time\n")
    assert main(["run", "lenet86", "--device", "cpu", "--batch", "2", "--streams", "1"]) == 0
