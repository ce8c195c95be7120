"""What a GPU would run for each model, counted without a GPU: steps, onnxruntime steps and the
ops left in them, the kernel families picked, `baseline` Convs and why any node falls back.

    python3 tools/plan_census.py /tmp/cnn/*.onnx                      # batch 1 and 32, sm_90
    python3 tools/plan_census.py model.onnx --batches 8 --capability 8.0 --json census.json

Plans are made for an offline CUDA device of the given compute capability: the choice of
kernels is the heuristic's (the tuning cache is keyed by the device's name, which no tuned
device has), and nothing is compiled or run. A model that fails to load or plan gets a row
saying why, and the others go on.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from opplugin.gpu.device import Device
from opplugin.errors import OpPluginError
from opplugin.graph.model import Model, load_model
from opplugin.plan.partition import make_plan
from opplugin.runtime.plan_record import record_plan_alone


def census(model: Model, name: str, batch: int, device: Device) -> dict:
    """One model at one batch: counts of what its plan runs."""
    plan = make_plan(model, batch, device)
    record = record_plan_alone(plan)
    plugin = [s for s in record.steps if s.kind == "plugin"]
    ort = [s for s in record.steps if s.kind != "plugin"]
    families = Counter(_family(s.implementation) for s in plugin)
    return {
        "model": name,
        "batch": batch,
        "steps": len(record.steps),
        "plugin_steps": len(plugin),
        "onnxruntime_steps": len(ort),
        "onnxruntime_ops": dict(Counter(op for s in ort for op in s.ops)),
        "conv_baseline": sum(1 for s in plugin if s.implementation.startswith("conv.baseline")),
        "families": dict(families.most_common()),
        "fallbacks": dict(Counter(plan.fallbacks.values())),
    }


def rows_of(path: Path, batches: list[int], device: Device) -> list[dict]:
    """A row per batch of the model in `path`, loaded once; where it cannot be loaded or planned, the row says why."""
    try:
        model = load_model(path)
    except OpPluginError as err:
        return [_failed(path, batch, err) for batch in batches]
    rows = []
    for batch in batches:
        try:
            rows.append(census(model, path.stem, batch, device))
        except OpPluginError as err:
            rows.append(_failed(path, batch, err))
    return rows


def _failed(path: Path, batch: int, err: OpPluginError) -> dict:
    return {"model": path.stem, "batch": batch, "error": str(err).splitlines()[0]}


def _family(implementation: str) -> str:
    """"conv.tc_3xtf32_b128x64x32_w64x32_s3+relu" -> "conv.tc_3xtf32"; a prologue's mark is kept out."""
    head, _, rest = implementation.partition(".")
    rest = rest.split("+")[0].split("*")[-1]
    fields = rest.split("_")
    family = [f for f in fields if not (f[:1].isalpha() and f[1:2].isdigit())]  # drop "b128x64", "m4", ...
    return f"{head}.{'_'.join(family)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, metavar="MODEL.onnx")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--capability", default="9.0", help="compute capability of the offline device (default 9.0)")
    parser.add_argument("--json", type=Path, help="write every row as JSON too")
    args = parser.parse_args(argv)
    device = Device("cuda", "offline", args.capability)
    rows = []
    print(f"{'model':<24} {'batch':>5} {'steps':>6} {'ort':>4} {'baseline':>8}  onnxruntime ops / fallbacks", flush=True)
    for path in args.models:
        for row in rows_of(path, args.batches, device):
            rows.append(row)
            if "error" in row:
                print(f"{row['model']:<24} {row['batch']:>5}  error: {row['error'][:120]}", flush=True)
                continue
            left = ", ".join(f"{op} {n}" for op, n in row["onnxruntime_ops"].items())
            why = "; ".join(f"{n}x {reason[:60]}" for reason, n in row["fallbacks"].items())
            print(f"{row['model']:<24} {row['batch']:>5} {row['steps']:>6} {row['onnxruntime_steps']:>4} {row['conv_baseline']:>8}  "
                  f"{left}{' | ' if left and why else ''}{why}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
