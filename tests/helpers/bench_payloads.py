"""Made-up payloads of each `opplugin bench` benchmark, built by the lab's own JSON builders
(make_row, reference_rows, Bench.payload, case_record, add_scaling ...) from invented times,
so that what reads them (the --report page) is tested without a GPU."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from onnx_builders import conv_spec

from opplugin.gpu.device import Device
from opplugin.lab import bench, e2e, gemm_bench, roofline, scaling
from opplugin.lab.cnn_layers import LAYERS
from opplugin.lab.custom_tune import ImplementationTrial
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.report.jsonout import header, json_safe
from opplugin.runtime.feeding import Feeding

GPU = Device("cuda", "NVIDIA H200", "9.0")
ROOF = roofline.Roofline(copy_bytes=2 << 30, copy_ms=0.5, matmul_n=8192, matmul_ms=22.0, matmul_rel_error=3e-7)
VERSIONS = {"python": "3.12", "numpy": "2", "cupy": "14.2", "cuda_runtime": 13000, "cuda_driver": 13000, "onnxruntime": "1.31",
            "onnxruntime_providers": ["CPUExecutionProvider"], "torch": "2.11", "cudnn": 91000}


def _step(label: str, epilogue: Epilogue, batch: int, channels: tuple[int, int], size: int) -> dict:
    spec = conv_spec(batch, channels[0], channels[1], (size, size), (7, 7))
    flops, nbytes = bench.step_cost(spec, epilogue, batch)
    step = dict.fromkeys(bench.STEP_KEYS)
    step.update(step=label, model="lenet86", conv=label.split()[1], fused=epilogue != NONE, epilogue=epilogue.suffix.lstrip("+"),
                batch=batch, shape=bench.describe_spec(spec), flops=flops, bytes=nbytes, floor_ms=ROOF.floor_ms(flops, nbytes),
                bound=roofline.bound_by(flops, nbytes, ROOF.bytes_per_s, ROOF.flops_per_s), default="const_rb_t8x1_m4")
    return step


def _conv_rows(step: dict, base_ms: float) -> list[dict]:
    """Eight candidates: five timed (three exact variants, an inexact one, cuDNN), one wrong, one
    unsupported, and a --kernel file that failed to compile."""
    variant = {"kind": "variant", "heuristic": True, "tolerance": 1e-5}
    return [
        bench.make_row(step, "baseline", family="baseline", ms=base_ms * 10, rel_error=1e-7, **variant),
        bench.make_row(step, "const_rb_t8x1_m4", family="const_rb", ms=base_ms, rel_error=2e-7, **variant),
        bench.make_row(step, "my_conv.cu", family="user", exact_by="measurement", ms=base_ms * 2, rel_error=3e-7, **variant),
        bench.make_row(step, "half_mo", family="half_mo", exact=False, ms=base_ms / 2, rel_error=4e-4, **variant),
        bench.make_row(step, "broken", family="broken", status="incorrect", reason="relative error 0.5 > 1e-05", rel_error=0.5, **variant),
        bench.make_row(step, "tiled", family="tiled", status="unsupported", reason="needs C >= 2", **variant),
        bench.make_row(step, "slow<&>.cu", family="user", status="failed", reason="nvrtc: error <line 3>", **variant),
        bench.make_row(step, "cudnn_fp32", "peer", ms=base_ms * 1.5, rel_error=1e-6, timer="cuda-events"),
    ]


CONV_ROWS_PER_STEP = 8
CONV_TIMED_PER_STEP = 5


def conv_payload(suite: str = "models") -> dict:
    """Two steps of lenet86 at batch 1000 (conv1 plain, conv2 fused), each with _conv_rows."""
    run = bench.Bench(bench.Options(batches=[1000], models=["lenet86"], suite=suite))
    run.roof = ROOF
    run.peer_notes = {"onnxruntime_cuda": "onnxruntime 1.31 has no CUDAExecutionProvider"}
    run._versions = lambda: VERSIONS
    for step, ms in [(_step("lenet86 conv1", NONE, 1000, (1, 4), 86), 0.06),
                     (_step("lenet86 conv2+relu+maxpool4", Epilogue("Relu", (4, 4)), 1000, (4, 16), 40), 0.12)]:
        run.steps.append(step)
        run.rows += _conv_rows(step, ms)
        bench.reference_rows(run.rows, step)
        step["best_ms"] = next(r["ms"] for r in run.rows if r["step"] == step["step"] and r["name"] == step["best"])
    streams = {"step": "lenet86 conv1", "batch": 1000, "variant": "const_rb_t8x1_m4", "status": "ok", "reason": None,
               "serial_ms": 6.0, "best_streams": 3, "best_ms": 4.5, "speedup": 6 / 4.5,
               "chunked": [{"streams": n, "chunks": 4 * n, "ms": ms, "speedup": 6 / ms, "correct": True} for n, ms in [(2, 5.0), (3, 4.5)]]}
    return json_safe(run.payload(GPU, streams if suite == "models" else None))


# wg_fp16 runs the first, dw_fp16 the depthwise second, gw_fp16 the grouped third (4 channels a group)
HALF_LAYERS = ("vgg 512->512 3x3 14", "mobilenetv2 dw 3x3 s2 144ch 56", "resnext50 g32 3x3 128ch 56")
# each layer's row of opplugin's candidate: (name, family, ms, rel_error, bound_fraction), then cuDNN's ms
HALF_ROWS = {
    HALF_LAYERS[0]: (("wg_fp16_b128x128x64_s4", "wg_fp16", 0.05, 3e-4, 0.12), 0.06),
    HALF_LAYERS[1]: (("dw_fp16_t1x2_b6x14_p48", "dw_fp16", 0.025, 2e-4, 0.08), 0.02),
    HALF_LAYERS[2]: (("gw_fp16_t1x8_b4x56_p32_v4", "gw_fp16", 0.02, 3e-4, 0.1), 0.03),
}


def half_payload() -> dict:
    """bench --suite cnn --precision fp16 at batch 32 on three layers beside cuDNN FP16: wg_fp16 (correct, and the
    configuration it picks) on the first, dw_fp16 on the depthwise second, gw_fp16 on the grouped third."""
    run = bench.Bench(bench.Options(batches=[32], suite="cnn", precision="fp16"))
    run.roof = ROOF
    run.peer_notes = {}
    run._versions = lambda: VERSIONS
    layers = {layer.name: layer for layer in LAYERS}
    for name, ((variant, family, ours_ms, error, fraction), cudnn_ms) in HALF_ROWS.items():
        spec = layers[name].spec(32)
        flops, nbytes = bench.step_cost(spec, NONE, 32)
        step = dict.fromkeys(bench.STEP_KEYS)
        step.update(step=f"cnn {name}", model="cnn", conv=name, fused=False, epilogue="", batch=32, shape=bench.describe_spec(spec),
                    flops=flops, bytes=nbytes, default=variant)
        ours = {"kind": "variant", "family": family, "exact": False, "heuristic": True, "tolerance": None}
        ours_row = bench.make_row(step, variant, ms=ours_ms, rel_error=error, bound_fraction=fraction, **ours)
        run.steps.append(step)
        run.rows += [ours_row, bench.make_row(step, "cudnn_fp16", "peer", exact=False, ms=cudnn_ms, rel_error=4e-4, bound_fraction=0.3,
                                              timer="cuda-graph")]
        bench.reference_rows(run.rows, step, "fp16")
        step["best_ms"] = ours_ms
    run.peers = [SimpleNamespace(name="cudnn_fp16")]
    return json_safe(run.payload(GPU, None))


def gemm_payload() -> dict:
    """Two layers at batch 16: three candidates each (one too wrong to time), and one layer that does not fit."""
    rows = []
    for label, k, n in gemm_bench.LAYERS[3:5]:
        floor = 1e3 * 4 * (n * k + n) / ROOF.bytes_per_s
        cublas = 0.01
        for name, ms, error in [("gemm.rowwarp (heuristic)", 0.008, 1e-7), ("gemm.tiled_64x64", None, 0.3), ("cuBLAS (torch linear, FP32)", cublas, 1e-7)]:
            rows.append({"layer": label, "k": k, "n": n, "batch": 16, "name": name, "ms": ms, "call_ms": ms and ms * 3, "rel_error": error,
                         "gb_per_s": 4 * (16 * k + n * k) / (ms * 1e-3) / 1e9 if ms else None, "weight_floor_ms": floor,
                         "x_floor": ms / floor if ms else None, "vs_cublas": cublas / ms if ms else None})
    rows.append({"layer": "cs259 fc1", "k": 25088, "n": 4096, "batch": 10000, "name": "-", "ms": None, "reason": "does not fit"})
    return header(gemm_bench.SCHEMA, GPU, [label for label, _, _ in gemm_bench.LAYERS], [16, 10000]) | {
        "roofline": ROOF.record(), "cublas": "torch.nn.functional.linear, FP32, TF32 off", "rows": rows}


def e2e_payload() -> dict:
    """resnet18 at batches 1 and 32: every candidate, the ONNX Runtime ones unavailable and torch.compile wrong at 32."""
    payload = header(e2e.SCHEMA, GPU, ["resnet18"], [1, 32])
    payload.update(warmup=3, warmup_ms=50, repeat=20, precision="fp32", reference=e2e.FP32_REFERENCE, tolerance=e2e.FP32_TOLERANCE,
                   opplugin_default="opplugin_graphs", peers=list(e2e.PEERS), roofline=ROOF.record(), cases=[], rows=[])
    for batch in (1, 32):
        rows = []
        for index, candidate in enumerate(e2e.CANDIDATES):
            row = e2e.empty_row("resnet18", batch, candidate)
            if candidate.startswith("onnxruntime"):
                row.update(status="unavailable", reason="onnxruntime 1.31 has no CUDAExecutionProvider")
            elif candidate == "torch_compile_graph" and batch == 32:
                row.update(status="incorrect", reason="relative L2 error 0.5 against onnxruntime CPU", host_to_host_ms=3.0, rel_l2=0.5)
            else:
                row.update(host_to_host_ms=batch * (0.5 + 0.2 * index), device_ms=batch * (0.4 + 0.2 * index), rel_l2=1e-6, top1_agreement=1.0)
            rows.append(row)
        floor = {"flops": 1, "weight_bytes": 2, "input_bytes": 3, "activation_bytes": 4, "floor_ms": 0.1 * batch, "floor_bound": "memory"}
        payload["rows"] += rows
        payload["cases"].append(e2e.case_record("resnet18", batch, rows, floor))
    return json_safe(payload)


def scaling_payload() -> dict:
    """lenet86 at 200,000 images over 0, 0,1 and 0,0 (runners sharing a GPU); 0,1 disagrees with onnxruntime;
    run --devices would use both GPUs of 0,1 and one runner of 0,0 (their feed probes)."""
    feeding = {"0": Feeding.unprobed(1, "one device given").record(["cuda:0"]),
               "0,1": Feeding.measured([100_000, 200_000], [54.0, 55.0]).record(["cuda:0", "cuda:1"]),
               "0,0": Feeding.measured([100_000, 200_000], [54.0, 108.0]).record(["cuda:0 #1", "cuda:0 #2"])}
    rows = []
    for devices, runners, gpus, ms in [("0", 1, 1, 100.0), ("0,1", 2, 2, 55.0), ("0,0", 2, 1, 98.0)]:
        row = dict.fromkeys(scaling.ROW_KEYS)
        row.update(batch=200_000, devices=devices, runners=runners, gpus=gpus, shared_gpu=gpus < runners, images_per_s=200_000 / (ms / 1e3),
                   time_ms=ms, times_ms=[ms], build_s=1.5, input_pinned=True, compared_rows=16, agrees=devices != "0,1",
                   max_abs_error=1e-6, rel_l2=1e-7, max_abs_vs_one=0.0, per_runner=[], feeding=feeding[devices])
        rows.append(row)
    return json_safe(header(scaling.SCHEMA, GPU, "lenet86", [200_000]) | {
        "settings": {"warmup": 2, "repeat": 5, "data": "random uniform [0, 1), seed 0",
                     "timing": "host to host, median wall time of the timed passes, every runner at once", "device_count": 2},
        "rows": scaling.add_scaling(rows)})


def custom_payload() -> dict:
    """The payload bench --custom writes: one custom node at batch 8, three implementations (one wrong)."""
    trials = [ImplementationTrial("cuda_source", "ok", ms=0.02, max_abs_error=1e-7, rel_l2=1e-8),
              ImplementationTrial("cupy_elementwise", "ok", ms=0.05, max_abs_error=2e-7, rel_l2=1e-8),
              ImplementationTrial("triton", "incorrect", reason="max abs error 0.3 against the reference", max_abs_error=0.3, rel_l2=0.1)]
    return json_safe({"model": "swish_model", "device": GPU.name, "batches": [{"batch": 8, "steps": [
        {"step": "swish_0", "op": "Swish", "reference_host_ms": 0.4, "fastest": "cuda_source",
         "implementations": [dataclasses.asdict(t) for t in trials]}]}]})
