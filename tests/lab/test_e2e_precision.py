"""`opplugin bench --e2e --precision` on the CPU: the bound a reduced precision is held to, the run's
payload and text in FP32 (as before, plus its precision and reference) and in FP16 (against float64),
the onnxruntime peers' reasons and switches, and the PyTorch peers' conversion, on a stand-in for torch."""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from bench_payloads import GPU, ROOF
from onnx_builders import save, tiny_cnn

from opplugin.graph.model import load_model
from opplugin.lab import e2e, e2e_onnxruntime, e2e_table, e2e_torch
from opplugin.lab.bench_page import bench_page
from opplugin.lab.peers import PeerUnavailable
from opplugin.ort import sessions
from opplugin.report.jsonout import json_safe
from opplugin.verify import float64
from repository import ROOT

NO_TORCH = "torch is not importable (ModuleNotFoundError: No module named 'torch')"


# --- the bound -------------------------------------------------------------------------------------


def test_a_reduced_precision_is_held_to_64_unit_roundoffs_of_its_format():
    assert e2e.reduced_precision_bound("fp16") == e2e.reduced_precision_bound("tf32") == 2.0 ** -5
    assert e2e.reduced_precision_bound("bf16") == 0.25
    assert all(e2e.reduced_precision_bound(p) > e2e.FP32_TOLERANCE for p in ("tf32", "fp16", "bf16"))


def test_a_reduced_precision_says_its_reference_and_bound_when_an_output_is_over_it():
    against = e2e.Accuracy(np.ones(4), e2e.FLOAT64_REFERENCE, e2e.reduced_precision_bound("fp16"), "fp16")
    assert against.wrong(0.03) is None and against.wrong(2.0 ** -5) is None
    assert against.wrong(0.04) == "relative L2 error 0.04 against float64, over the fp16 bound of 0.0312"
    assert against.wrong(float("nan")).startswith("relative L2 error nan")  # NaN is never within a bound
    fp32 = e2e.Accuracy(np.ones(4), e2e.FP32_REFERENCE, e2e.FP32_TOLERANCE)
    assert fp32.wrong(2e-4) == "relative L2 error 0.0002 against onnxruntime CPU"


def test_fp32_is_judged_against_onnxruntime_and_a_reduced_precision_against_the_model_in_float64(tmp_path):
    model = load_model(save(tiny_cnn(), tmp_path / "tiny.onnx"))
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 12, 12)).astype(np.float32)}
    theirs = sessions.Reference(model.original)(feeds)["y"]
    fp32 = e2e.accuracy(model, feeds, theirs, "fp32")
    assert fp32.output is theirs and (fp32.reference, fp32.bound) == ("onnxruntime CPU", e2e.FP32_TOLERANCE)
    bf16 = e2e.accuracy(model, feeds, theirs, "bf16")
    assert (bf16.reference, bf16.bound) == ("float64", 0.25) and bf16.output.dtype == np.float64
    assert np.array_equal(bf16.output, float64.evaluate_model(model.original, feeds)["y"])


# --- a whole run, every device part faked ----------------------------------------------------------


def fake_device_parts(monkeypatch, opplugin_outputs):
    """run_e2e with no GPU: this GPU and roofline, torch absent, onnxruntime with a CUDA provider that is
    never reached, and opplugin's rows giving opplugin_outputs(model, feeds)[mode] (recording the precision asked)."""
    asked = []

    def time_opplugin(model, feeds, warmup, repeat, cuda_graphs, precision="fp32"):
        asked.append(precision)
        mode = "opplugin_graphs" if cuda_graphs else "opplugin_eager"
        return {"host_to_host_ms": 1.0 if cuda_graphs else 2.0, "device_ms": 0.5, "output": opplugin_outputs(model, feeds)[mode],
                "implementation": "3 plugin steps", "chunks": 1, "step_ms": {}, "ms_by_kind": {}}

    monkeypatch.setattr(e2e, "select_device", lambda kind: GPU)
    monkeypatch.setattr(e2e, "load_torch_cudnn_first", lambda: None)
    monkeypatch.setattr(e2e.roofline, "measure", lambda: ROOF)
    monkeypatch.setattr(e2e, "release_device_memory", lambda: 0)
    monkeypatch.setattr(e2e, "time_opplugin", time_opplugin)
    monkeypatch.setattr(e2e_torch, "torch_or_reason", lambda: (None, NO_TORCH))
    return asked


def onnxruntime_cpu_outputs(model, feeds):
    output = sessions.Reference(model.original)({k: np.array(v) for k, v in feeds.items()})[model.outputs[0]]
    return {"opplugin_graphs": output, "opplugin_eager": output}


def test_the_fp32_payload_is_schema_3s_plus_its_precision_and_reference(monkeypatch, tmp_path):
    monkeypatch.setattr(sessions, "has_cuda", lambda: False)
    asked = fake_device_parts(monkeypatch, onnxruntime_cpu_outputs)
    payload = e2e.run_e2e([str(save(tiny_cnn(), tmp_path / "tiny.onnx"))], [2], 0, 1)
    committed = json.loads((ROOT / "tools" / "benchmark" / "e2e.json").read_text())  # a schema 3 run
    assert set(payload) == set(committed) | {"precision", "reference"} and asked == ["fp32", "fp32"]
    assert (payload["schema"], payload["precision"], payload["reference"]) == ("opplugin-bench-e2e/4", "fp32", "onnxruntime CPU")
    assert payload["tolerance"] == e2e.FP32_TOLERANCE == 1e-4
    (case,) = payload["cases"]
    assert set(case) == set(committed["cases"][0]) | {"output_varies"} and case["floor_ms"] > 0
    assert [row["status"] for row in payload["rows"]] == ["ok", "ok"] + ["unavailable"] * 5
    assert all(row["rel_l2"] == 0.0 for row in payload["rows"][:2])
    text = e2e_table.format_text(payload)
    prose = " ".join(text.split())
    assert prose.startswith("End to end in FP32 on NVIDIA H200: ")
    assert "FP32 everywhere (TF32 off), every output checked against onnxruntime CPU first." in prose
    assert "Floor: the model's FLOPs at" in prose


def test_an_fp16_run_checks_every_output_against_float64_and_its_onnxruntime_rows_say_why_not(monkeypatch, tmp_path):
    monkeypatch.setattr(sessions, "has_cuda", lambda: True)  # a CUDA build: what is missing is the converter
    monkeypatch.setitem(sys.modules, "onnxconverter_common", None)  # not importable, whether installed or not

    def outputs(model, feeds):  # graphs: FP32's answer, within FP16's bound; eager: 10% too large, outside it
        fp32 = onnxruntime_cpu_outputs(model, feeds)["opplugin_graphs"]
        return {"opplugin_graphs": fp32, "opplugin_eager": fp32 * 1.1}

    asked = fake_device_parts(monkeypatch, outputs)
    payload = e2e.run_e2e([str(save(tiny_cnn(), tmp_path / "tiny.onnx"))], [2], 0, 1, precision="fp16")
    assert asked == ["fp16", "fp16"]
    assert (payload["precision"], payload["reference"], payload["tolerance"]) == ("fp16", "float64", 2.0 ** -5)
    rows = {row["peer"]: row for row in payload["rows"]}
    assert rows["opplugin_graphs"]["status"] == "ok" and 0 < rows["opplugin_graphs"]["rel_l2"] < 1e-5  # FP32 against float64
    assert rows["opplugin_eager"]["status"] == "incorrect"
    assert rows["opplugin_eager"]["reason"].endswith(" against float64, over the fp16 bound of 0.0312")
    for peer in ("onnxruntime_cuda", "onnxruntime_cuda_graph"):
        assert (rows[peer]["status"], rows[peer]["reason"]) == ("unavailable", e2e_onnxruntime.FP16_CONVERTER_MISSING)
    assert {rows[p]["reason"] for p in ("pytorch_eager", "pytorch_graph", "torch_compile_graph")} == {NO_TORCH}
    (case,) = payload["cases"]
    assert case["floor_ms"] is None and case["opplugin_graphs_over_floor"] is None  # FP32's floor is none for FP16
    assert e2e.failed(payload) == [rows["opplugin_eager"]]
    prose = " ".join(e2e_table.format_text(payload).split())
    assert prose.startswith("End to end in FP16 on NVIDIA H200: ")
    assert "every output checked against the model in float64 first (correct within a relative L2 error of 0.0312)" in prose
    assert "Floor: none in a reduced precision" in prose
    page = " ".join(bench_page("e2e", json_safe(payload)).split())  # --report says the same
    assert "end to end beside their peers in FP16" in page and "every output checked against the model in float64" in page


def test_a_model_the_float64_evaluator_cannot_run_is_a_one_line_error(monkeypatch, tmp_path):
    from opplugin.errors import InputError

    def cannot(model, inputs):
        raise NotImplementedError("no runtime for op Foo\nTraceback ...")

    monkeypatch.setattr(float64, "evaluate_model", cannot)
    model = load_model(save(tiny_cnn(), tmp_path / "tiny.onnx"))
    with pytest.raises(InputError, match=r"^--precision: onnx's float64 reference cannot evaluate tiny: no runtime for op Foo$"):
        e2e.float64_output(model, {"x": np.zeros((1, 3, 12, 12), np.float32)})


# --- onnxruntime's peers ---------------------------------------------------------------------------


def test_onnxruntime_has_no_bf16_and_tf32_is_its_providers_switch(monkeypatch, tmp_path):
    model = load_model(save(tiny_cnn(), tmp_path / "tiny.onnx"))
    with pytest.raises(PeerUnavailable, match="^onnxruntime has no BF16 conversion of a model"):
        e2e_onnxruntime.graph_in(model, "bf16")
    assert e2e_onnxruntime.graph_in(model, "fp32") is model.original is e2e_onnxruntime.graph_in(model, "tf32")
    providers = []

    def session(proto, given):  # what the session would get; then it is refused, as without a GPU it must be
        providers.append(dict(given[0][1]))
        raise RuntimeError("no GPU here")

    monkeypatch.setattr(sessions, "has_cuda", lambda: True)
    monkeypatch.setattr(sessions, "session", session)
    monkeypatch.setattr(e2e_onnxruntime.cuda, "device_id", lambda: 0)
    for precision in ("fp32", "tf32"):
        with pytest.raises(PeerUnavailable, match="onnxruntime refused the session"):
            e2e_onnxruntime.cuda_session(model, graph=False, precision=precision)
    assert [p["use_tf32"] for p in providers] == ["0", "1"]


def test_the_fp16_model_keeps_float32_inputs_and_outputs_and_runs_on_onnxruntime(tmp_path):
    pytest.importorskip("onnxconverter_common", reason="onnxconverter-common is not installed")
    model = load_model(save(tiny_cnn(), tmp_path / "tiny.onnx"))
    converted = e2e_onnxruntime.fp16_graph(model)
    assert converted is e2e_onnxruntime.fp16_graph(model)  # converted once for every batch and peer
    assert [t.type.tensor_type.elem_type for t in [*converted.graph.input, *converted.graph.output]] == [1, 1]
    assert {t.data_type for t in converted.graph.initializer} == {10}  # FP16 weights
    assert model.original.graph.initializer[0].data_type == 1  # the model itself is left in FP32
    x = np.random.default_rng(0).standard_normal((2, 3, 12, 12)).astype(np.float32)
    ours = sessions.session(converted).run(None, {"x": x})[0]
    exact = float64.evaluate_model(model.original, {"x": x})["y"]
    assert e2e.agreement(ours, exact)["rel_l2"] <= e2e.reduced_precision_bound("fp16")


# --- PyTorch's peers, on a stand-in for torch ------------------------------------------------------


class Tensor:
    """What the conversion reads and calls of a torch tensor."""

    def __init__(self, ndim, dtype="float32", memory_format="contiguous"):
        self.ndim, self.dtype, self.memory_format = ndim, dtype, memory_format

    def is_floating_point(self):
        return self.dtype.startswith(("float", "bfloat"))

    def to(self, dtype=None, memory_format=None):
        return Tensor(self.ndim, dtype or self.dtype, memory_format or self.memory_format)

    def float(self):
        return self.to(dtype="float32")


class Module:
    """What TorchModel calls of a module: `to` is recorded, the call answers in the module's dtype."""

    def __init__(self):
        self.conversions, self.dtype, self.seen = [], "float32", []

    def eval(self):
        return self

    def cuda(self):
        return self

    def to(self, *args, **kwargs):
        self.conversions.append((args, kwargs))
        self.dtype = args[0] if args else self.dtype
        return self

    def __call__(self, x):
        self.seen.append(x)
        return Tensor(2, self.dtype)


def fake_torch():
    switches = SimpleNamespace(cudnn=SimpleNamespace(benchmark=False, allow_tf32=None),
                               cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=None)))
    return SimpleNamespace(float16="float16", bfloat16="bfloat16", channels_last="channels_last", backends=switches)


def tf32_switches(torch):
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def test_fp16_converts_a_copy_of_the_loaded_module_once_and_leaves_the_fp32_module_as_it_is(monkeypatch, tmp_path):
    torch, loaded = fake_torch(), Module()
    monkeypatch.setattr(e2e_torch, "torch_or_reason", lambda: (torch, None))
    monkeypatch.setattr(e2e_torch, "torch_module", lambda torch, path, model: (loaded, "a test module"))
    torch_model = e2e_torch.TorchModel(tmp_path / "tiny.onnx", load_model(save(tiny_cnn(), tmp_path / "tiny.onnx")))
    fp16 = torch_model.get("fp16")
    assert fp16.module is not loaded and loaded.conversions == []
    assert fp16.module.conversions == [(("float16",), {}), ((), {"memory_format": "channels_last"})]
    assert torch_model.get("fp16").module is fp16.module and torch_model.get("bf16").module.dtype == "bfloat16"
    assert tf32_switches(torch) == (False, False) and torch.backends.cudnn.benchmark
    tf32 = torch_model.get("tf32")
    assert tf32.module is loaded and tf32_switches(torch) == (True, True)
    fp32 = torch_model.get()
    assert fp32.module is loaded and tf32_switches(torch) == (False, False)
    assert (fp32.arithmetic, tf32.arithmetic, fp16.arithmetic) == ("FP32", "TF32", "FP16 channels_last")


def test_fp16_casts_the_input_in_and_the_output_back_to_fp32():
    torch, module = fake_torch(), Module().to("float16")
    peer = e2e_torch.TorchPeer(torch, module, "a test module", "fp16")
    assert peer.forward(Tensor(4)).dtype == "float32"
    assert (module.seen[-1].dtype, module.seen[-1].memory_format) == ("float16", "channels_last")
    peer.forward(Tensor(2))  # a vector per image: no memory format to choose
    assert (module.seen[-1].dtype, module.seen[-1].memory_format) == ("float16", "contiguous")
    ids = Tensor(2, "int64")
    peer.forward(ids)  # token ids stay integers
    assert module.seen[-1] is ids
    fp32 = e2e_torch.TorchPeer(torch, Module(), "a test module")
    x = Tensor(4)
    fp32.forward(x)
    assert fp32.module.seen == [x]  # FP32 passes the input as it is


# --- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, error", [
    (["--suite", "gemm", "--precision", "fp16"], "--precision applies to bench --e2e and the Conv suites (--suite models or cnn)"),
    (["--e2e", "m.onnx", "--precision", "FP16"],
     "--precision 'FP16': one of fp32, tf32, fp16, bf16 (a step without a kernel in it stays fp32)"),
])
def test_a_precision_bench_cannot_take_is_a_one_line_error(argv, error, capsys):
    from opplugin.cli import commands as cli

    assert cli.main(["bench", *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"opplugin: error: {error}"]
