"""`opplugin tune`, the tuning cache and the variant choice.

The CPU tests cover the cache (key, bucket, atomic write, corrupt or foreign
files, other versions), the choice (cache, else heuristic) and the tuning loop
with its GPU work replaced by a stand-in. The GPU tests tune real models and
check that the cache then drives the runner's kernels. Every test points the
cache at its own temporary directory.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings

import numpy as np
import pytest

import opplugin
from opplugin.cli import commands as cli
from opplugin.gpu import cuda
from opplugin.core import files, paths
from opplugin.ops.conv import tuning_cache
from opplugin.lab import tune as tuning
from opplugin.ops.conv.choice import tuning_key
from opplugin.lab.trial import EXACT_TOLERANCE, Trial, local_memory_bytes
from opplugin.errors import DeviceError, InputError
from opplugin.graph.model import load_model
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import choose_config, heuristic_config
from opplugin.ops.conv.plugin import constant_weights
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.gpu.device import Device
from onnx_builders import conv_spec

FAKE_GPU = Device("cuda", "Test GPU 80GB", "9.0")
LENET_CONV1 = conv_spec(10000, 1, 4, (86, 86), (7, 7))
RELU_POOL2 = Epilogue("Relu", (2, 2))



@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(directory))
    monkeypatch.setattr(tuning_cache, "_warned", set())
    return directory


def ones_weights(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32) if spec.has_bias else None


def a_choice(variant: str, ms: float = 1.0, batch: int = 10000) -> tuning_cache.Choice:
    return tuning_cache.Choice(variant, ms, batch, [{"variant": "other", "median_ms": ms * 2}], "2025-01-01T00:00:00+00:00")


# --- the key ----------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "bucket"), [(1, 1), (2, 2), (3, 4), (256, 256), (257, 512), (1134, 2048), (10000, 16384)])
def test_batch_bucket_is_the_power_of_two_at_or_above(batch, bucket):
    assert tuning_cache.batch_bucket(batch) == bucket


def test_batch_bucket_rejects_an_empty_batch():
    with pytest.raises(ValueError):
        tuning_cache.batch_bucket(0)


def test_key_ignores_the_batch_within_a_bucket_but_not_the_shape_or_epilogue():
    key = tuning_key(LENET_CONV1, RELU_POOL2, "GPU A", "1.0")
    assert key == tuning_key(dataclasses.replace(LENET_CONV1, batch=9000), RELU_POOL2, "GPU A", "1.0")
    assert key.bucket == 16384 and "GPU A" in key.text and "1.0" in key.text and "+relu+maxpool2" in key.text
    others = [
        tuning_key(dataclasses.replace(LENET_CONV1, batch=5000), RELU_POOL2, "GPU A", "1.0"),
        tuning_key(LENET_CONV1, NONE, "GPU A", "1.0"),
        tuning_key(dataclasses.replace(LENET_CONV1, pads=(1, 1, 1, 1)), RELU_POOL2, "GPU A", "1.0"),
        tuning_key(dataclasses.replace(LENET_CONV1, has_bias=False), RELU_POOL2, "GPU A", "1.0"),
        tuning_key(LENET_CONV1, RELU_POOL2, "GPU B", "1.0"),
        tuning_key(LENET_CONV1, RELU_POOL2, "GPU A", "1.1"),
    ]
    assert len({key.text, *(k.text for k in others)}) == 1 + len(others)


def test_key_takes_the_installed_version_by_default(monkeypatch):
    monkeypatch.setattr(opplugin, "__version__", "9.9.9")
    assert tuning_key(LENET_CONV1, NONE, "GPU").version == "9.9.9"


def test_cache_directory_follows_the_environment(tmp_path, monkeypatch):
    assert tuning_cache.cache_path() == tmp_path / "cache" / "tuning.json"
    monkeypatch.delenv(paths.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "xdg" / "opplugin"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "opplugin"


# --- the file ---------------------------------------------------------------------------


def test_store_then_lookup_round_trips_and_keeps_other_entries(cache_dir):
    first = tuning_key(LENET_CONV1, RELU_POOL2, "GPU A")
    second = tuning_key(LENET_CONV1, NONE, "GPU A")
    tuning_cache.store({first: a_choice("const_rb_t2x1_m4", 0.5)})
    path = tuning_cache.store({second: a_choice("const_mo_m4", 0.7)})
    assert path == cache_dir / "tuning.json"
    found = tuning_cache.lookup(first)
    assert (found.variant, found.median_ms, found.batch) == ("const_rb_t2x1_m4", 0.5, 10000)
    assert found.runners_up == [{"variant": "other", "median_ms": 1.0}] and found.date
    assert tuning_cache.lookup(second).variant == "const_mo_m4"
    data = json.loads(path.read_text())
    assert data["format"] == tuning_cache.FORMAT and len(data["entries"]) == 2


def test_write_is_atomic_and_leaves_no_temporary_file(cache_dir, monkeypatch):
    key = tuning_key(LENET_CONV1, RELU_POOL2, "GPU A")
    path = tuning_cache.store({key: a_choice("const_rb_t2x1_m4")})
    before = path.read_text()

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", failing_replace)
    with pytest.raises(OSError):
        tuning_cache.store({key: a_choice("const_rb_t16x1_m4")})
    assert path.read_text() == before  # the old file is whole
    assert os.listdir(cache_dir) == ["tuning.json"]


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2, 3]", json.dumps({"something": "else"}), json.dumps({"format": "opplugin-tuning-cache", "format_version": 99, "entries": {}}), "\xff\xfe"],
    ids=["corrupt", "list", "foreign", "future_format", "binary"],
)
def test_a_corrupt_or_foreign_file_is_empty_with_one_warning_then_replaced(cache_dir, content):
    cache_dir.mkdir()
    (cache_dir / "tuning.json").write_bytes(content.encode("latin-1"))
    key = tuning_key(LENET_CONV1, RELU_POOL2, "GPU A")
    with pytest.warns(tuning_cache.TuningCacheWarning, match="ignoring the tuning cache"):
        assert tuning_cache.lookup(key) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once already: silent now
        assert tuning_cache.lookup(key) is None
        assert choose_config(LENET_CONV1, ones_weights(LENET_CONV1), RELU_POOL2, FAKE_GPU) == heuristic_config(
            LENET_CONV1, ones_weights(LENET_CONV1), RELU_POOL2
        )
        tuning_cache.store({key: a_choice("const_rb_t2x1_m4")})
    assert tuning_cache.lookup(key).variant == "const_rb_t2x1_m4"


def test_a_cache_of_the_old_names_is_ignored_with_one_warning(cache_dir):
    """Format 1 held names of the grammar before ops/config_grammar.py ("const_rb_r2m4"): version 2 drops them."""
    assert tuning_cache.FORMAT_VERSION == 2
    key = tuning_key(LENET_CONV1, RELU_POOL2, FAKE_GPU.name)
    tuning_cache.store({key: a_choice("const_rb_t2x1_m4")})
    data = json.loads(tuning_cache.cache_path().read_text())
    data["format_version"] = 1
    data["entries"][key.text]["variant"] = "const_rb_r2m4"
    tuning_cache.cache_path().write_text(json.dumps(data))
    with pytest.warns(tuning_cache.TuningCacheWarning, match="format version 1, this opplugin reads 2"):
        assert tuning_cache.lookup(key) is None
    weights = ones_weights(LENET_CONV1)
    assert choose_config(LENET_CONV1, weights, RELU_POOL2, FAKE_GPU) == heuristic_config(LENET_CONV1, weights, RELU_POOL2)


def test_malformed_entries_are_ignored(cache_dir):
    key = tuning_key(LENET_CONV1, RELU_POOL2, "GPU A")
    path = tuning_cache.store({key: a_choice("const_rb_t2x1_m4")})
    data = json.loads(path.read_text())
    data["entries"][key.text]["variant"] = 42
    path.write_text(json.dumps(data))
    assert tuning_cache.lookup(key) is None


def test_an_entry_of_another_version_is_ignored(monkeypatch):
    weights = ones_weights(LENET_CONV1)
    monkeypatch.setattr(opplugin, "__version__", "0.0.1")
    tuning_cache.store({tuning_key(LENET_CONV1, RELU_POOL2, FAKE_GPU.name): a_choice("const_rb_t2x1_m4")})
    assert choose_config(LENET_CONV1, weights, RELU_POOL2, FAKE_GPU).name() == "const_rb_t2x1_m4"
    monkeypatch.setattr(opplugin, "__version__", "0.0.2")
    assert tuning_cache.lookup(tuning_key(LENET_CONV1, RELU_POOL2, FAKE_GPU.name)) is None
    assert choose_config(LENET_CONV1, weights, RELU_POOL2, FAKE_GPU) == heuristic_config(LENET_CONV1, weights, RELU_POOL2)


def test_a_precisions_entry_sits_beside_fp32s_for_the_same_step():
    fp32 = tuning_key(LENET_CONV1, RELU_POOL2, "GPU A")
    fp16 = tuning_key(LENET_CONV1, RELU_POOL2, "GPU A", precision="fp16")
    assert fp32.precision == "fp32" and fp16.precision == "fp16"
    assert fp16.text == f"{fp32.text} | fp16" and "fp32" not in fp32.text  # FP32's name as before keys held a precision
    tuning_cache.store({fp32: a_choice("const_rb_t2x1_m4")})
    tuning_cache.store({fp16: a_choice("wg_fp16_b128x128x64_s4")})
    assert tuning_cache.lookup(fp32).variant == "const_rb_t2x1_m4"
    assert tuning_cache.lookup(fp16).variant == "wg_fp16_b128x128x64_s4"
    assert tuning_cache.lookup(tuning_key(LENET_CONV1, RELU_POOL2, "GPU A", precision="bf16")) is None
    entries = json.loads(tuning_cache.cache_path().read_text())["entries"]
    assert sorted(e["precision"] for e in entries.values()) == ["fp16", "fp32"]


def test_an_older_file_whose_entries_have_no_precision_loads_as_fp32(cache_dir):
    """Written before keys held a precision: the same format version, no "precision" field in the entries."""
    key = tuning_key(LENET_CONV1, RELU_POOL2, FAKE_GPU.name)
    entry = {"gpu": key.gpu, "signature": key.signature, "bucket": key.bucket, "version": key.version,
             "variant": "const_rb_t2x1_m4", "median_ms": 0.5, "batch": 10000, "runners_up": [], "date": "2025-01-01T00:00:00+00:00"}
    cache_dir.mkdir()
    payload = {"format": tuning_cache.FORMAT, "format_version": 2, "entries": {key.text: entry}}
    tuning_cache.cache_path().write_text(json.dumps(payload))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the file is ours
        assert tuning_cache.lookup(key).variant == "const_rb_t2x1_m4"
        assert tuning_cache.lookup(dataclasses.replace(key, precision="fp16")) is None
    assert choose_config(LENET_CONV1, ones_weights(LENET_CONV1), RELU_POOL2, FAKE_GPU).name() == "const_rb_t2x1_m4"
    tuning_cache.store({dataclasses.replace(key, precision="bf16"): a_choice("wg_bf16_b128x128x64_s4")})  # kept on a write
    assert tuning_cache.lookup(key).variant == "const_rb_t2x1_m4"


def test_lookup_takes_the_nearest_tuned_bucket_within_a_factor_of_16():
    tuned = tuning_key(LENET_CONV1, RELU_POOL2, "GPU A")  # batch 10000: bucket 16384
    tuning_cache.store({tuned: a_choice("const_rb_t2x1_m4")})
    chunk = tuning_key(dataclasses.replace(LENET_CONV1, batch=1134), RELU_POOL2, "GPU A")
    assert tuning_cache.lookup(chunk).variant == "const_rb_t2x1_m4"
    far = tuning_key(dataclasses.replace(LENET_CONV1, batch=256), RELU_POOL2, "GPU A")
    assert tuning_cache.lookup(far) is None
    tuning_cache.store({far: a_choice("const_rb_t4x1_m4", batch=256)})
    assert tuning_cache.lookup(far).variant == "const_rb_t4x1_m4"
    # 1024 lies two powers of two from 256 and four from 16384
    middle = tuning_key(dataclasses.replace(LENET_CONV1, batch=1024), RELU_POOL2, "GPU A")
    assert tuning_cache.lookup(middle).variant == "const_rb_t4x1_m4"


# --- the choice -------------------------------------------------------------------------


def test_choice_takes_a_usable_cached_variant():
    weights = ones_weights(LENET_CONV1)
    heuristic = heuristic_config(LENET_CONV1, weights, RELU_POOL2)
    other = next(c for c in families.tuning_configs(LENET_CONV1, weights, RELU_POOL2) if c != heuristic)
    tuning_cache.store({tuning_key(LENET_CONV1, RELU_POOL2, FAKE_GPU.name): a_choice(other.name())})
    assert choose_config(LENET_CONV1, weights, RELU_POOL2, FAKE_GPU) == other
    another_gpu = Device("cuda", "Another GPU", "8.0")
    assert choose_config(LENET_CONV1, weights, RELU_POOL2, another_gpu) == heuristic


@pytest.mark.parametrize("cached", ["no_such_variant7", "const_mo_m4", "const_rb_t3x1_m4"], ids=["unknown", "cannot_fuse", "bad_tile"])
def test_choice_falls_back_to_the_heuristic_when_the_cached_variant_cannot_run(cached):
    weights = ones_weights(LENET_CONV1)
    tuning_cache.store({tuning_key(LENET_CONV1, RELU_POOL2, FAKE_GPU.name): a_choice(cached)})
    assert families.unsupported_reason(LENET_CONV1, cached, weights, RELU_POOL2) is not None
    assert choose_config(LENET_CONV1, weights, RELU_POOL2, FAKE_GPU) == heuristic_config(LENET_CONV1, weights, RELU_POOL2)


def test_choice_without_a_cache_is_the_heuristic():
    weights = ones_weights(LENET_CONV1)
    assert not tuning_cache.cache_path().exists()
    assert choose_config(LENET_CONV1, weights, RELU_POOL2, FAKE_GPU) == heuristic_config(LENET_CONV1, weights, RELU_POOL2)


@pytest.mark.parametrize("model", ["lenet86", "ece408_high"])
def test_the_heuristic_picks_a_usable_variant_for_the_shipped_steps(model):
    steps = tuning.conv_steps(load_model(model), 10000, FAKE_GPU)
    assert steps
    for step, spec, epilogue in steps:
        weights = constant_weights(step.node)
        variant = heuristic_config(spec, weights, epilogue)
        assert families.unsupported_reason(spec, variant, weights, epilogue) is None, (step.name, variant)
        assert variant in families.tuning_configs(spec, weights, epilogue)  # tuning times the heuristic's pick too


# --- tuning, its GPU work replaced by a stand-in -----------------------------------------


def test_tune_without_a_cuda_device_is_a_device_error(monkeypatch):
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="CUDA device"):
        tuning.tune("lenet86", 16, "auto")
    with pytest.raises(DeviceError):
        tuning.tune("lenet86", 16, Device("cpu"))
    with pytest.raises(InputError):
        tuning.tune("lenet86", 0, FAKE_GPU)


def test_cli_tune_without_a_cuda_device_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    assert cli.main(["tune", "lenet86", "--batch", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("opplugin: error:") and "CUDA device" in err and len(err.splitlines()) == 1


def test_tune_picks_the_fastest_passing_configuration_and_writes_the_cache(monkeypatch, cache_dir):
    def fake_problem(spec, weights, epilogue):
        return dataclasses.make_dataclass("FakeProblem", ["spec", "weights", "epilogue"])(spec, weights, epilogue)

    def fake_evaluate(problem, config, warmup, repeat, precision="fp32"):
        configs = families.tuning_configs(problem.spec, problem.weights, problem.epilogue)
        position, variant = configs.index(config), config.name()
        if position == 0:
            return Trial(variant, "incorrect", "relative error 0.01 > 1e-05", kernel_name=f"conv.{variant}", rel_error=1e-2)
        if position == 1:
            return Trial(variant, "spills", "spills: 16 bytes of local memory per thread", local_bytes=16)
        if position == 2:
            return Trial(variant, "failed", "build failed: KernelCompileError: boom")
        return Trial(variant, "ok", ms=float(position), kernel_name=f"conv.{variant}", rel_error=1e-8)

    monkeypatch.setattr(tuning, "make_problem", fake_problem)
    monkeypatch.setattr(tuning, "evaluate_config", fake_evaluate)
    lines = []
    report = tuning.tune("lenet86", 10000, FAKE_GPU, progress=lines.append)
    assert [t.step for t in report.steps] == ["conv1", "conv2"]
    assert report.cache_path == cache_dir / "tuning.json"
    for tuned in report.steps:
        configs = [c.name() for c in families.tuning_configs(tuned.spec, constant_weights(tuned_node(tuned)), tuned.epilogue)]
        assert [r.variant for r in tuned.results] == configs
        if len(configs) > 3:
            assert tuned.chosen.variant == configs[3]
            cached = tuning_cache.lookup(tuning_key(tuned.spec, tuned.epilogue, FAKE_GPU.name))
            assert cached.variant == configs[3] and cached.median_ms == 3.0
            assert [r["variant"] for r in cached.runners_up] == configs[4 : 4 + tuning.RUNNERS_UP_KEPT]
        else:
            assert tuned.chosen is None
    assert sum(1 for line in lines if line.startswith("[conv")) == sum(len(t.results) for t in report.steps)
    text = tuning.format_report(report)
    assert "median ms" in text and "skip: spills" in text and "error: build failed" in text and "fail: relative error" in text
    assert "pass: rel L2 1.0e-08" in text
    assert str(report.cache_path) in text


def test_tune_json_has_the_header_and_every_configuration(monkeypatch, cache_dir, tmp_path, capsys):
    outcomes = {}

    def fake_evaluate(problem, config, warmup, repeat, precision="fp32"):
        # the first configuration fails the check, the others pass, slower the later they come
        variant = config.name()
        position = outcomes.setdefault(problem.spec, []).__len__()
        outcomes[problem.spec].append(variant)
        if position == 0:
            return Trial(variant, "incorrect", "relative error 0.01 > 1e-05", kernel_name=f"conv.{variant}", rel_error=1e-2)
        return Trial(variant, "ok", ms=float(position), kernel_name=f"conv.{variant}", rel_error=1e-8, calls=4)

    monkeypatch.setattr(tuning, "cuda_device", lambda device: FAKE_GPU)
    monkeypatch.setattr(tuning, "make_problem", lambda spec, weights, epilogue: dataclasses.make_dataclass("P", ["spec"])(spec))
    monkeypatch.setattr(tuning, "evaluate_config", fake_evaluate)
    path = tmp_path / "tune.json"
    assert cli.main(["tune", "lenet86", "--batch", "16", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert list(data)[:5] == ["schema", "opplugin_version", "device", "model", "batch"]
    assert data["schema"] == tuning.SCHEMA == "opplugin-tune/2" and data["model"] == "lenet86" and data["batch"] == 16
    assert data["precision"] == "fp32" and data["element_bound"] is None
    assert data["device"] == {"kind": "cuda", "name": FAKE_GPU.name, "compute_capability": "9.0", "memory_bytes": None}
    assert data["repeat"] == tuning.DEFAULT_REPEAT and data["tolerance"] == EXACT_TOLERANCE
    assert data["cache_path"] == str(cache_dir / "tuning.json") and data["cache_error"] is None
    assert [step["step"] for step in data["steps"]] == ["conv1", "conv2"]
    assert [step["epilogue"] for step in data["steps"]] == ["+relu+maxpool2", "+relu+maxpool4"]
    for step, (spec, tried) in zip(data["steps"], outcomes.items()):
        assert step["conv"]["in_channels"] == spec.in_channels and step["conv"]["kernel"] == list(spec.kernel)
        configs = step["configs"]
        assert sorted(c["variant"] for c in configs) == sorted(tried)
        assert all(list(c) == [*tuning.CONFIG_KEYS, "chosen"] for c in configs)
        failed = next(c for c in configs if c["variant"] == tried[0])
        assert failed["result"] == "fail" and failed["ms"] is None and failed["chosen"] is False
        if len(tried) > 1:  # the fastest pass is chosen, and comes first
            assert step["chosen"] == tried[1] and configs[0]["variant"] == tried[1] and configs[0]["chosen"] is True
            assert configs[0]["result"] == "pass" and configs[0]["ms"] == 1.0 and configs[0]["calls"] == 4
    assert "config" in capsys.readouterr().out  # the table is still printed


_NODES = {}


def tuned_node(tuned):
    """The NodeInfo of a tuned step of lenet86 (for its constant weights)."""
    if not _NODES:
        for step, _, _ in tuning.conv_steps(load_model("lenet86"), 10000, FAKE_GPU):
            _NODES[step.name] = step.node
    return _NODES[tuned.step]


def test_local_memory_is_the_most_any_function_of_the_kernel_uses():
    class Function:
        def __init__(self, local):
            self.attributes = {"local_size_bytes": local, "num_regs": 40}

    class Kernel:
        def __init__(self, *locals_):
            self.functions = [Function(n) for n in locals_]

    assert local_memory_bytes(Kernel(0, 24, 8)) == 24
    assert local_memory_bytes(Kernel(0)) == 0
    assert local_memory_bytes(Kernel()) is None


# --- on the GPU ----------------------------------------------------------------------------


def assert_kept_configs_passed(report):
    for tuned in report.steps:
        assert tuned.results, tuned.step
        assert tuned.chosen is not None, [(r.variant, r.status, r.reason) for r in tuned.results]
        for r in tuned.passed:
            assert r.rel_error is not None and r.rel_error <= EXACT_TOLERANCE
            assert r.ms > 0 and r.local_bytes in (0, None)
        assert all(r.status in ("ok", "incorrect", "spills", "failed") for r in tuned.results)


def runner_kernel_names(model, batch):
    from opplugin.runtime import Runner

    runner = Runner(model, batch, "cuda")
    return {name: kernel.name for name, kernel in runner.kernels.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["tiny", "lenet86"])
def test_tuning_drives_the_runner(which, tiny_model_path, cache_dir):
    model = load_model(tiny_model_path if which == "tiny" else "lenet86")
    report = tuning.tune(model, 256, "cuda", warmup=1, repeat=3)
    assert report.cache_path == cache_dir / "tuning.json" and report.steps
    assert_kept_configs_passed(report)
    names = runner_kernel_names(model, 256)
    for tuned in report.steps:
        assert names[tuned.step] == tuned.chosen.kernel_name

    # a cached pick the heuristic would not make is obeyed too: the slowest that passed
    slowest = {tuned.step: tuned.passed[-1] for tuned in report.steps}
    tuning_cache.store(
        {
            tuning_key(t.spec, t.epilogue, report.device.name): tuning_cache.Choice(slowest[t.step].variant, 1.0, 256)
            for t in report.steps
        }
    )
    names = runner_kernel_names(model, 256)
    for tuned in report.steps:
        assert names[tuned.step] == slowest[tuned.step].kernel_name


# --- tune --precision fp16|bf16, its GPU work replaced by a stand-in -------------------------


@pytest.fixture(scope="module")
def conv_pair(tmp_path_factory):
    from onnx_builders import save
    from precision_cases import conv_pair_model

    return load_model(save(conv_pair_model(), tmp_path_factory.mktemp("tune_half") / "conv_pair.onnx"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_under_a_16_bit_precision_the_candidates_are_its_familys_configurations(conv_pair, precision):
    family = f"wg_{precision}"
    tuned = {step.name: (step, spec, epilogue) for step, spec, epilogue in tuning.conv_steps(conv_pair, 8, FAKE_GPU)}
    step, spec, epilogue = tuned["conv3x3"]
    weights = constant_weights(step.node)
    configs, fused, why = tuning.tuning_candidates(spec, weights, epilogue, precision)
    assert why is None and fused == epilogue and configs == families.family_configs(spec, family, weights, epilogue)
    assert len(configs) > 1 and {c.family for c in configs} == {family}
    assert set(configs).isdisjoint(families.tuning_configs(spec, weights, epilogue))  # none of FP32's candidates
    step, spec, epilogue = tuned["stem"]  # 3 input channels, padded to 8 in the family's channel-last copy
    configs, _, why = tuning.tuning_candidates(spec, constant_weights(step.node), epilogue, precision)
    assert why is None and configs and {c.family for c in configs} == {family}
    narrow = dataclasses.replace(spec, out_channels=16)  # 16 maps: the family's 16-map tiles alone
    configs, _, why = tuning.tuning_candidates(narrow, (np.ones(narrow.weight_shape, np.float32), None), epilogue, precision)
    assert why is None and {c.bm for c in configs} == {16} and {c.family for c in configs} == {family}
    few_maps = dataclasses.replace(spec, out_channels=12)  # 12 maps: no whole 8-map blocks, it declines
    weights = (np.ones(few_maps.weight_shape, np.float32), None)
    configs, _, why = tuning.tuning_candidates(few_maps, weights, epilogue, precision)
    assert configs == [] and why == (f"stays fp32: wg_{precision} takes fewer than 32 maps a group only in whole 8-map blocks "
                                     "(a tile of exactly its maps); this Conv has 12 a group")


def test_tune_in_fp16_caches_its_choices_beside_fp32s_and_a_plan_in_fp16_runs_them(monkeypatch, cache_dir, conv_pair):
    from opplugin.plan.partition import make_plan
    from opplugin.runtime.plan_record import record_plan_alone

    checked_in = set()

    def fake_evaluate(problem, config, warmup, repeat, precision="fp32"):
        checked_in.add(precision)
        configs = families.family_configs(problem.spec, config.family, problem.weights, problem.epilogue)
        return Trial(config.name(), "ok", ms=float(len(configs) - configs.index(config)), rel_error=1e-4)  # the last fastest

    monkeypatch.setattr(tuning, "cuda_device", lambda device: FAKE_GPU)
    monkeypatch.setattr(tuning, "make_problem", lambda spec, weights, epilogue: dataclasses.make_dataclass(
        "P", ["spec", "weights", "epilogue"])(spec, weights, epilogue))
    monkeypatch.setattr(tuning, "evaluate_config", fake_evaluate)
    exact_plan = record_plan_alone(make_plan(conv_pair, 8, FAKE_GPU))
    lines = []
    report = tuning.tune(conv_pair, 8, "cuda", progress=lines.append, precision="fp16")
    assert checked_in == {"fp16"} and report.precision == "fp16"
    wide = report.steps
    assert [t.step for t in wide] == ["stem", "conv3x3", "conv1x1"] and all(t.chosen and t.not_tuned is None for t in wide)
    for t in wide:
        assert t.chosen.variant == t.results[-1].variant and t.chosen.variant.startswith("wg_fp16_")
        assert tuning_cache.lookup(tuning_key(t.spec, t.epilogue, FAKE_GPU.name, precision="fp16")).variant == t.chosen.variant
        assert tuning_cache.lookup(tuning_key(t.spec, t.epilogue, FAKE_GPU.name)) is None  # nothing written for FP32
    text = tuning.format_report(report)
    assert "Tuned conv_pair at batch 8 on Test GPU 80GB in fp16" in text

    plan = make_plan(conv_pair, 8, FAKE_GPU)
    half = {s.name: s.implementation for s in record_plan_alone(plan, None, "fp16").steps}
    for t in wide:  # the tuned configuration, with the tensors the plan keeps channel-last between the steps (`_h`)
        linked = families.parse(half[t.step].removeprefix("conv.").removesuffix(t.epilogue.suffix))[1]
        assert linked.links and dataclasses.replace(linked, links=0).name() == t.chosen.variant
    assert record_plan_alone(plan).steps == exact_plan.steps  # an FP32 plan reads FP32's entries alone

    tuning.tune(conv_pair, 8, "cuda", precision="bf16")  # a second precision's entries join the first's
    assert tuning_cache.lookup(tuning_key(wide[0].spec, wide[0].epilogue, FAKE_GPU.name, precision="fp16")).variant == wide[0].chosen.variant
    assert tuning_cache.lookup(tuning_key(wide[0].spec, wide[0].epilogue, FAKE_GPU.name, precision="bf16")).variant.startswith("wg_bf16_")
    data = tuning.build_tune_report(report)
    assert data["schema"] == "opplugin-tune/2" and data["precision"] == "fp16" and data["tolerance"] is None
    assert "2.1u" in data["element_bound"]
    assert [s["not_tuned"] is None for s in data["steps"]] == [True, True, True]


@pytest.mark.gpu
def test_tuning_in_fp16_drives_a_runner_in_fp16_within_fp16s_rule(conv_pair, cache_dir):
    import onnxruntime

    from opplugin.runtime import Runner
    from opplugin.verify.check import default_tolerance

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 needs an sm_90 GPU (wgmma)")
    report = tuning.tune(conv_pair, 64, "cuda", warmup=1, repeat=3, precision="fp16")
    wide = [t for t in report.steps if t.step != "stem"]
    assert report.cache_path == cache_dir / "tuning.json" and [t.step for t in wide] == ["conv3x3", "conv1x1"]
    for t in wide:
        assert t.chosen is not None, [(r.variant, r.status, r.reason) for r in t.results]
        assert all(r.variant.startswith("wg_fp16_") for r in t.results) and t.chosen.ms > 0
        assert tuning_cache.lookup(tuning_key(t.spec, t.epilogue, report.device.name, precision="fp16")).variant == t.chosen.variant

    def kernel_names():  # the tuned configurations, less the links the plan adds between the steps (`_h`)
        kernels = Runner(conv_pair, 64, "cuda", precision="fp16").kernels
        assert all("_h" in kernels[t.step].name for t in wide)
        return {name: re.sub(r"_h\d+(?=\+|$)", "", kernel.name) for name, kernel in kernels.items()}

    assert all(kernel_names()[t.step] == t.chosen.kernel_name for t in wide)
    # a cached pick the family's default would not make is obeyed too: the slowest that passed
    slowest = {t.step: t.passed[-1] for t in wide}
    tuning_cache.store({tuning_key(t.spec, t.epilogue, report.device.name, precision="fp16"):
                        tuning_cache.Choice(slowest[t.step].variant, 1.0, 64) for t in wide})
    assert all(kernel_names()[t.step] == slowest[t.step].kernel_name for t in wide)

    runner = Runner(conv_pair, 64, "cuda", precision="fp16")
    x = np.random.default_rng(7).standard_normal((64, 3, 12, 12)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    session = onnxruntime.InferenceSession(conv_pair.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    [expected] = session.run(None, {"x": x})
    atol, rtol = default_tolerance("fp16")
    scale = max(1.0, float(np.sqrt(np.mean(expected.astype(np.float64) ** 2))))
    assert np.all(np.abs(got - expected) <= atol * scale + rtol * np.abs(expected))
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) > 1e-6, "no rounding at all: was it in FP32?"
