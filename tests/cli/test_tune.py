"""opplugin tune, without a GPU to tune on: what it says when its cache cannot be written."""
import pytest

from opplugin.cli import main


def test_tune_that_cannot_write_its_cache_says_so_and_keeps_its_table(monkeypatch, tmp_path, capsys):
    from opplugin.gpu.device import Device
    from opplugin.lab import tune
    from opplugin.lab.trial import Trial

    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("OPPLUGIN_CACHE_DIR", str(blocker / "cache"))  # under a file: mkdir fails
    monkeypatch.setattr(tune, "cuda_device", lambda device: Device("cuda", "Test GPU", "9.0"))
    monkeypatch.setattr(tune, "make_problem", lambda spec, weights, epilogue: None)
    monkeypatch.setattr(tune, "evaluate_config", lambda problem, config, warmup, repeat, precision="fp32": Trial(config.name(), "ok", ms=1.0, rel_error=1e-8))
    from opplugin.ops.conv.tuning_cache import TuningCacheWarning

    with pytest.warns(TuningCacheWarning, match="Not a directory"):  # reading it first, to keep other entries
        assert main(["tune", "lenet86", "--batch", "16"]) == 0
    out = capsys.readouterr().out
    assert "config" in out and "pass: rel L2 1.0e-08" in out
    assert f"Tuning cache NOT written: could not write {blocker / 'cache' / 'tuning.json'}" in out
    assert blocker.read_text() == ""


def tune_options(*argv: str):
    from opplugin.cli.commands import build_parser
    from opplugin.cli.tune import read

    return read(build_parser(["tune"]).parse_args(["tune", *argv]))


def test_tune_takes_a_16_bit_precision_and_fp32_by_default():
    assert tune_options().precision == "fp32"
    assert tune_options("--precision", "fp16").precision == "fp16"
    assert tune_options("--precision", "bf16").precision == "bf16"


@pytest.mark.parametrize("precision, message", [
    ("fp8", "tune --precision 'fp8': one of fp32, fp16, bf16"),
    ("tf32", "tune --precision tf32: not tuned; a Conv under --precision tf32 runs FP32-exact (3xTF32)"),
    ("mixed", "tune --precision mixed: not tuned; a mixed run reads fp16's cache entries"),
])
def test_a_precision_tune_does_not_take_is_one_line_and_exit_2(precision, message, capsys):
    from opplugin.errors import InputError

    with pytest.raises(InputError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        tune_options("--precision", precision)
    assert main(["tune", "lenet86", "--precision", precision]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"opplugin: error: {message}") and len(err.splitlines()) == 1
