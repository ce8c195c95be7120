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
    monkeypatch.setattr(tune, "evaluate_config", lambda problem, config, warmup, repeat: Trial(config.name(), "ok", ms=1.0, rel_error=1e-8))
    from opplugin.ops.conv.tuning_cache import TuningCacheWarning

    with pytest.warns(TuningCacheWarning, match="Not a directory"):  # reading it first, to keep other entries
        assert main(["tune", "lenet86", "--batch", "16"]) == 0
    out = capsys.readouterr().out
    assert "config" in out and "pass: rel L2 1.0e-08" in out
    assert f"Tuning cache NOT written: could not write {blocker / 'cache' / 'tuning.json'}" in out
    assert blocker.read_text() == ""
