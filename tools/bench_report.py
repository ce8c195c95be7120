#!/usr/bin/env python3
"""Turn one `opplugin bench --json BENCH.json` run into the repository's benchmark pages:

    python tools/bench_report.py BENCH.json [--out tools/benchmark] [--batch 10000]

    python tools/bench_report.py BENCH.json --e2e E2E.json     # also the whole-model table (several files: a table each)
    python tools/bench_report.py BENCH.json --cnn CNN.json     # also the real-CNN layer table (bench --suite cnn)

writes OUT/BENCHMARK.md (one row per optimisation, one column per conv, each cell
the measured ms and the speed-up over the baseline variant, beside the effect the
seeds' reasoning predicts) and OUT/variants.png (time per variant per conv, log
scale, peers highlighted). matplotlib draws the chart; it is not a dependency of
opplugin, so without it the table is still written and the tool says what is missing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "benchmark"

# What each optimisation should do to these convs, from the reasoning (and the
# figures) in the seed reports; matched on the family name, first match wins.
PREDICTIONS: list[tuple[tuple[str, ...], str]] = [
    # arithmetic first: "fp16_mo" is an FP16 variant before it is a multi-output one
    (("3xtf32",), "three TF32 products recover FP32 accuracy at a third of the tensor-core rate: still above the FP32 ceiling"),
    (("fp16", "half"), "FP16 arithmetic: these convs are not ALU-bound, so ~1x (seeds: no gain); error ~1e-3, opt-in"),
    (("tf32", "mma", "tensor"), "TF32 tensor cores lift the arithmetic ceiling (FP32 arithmetic sets these floors): up to ~2x if the loads keep up; error ~1e-3"),
    (("baseline",), "reference: one thread per output, every filter tap a global load"),
    (("const_tile",), "register tile of rows x columns x maps: each constant load of a weight feeds rows x columns FMAs, so a rolled channel loop stays FFMA-bound; ~1.3-1.5x over const_rb on conv2"),
    (("const_rb", "register", "_rb"), "register tile of rows x maps: each input load feeds many FMAs; close to the floor, ~5-10x over baseline"),
    (("const_mo", "_mo"), "several maps per thread share one input load: ~2-3x over const (seed: 50 -> 19 ms from this alone)"),
    (("implicit", "fused_gemm", "igemm"), "unrolling inside the GEMM tile, no unrolled matrix in memory: ~1.5-2x over explicit im2col (seeds)"),
    (("im2col", "unroll_gemm", "gemm"), "explicit unroll + tiled GEMM: K*K-fold input traffic in global memory; seeds measured 0.2-0.9x of baseline"),
    (("tiled", "shared", "smem"), "input tile with halo in shared memory: fewer global loads, but syncs and bank conflicts; seeds 0.8-1.1x"),
    (("restrict", "unroll"), "__restrict__ + fully unrolled taps: fewer index ops; seeds ~1.0-1.15x"),
    (("tree",), "channel reduction as a shared-memory tree: with 1-4 input channels mostly sync overhead; seeds 0.5-0.9x"),
    (("atomic",), "channel reduction with atomics: write contention on the output; seeds 0.3-0.95x"),
    (("const",), "filters in __constant__ memory: broadcast, cached filter reads; seeds ~1.15-1.25x over baseline"),
    (("cudnn_fp32",), "vendor library, general-purpose algorithms; these small-channel convs use it poorly"),
    (("cudnn_tf32",), "cuDNN on TF32 tensor cores: helps the compute-heavier conv2 only"),
    (("onnxruntime",), "cuDNN through onnxruntime's CUDA provider: about cuDNN FP32"),
    (("streams",), "copies overlap the kernel: host-to-host time falls toward the longest copy alone (seeds: kernel time unchanged)"),
]
FUSED_PREDICTION = "activation + max pool inside the conv kernel: only the pooled map is written (1/pool-area of the stores), no extra passes: toward the smaller fused floor"
FUSED_PEER_PREDICTION = "conv, activation and pool as three library calls, each a full pass over the conv output"
# The targets: speed-up over cuDNN FP32 at batch 10000, and at most 1.5x the floor.
TARGET_VS_CUDNN = {"lenet86 conv1": 10.0, "lenet86 conv2": 3.0, "ece408_high conv1": 2.5}
TARGET_X_FLOOR = 1.5
PEER_LABELS = {"cudnn_fp32": "cuDNN FP32 (PyTorch)", "cudnn_tf32": "cuDNN TF32 (PyTorch)", "onnxruntime_cuda": "onnxruntime CUDA"}


def predicted_effect(name: str) -> str:
    lowered = name.lower()
    for keys, text in PREDICTIONS:
        if any(key in lowered for key in keys):
            return text
    return "(no prediction written for this family)"


def pick_batch(payload: dict[str, Any], requested: int | None) -> int:
    batches = sorted({s["batch"] for s in payload["steps"]})
    if not batches:
        raise SystemExit("bench_report: the JSON has no steps")
    if requested is None:
        return 10000 if 10000 in batches else batches[-1]
    if requested not in batches:
        raise SystemExit(f"bench_report: batch {requested} is not in the JSON (it has {batches})")
    return requested


def _cell(row: dict[str, Any] | None, ratio: str) -> str:
    if row is None:
        return ""
    if row["status"] != "ok" or not row["ms"]:
        return "n/a" if row["status"] == "unsupported" else f"**{row['status']}**"
    speedup = f", {row[ratio]:.2f}x" if row.get(ratio) else ""
    return f"{row['ms']:.3f} ms{speedup}"


def _family_rows(rows: list[dict[str, Any]], steps: list[str]) -> list[tuple[str, str, list[dict[str, Any] | None]]]:
    """(row label, prediction key, cells) for each family's heuristic pick, then its best
    configuration where other configurations were timed, then the peers."""
    families = list(dict.fromkeys(r["family"] for r in rows if r["kind"] == "variant"))
    out = []
    for family in families:
        mine = [r for r in rows if r["family"] == family]
        picks = [next((r for r in mine if r["step"] == s and r["heuristic"]), None) for s in steps]
        exact = all(r["exact"] for r in mine)
        out.append((f"`{family}`" + ("" if exact else " (inexact)"), family, picks))
        configs = [r for r in mine if not r["heuristic"]]
        if any(r["status"] == "ok" for r in configs):
            best = []
            for s in steps:
                timed = [r for r in mine if r["step"] == s and r["status"] == "ok" and r["ms"]]
                best.append(min(timed, key=lambda r: r["ms"]) if timed else None)
            out.append((f"`{family}`, best configuration", family, best))
    for peer in dict.fromkeys(r["name"] for r in rows if r["kind"] == "peer"):
        cells = [next((r for r in rows if r["step"] == s and r["name"] == peer), None) for s in steps]
        out.append((f"[{PEER_LABELS.get(peer, peer)}]", peer, cells))
    return out


def markdown_table(payload: dict[str, Any], batch: int, fused: bool) -> list[str]:
    steps = [s for s in payload["steps"] if s["batch"] == batch and s["fused"] == fused]
    names = [s["step"] for s in steps]
    rows = [r for r in payload["rows"] if r["batch"] == batch and r["step"] in names]
    if not steps:
        return []
    lines = [
        "| optimisation | " + " | ".join(names) + " | predicted effect |",
        "| --- | " + " | ".join("---" for _ in names) + " | --- |",
    ]
    for label, key, cells in _family_rows(rows, names):
        shown = []
        for row in cells:
            # a fused step has no baseline variant: its speed-up is over the cuDNN chain
            text = _cell(row, "vs_cudnn_fp32" if fused else "vs_baseline")
            if row is not None and "best configuration" in label and row["status"] == "ok":
                text += f" (`{row['name']}`)"
            shown.append(text)
        if fused:
            prediction = FUSED_PEER_PREDICTION if label.startswith("[") else FUSED_PREDICTION
        else:
            prediction = predicted_effect(key)
        lines.append(f"| {label} | " + " | ".join(shown) + f" | {prediction} |")
    lines.append("| roofline floor | " + " | ".join(f"{s['floor_ms']:.3f} ms ({s['bound']})" for s in steps) + " | the device's limit |")
    return lines


def standing_lines(payload: dict[str, Any], batch: int) -> list[str]:
    """Best exact variant of each plain conv against cuDNN FP32 and the floor, with the targets."""
    steps = [s for s in payload["steps"] if s["batch"] == batch and not s["fused"]]
    lines = [
        "| conv | best exact variant | ms | vs cuDNN FP32 | target | x floor | target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for step in steps:
        row = next((r for r in payload["rows"] if r["step"] == step["step"] and r["batch"] == batch and r["name"] == step["best"]), None)
        if row is None:
            lines.append(f"| {step['step']} | none correct | | | | | |")
            continue
        target = TARGET_VS_CUDNN.get(step["step"])
        vs = row["vs_cudnn_fp32"]
        vs_text = f"{vs:.2f}x" if vs else "-"
        vs_goal = "" if target is None or vs is None else f">= {target:g}x: {'met' if vs >= target else 'missed'}"
        floor_goal = f"<= {TARGET_X_FLOOR:g}: {'met' if row['x_floor'] <= TARGET_X_FLOOR else 'missed'}"
        lines.append(f"| {step['step']} | `{row['name']}` | {row['ms']:.3f} | {vs_text} | {vs_goal} | {row['x_floor']:.2f} | {floor_goal} |")
    return lines


def render_markdown(payload: dict[str, Any], batch: int, chart: str | None) -> str:
    device, roof, versions, settings = payload["device"], payload["roofline"], payload["versions"], payload["settings"]
    torch = f"torch {versions['torch']} with cuDNN {versions['cudnn']}" if versions.get("torch") else "no torch"
    out = [
        "# Conv benchmark",
        "",
        f"Generated by `tools/bench_report.py` from one `opplugin bench` run (opplugin {payload['opplugin_version']}) "
        f"on **{device['name']}** (compute capability {device['compute_capability']}); CuPy {versions['cupy']}, "
        f"CUDA runtime {versions['cuda_runtime']}, {torch}, onnxruntime {versions['onnxruntime']}. "
        f"Batch {batch:,}; medians of {settings['repeat']} CUDA-event samples after {settings['warmup']} warm-up calls"
        f"{', each a CUDA-graph replay of back-to-back calls' if settings.get('cuda_graphs') else ''}. "
        "Each cell: median time, and speed-up over the `baseline` variant. Every figure belongs to an output checked "
        "against a float64 reference first.",
        "",
        f"Roofline of this device, measured in the same run: copy {roof['copy_gb_per_s'] / 1000:.2f} TB/s "
        f"(device-to-device, bytes read + written), FP32 {roof['fp32_tflop_per_s']:.1f} TFLOP/s "
        f"({roof['matmul_n']}^3 matrix product, TF32 off). A conv's floor is the larger of bytes / bandwidth and FLOPs / rate; "
        "a fused step's counts only the pooled output's bytes and the conv outputs its pool reads.",
        "",
        *(["**This run was cut short: some steps are missing.**", ""] if not payload.get("complete", True) else []),
        "## Conv alone",
        "",
        *markdown_table(payload, batch, fused=False),
        "",
        "## Against cuDNN and the floor",
        "",
        *standing_lines(payload, batch),
    ]
    fused = markdown_table(payload, batch, fused=True)
    if fused:
        out += [
            "",
            "## Fused Conv > activation > MaxPool",
            "",
            "Each cell: median time, and speed-up over the same chain in PyTorch (cuDNN FP32 conv, then the activation, then the pool).",
            "",
            *fused,
        ]
    totals = [t for t in payload.get("fused_totals", []) if t["batch"] == batch]
    for total in totals:
        ms = "not measured" if total["ms"] is None else f"{total['ms']:.3f} ms"
        target = f" (target < {total['target_ms']:g} ms: {'met' if total['met'] else 'missed'})" if total["target_ms"] else ""
        out += ["", f"All fused stages of {total['model']} together: {ms}{target}: " + " + ".join(f"`{v}`" for v in total["variants"]) + "."]
    streams = payload.get("streams")
    if streams and streams.get("serial_ms"):
        best = f"best {streams['best_streams']} streams, {streams['best_ms']:.2f} ms, {streams['speedup']:.2f}x" if streams.get("speedup") else "no chunked run timed"
        out += [
            "",
            "## Streams",
            "",
            f"{streams['step']}, batch {streams['batch']:,}, `{streams['variant']}`, pinned host input to pinned host output: "
            f"serial {streams['serial_ms']:.2f} ms; {best}. Predicted: {predicted_effect('streams')}.",
        ]
    if chart:
        out += ["", f"![time per variant]({chart})"]
    return "\n".join(out) + "\n"


NO_MATPLOTLIB = "matplotlib is not installed (pip install matplotlib): the chart was not drawn"


def _pyplot() -> Any:
    """matplotlib.pyplot drawing to files (Agg), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def draw_chart(payload: dict[str, Any], batch: int, path: Path) -> str | None:
    """The PNG chart; returns None, or why it could not be drawn."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    import matplotlib.ticker
    steps = [s for s in payload["steps"] if s["batch"] == batch]
    shown = [
        sorted(
            (
                r
                for r in payload["rows"]
                if r["step"] == step["step"] and r["batch"] == batch and r["status"] == "ok" and r["ms"] and (r["heuristic"] or r["kind"] == "peer")
            ),
            key=lambda r: r["ms"],
        )
        for step in steps
    ]
    heights = [max(2, len(rows)) for rows in shown]
    fig, axes = plt.subplots(
        len(steps), 1, figsize=(9, 1.0 + 0.34 * sum(heights) + 0.6 * len(steps)), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    for ax, step, rows in zip(axes[:, 0], steps, shown):
        labels = [r["name"] if r["kind"] == "variant" else PEER_LABELS.get(r["name"], r["name"]) for r in rows]
        colours = ["tab:orange" if r["kind"] == "peer" else ("tab:gray" if not r["exact"] else "tab:blue") for r in rows]
        times = [r["ms"] for r in rows]
        ax.barh(range(len(rows)), times, color=colours)
        ax.set_yticks(range(len(rows)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        low = min([step["floor_ms"], *times]) / 2
        ax.set_xlim(low, max([step["floor_ms"], *times]) * 3)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        for y, ms in enumerate(times):
            ax.text(ms * 1.05, y, f"{ms:.3g}", va="center", fontsize=7)
        ax.axvline(step["floor_ms"], color="tab:red", linestyle="--", linewidth=1, label=f"floor {step['floor_ms']:.3f} ms")
        ax.set_title(f"{step['step']}, batch {batch:,}", fontsize=10)
        ax.legend(fontsize=7, loc="upper right")  # the shortest bar is on top
    axes[-1, 0].set_xlabel("median ms (log scale); orange: peers, grey: inexact (fp16/tf32), blue: opplugin FP32-exact")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def cnn_markdown(payload: dict[str, Any], chart: str | None) -> list[str]:
    """The `bench --suite cnn` summary: per layer and batch, cuDNN, the best exact variant, the default pick, TF32."""
    summary, device = payload["suite_summary"], payload["device"]

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:.4g}"

    def ratio(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}x"

    if payload.get("settings", {}).get("cuda_graphs"):
        timing = ("each sample replays one CUDA graph of back-to-back calls (cuDNN's through `torch.cuda.CUDAGraph`), as "
                  "`run` launches its steps by default, so the figures are device time per call, without the host's launch cost.")
    else:
        timing = ("each sample is back-to-back eager calls. At batch 1 most layers take a few microseconds of GPU time, so the "
                  "figures there are mostly the per-call host cost of each implementation.")
    out = [
        f"One `opplugin bench --suite cnn` run on **{device['name']}**: medians of CUDA-event samples; cuDNN through PyTorch with "
        "`cudnn.benchmark` on. \"best exact\" is the fastest FP32-exact variant (3xTF32 counts as exact by measurement: "
        "relative L2 <= 1e-5 against float64); \"default\" is the runner's pick without a tuning cache, and /best its time "
        f"over the best's. Timing: {timing}",
        "",
        "| layer | batch | cuDNN FP32 ms | cuDNN TF32 ms | best exact | ms | vs cuDNN FP32 | default | /best | TF32 ms | vs cuDNN TF32 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for line in summary["layers"]:
        out.append(
            f"| {line['step'].removeprefix('cnn ')} | {line['batch']} | {ms(line['cudnn_fp32_ms'])} | {ms(line['cudnn_tf32_ms'])} | "
            f"`{line['best'] or '-'}` | {ms(line['best_ms'])} | {ratio(line['best_vs_cudnn_fp32'])} | `{line['default'] or '-'}` | "
            f"{ratio(line['default_vs_best'])} | {ms(line['tf32_ms'])} | {ratio(line['tf32_vs_cudnn_tf32'])} |"
        )
    out += [
        "",
        f"Best exact vs cuDNN FP32: geometric mean {ratio(summary['geomean_best_vs_cudnn_fp32'])}, lowest "
        f"{ratio(summary['min_best_vs_cudnn_fp32'])}. Default pick: at most {ratio(summary['max_default_vs_best'])} the best exact. "
        f"TF32 vs cuDNN TF32: geometric mean {ratio(summary['geomean_tf32_vs_cudnn_tf32'])}.",
    ]
    if chart:
        out += ["", f"![speed-up over cuDNN per layer]({chart})"]
    return out


def draw_cnn_chart(payload: dict[str, Any], path: Path) -> str | None:
    """Speed-up over cuDNN FP32 of the best exact variant and of the default pick, per layer and batch."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    lines = payload["suite_summary"]["layers"]
    labels = [f"{line['step'].removeprefix('cnn ')}, batch {line['batch']}" for line in lines]
    best = [line["best_vs_cudnn_fp32"] or 0 for line in lines]
    default = [(line["best_vs_cudnn_fp32"] or 0) / (line["default_vs_best"] or float("inf")) for line in lines]
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.32 * len(lines)))
    ys = range(len(lines))
    ax.barh([y - 0.2 for y in ys], best, height=0.4, color="tab:blue", label="best FP32-exact variant")
    ax.barh([y + 0.2 for y in ys], default, height=0.4, color="tab:cyan", label="default pick")
    ax.axvline(1.0, color="tab:orange", linewidth=1.5, label="cuDNN FP32")
    ax.set_yticks(list(ys), labels, fontsize=7)
    return _saved_bars(plt, fig, ax, "speed-up over cuDNN FP32 (higher is better; 0: no exact variant runs the layer)", path)


def e2e_ratios(runs: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """Per (model, batch), opplugin's default (CUDA graphs) host to host over the fastest peer of its
    run; where a model ran in several runs (peers in parts), the highest of its ratios."""
    ratios: dict[tuple[str, int], float] = {}
    for run in runs:
        for case in run["cases"]:
            ratio = case.get("opplugin_graphs_over_fastest_peer")
            if ratio:
                key = (case["model"], case["batch"])
                ratios[key] = max(ratio, ratios.get(key, 0.0))
    return ratios


def draw_e2e_chart(runs: list[dict[str, Any]], path: Path) -> str | None:
    """opplugin's default over the fastest peer, per model, a bar per batch (e2e_ratios)."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    ratios = e2e_ratios(runs)
    models = list(dict.fromkeys(model for model, _ in ratios))
    batches = sorted({batch for _, batch in ratios})
    fig, ax = plt.subplots(figsize=(8, 0.8 + 0.45 * len(models)))
    height = 0.8 / max(1, len(batches))
    for k, batch in enumerate(batches):
        ys = [y - 0.4 + height * (k + 0.5) for y in range(len(models))]
        ax.barh(ys, [ratios.get((m, batch), 0) for m in models], height=height, label=f"batch {batch}")
    ax.axvline(1.0, color="tab:red", linewidth=1.5, label="fastest peer")
    ax.set_yticks(list(range(len(models))), models, fontsize=8)
    return _saved_bars(plt, fig, ax, "opplugin (CUDA graphs, the default) over the fastest peer, host to host (lower is better)", path)


def _saved_bars(plt: Any, fig: Any, ax: Any, xlabel: str, path: Path) -> None:
    """A horizontal bar chart finished (first row on top, its axis label and legend) and written to `path`."""
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", help="the file `opplugin bench --json` wrote")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for BENCHMARK.md and variants.png (default tools/benchmark)")
    parser.add_argument("--batch", type=int, help="the batch the tables show (default 10000, else the largest)")
    parser.add_argument("--e2e", metavar="E2E_JSON", nargs="+",
                        help="also the tables of `opplugin bench --e2e --json` runs (one each, in order: a set of models "
                             "and peers too long for one invocation is run in parts)")
    parser.add_argument("--cnn", metavar="CNN_JSON", help="also the table and chart of an `opplugin bench --suite cnn --json` run")
    args = parser.parse_args(argv)
    payload = json.loads(Path(args.bench_json).read_text())
    batch = pick_batch(payload, args.batch)
    out = Path(args.out)
    problem = draw_chart(payload, batch, out / "variants.png")
    out.mkdir(parents=True, exist_ok=True)
    page = render_markdown(payload, batch, None if problem else "variants.png")
    if args.e2e:
        from opplugin.lab.e2e_table import format_markdown  # the table `bench --e2e` prints, so both read alike

        runs = [json.loads(Path(path).read_text()) for path in args.e2e]
        e2e_problem = draw_e2e_chart(runs, out / "e2e.png")
        problem = problem or e2e_problem
        page += "\n## Whole models end to end\n\n"
        if not e2e_problem:
            page += ("![opplugin over the fastest peer](e2e.png)\n\nEach bar: opplugin's default (CUDA graphs) host to "
                     "host over the fastest peer of its run; where a model ran in several runs, the highest ratio.\n\n")
        for number, run in enumerate(runs, 1):
            if len(runs) > 1:
                page += f"### Run {number} of {len(runs)}: {', '.join(run['model'])}\n\n"
            page += format_markdown(run) + ("\n" if number < len(runs) else "")
    if args.cnn:
        cnn = json.loads(Path(args.cnn).read_text())
        cnn_problem = draw_cnn_chart(cnn, out / "cnn_layers.png")
        problem = problem or cnn_problem
        page += "\n## Real-CNN layers\n\n" + "\n".join(cnn_markdown(cnn, None if cnn_problem else "cnn_layers.png")) + "\n"
    (out / "BENCHMARK.md").write_text(page)
    print(f"wrote {out / 'BENCHMARK.md'}" + ("" if problem else f" and {out / 'variants.png'}"))
    if problem:
        print(f"bench_report: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
