"""Device time per call of every exact Conv variant on chosen layers, replayed from a CUDA graph
(what a graphed run pays: no host cost, the launch gaps kept), beside the default picks with and
without graphs. Each variant is checked against float64 before it is timed. Compiles run first,
in parallel worker processes (they fill CuPy's kernel cache), then the timing, one variant at a time.

    python tools/pick_study.py --out study.json [--batches 1 32] [--workers 14] [--layers NAME ...]
    python tools/pick_study.py --out dw.json --suite-layers "mobilenetv2 dw 3x3 s2 144ch 56" --families depthwise unrolled
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import statistics
import sys
import time

import numpy as np

# name: (C, M, input size, kernel, stride, pad, fused activation or None[, groups])
LAYERS = {
    "effnet se squeeze 480->20": (480, 20, 1, 1, 1, 0, "Silu"),
    "effnet se excite 20->480": (20, 480, 1, 1, 1, 0, "Sigmoid"),
    "effnet se squeeze 1152->48": (1152, 48, 1, 1, 1, 0, "Silu"),
    "effnet se excite 48->1152": (48, 1152, 1, 1, 1, 0, "Sigmoid"),
    "regnet se squeeze 320->36": (320, 36, 1, 1, 1, 0, "Relu"),
    "mnv3 se excite 240->960": (240, 960, 1, 1, 1, 0, "HardSigmoid"),
    "densenet 1x1 96->128 56": (96, 128, 56, 1, 1, 0, "Relu"),
    "densenet 1x1 64->128 56": (64, 128, 56, 1, 1, 0, "Relu"),
    "densenet 1x1 992->128 7": (992, 128, 7, 1, 1, 0, "Relu"),
    "densenet 1x1 928->128 14": (928, 128, 14, 1, 1, 0, "Relu"),
    "regnet 1x1 64->144 56": (64, 144, 56, 1, 1, 0, "Relu"),
    "regnet 1x1 s2 32->64 112": (32, 64, 112, 1, 2, 0, None),
    "regnet 1x1 784->784 7": (784, 784, 7, 1, 1, 0, "Relu"),
    "mnist 32->64 3x3 14": (32, 64, 14, 3, 1, 1, None),
    "mobilenetv2 1x1 96->24 56": (96, 24, 56, 1, 1, 0, None),
    "resnet 1x1 64->256 56": (64, 256, 56, 1, 1, 0, None),
}
BUILT_IN = list(LAYERS)
# grouped 3x3 layers of real networks beyond the suite's, named with --layers (not in the default set)
LAYERS |= {
    "resnext50 g32 3x3 256ch 28": (256, 256, 28, 3, 1, 1, "Relu", 32),
    "resnext50 g32 3x3 s2 256ch 56": (256, 256, 56, 3, 2, 1, "Relu", 32),
    "resnext101-32x8d g32 3x3 256ch 56": (256, 256, 56, 3, 1, 1, "Relu", 32),
    "regnety400mf gw8 3x3 104ch 28": (104, 104, 28, 3, 1, 1, "Relu", 13),
    "resnext50 g32 3x3 1024ch 7": (1024, 1024, 7, 3, 1, 1, "Relu", 32),
    "gw2 3x3 64ch 56": (64, 64, 56, 3, 1, 1, "Relu", 32),
}
CONFIGS_PER_FAMILY = 2  # the family's pick and the next few it offers
# the seeds' teaching steps, never the fastest on these layers: left out to save compiles
SKIPPED = {"baseline", "unrolled", "const", "tiled", "reduce_tree", "reduce_atomic", "im2col_gemm", "implicit_gemm"}
CALLS_PER_GRAPH = 20


def spec_of(name: str, batch: int):
    from opplugin.ops.conv.spec import ConvSpec

    c, m, size, k, stride, pad, _, *group = LAYERS[name]
    return ConvSpec(batch, c, m, (size, size), (k, k), (stride, stride), (1, 1), (pad,) * 4, group[0] if group else 1, True)


def epilogue_of(name: str):
    from opplugin.ops.conv.epilogue import NONE, Epilogue

    act = LAYERS[name][6]
    return Epilogue(act) if act else NONE


def weights_of(name: str):
    spec = spec_of(name, 1)
    rng = np.random.default_rng(sorted(LAYERS).index(name))
    fan_in = spec.in_channels // spec.group * spec.kernel[0] ** 2
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32) * np.float32(fan_in ** -0.5)
    return w, rng.standard_normal(spec.out_channels, dtype=np.float32) * np.float32(0.1)


def variants(name: str, batch: int, only: set[str] | None = None, every: bool = False) -> list[str]:
    """The exact families' picks (of `only`, if given) and next configurations (`every`: all they
    offer), the K splits of the GEMMs' picks, the defaults and every configuration of the graphed
    default's family."""
    from opplugin.ops.conv import cost, families
    from opplugin.ops.conv.choice import heuristic_config

    spec, epilogue, weights = spec_of(name, batch), epilogue_of(name), weights_of(name)
    names = []
    for family in families.usable_families(spec, weights, epilogue):
        if (family in SKIPPED and not (only and family in only)) or only and family not in only:
            continue
        offered = [c for c in families.FAMILIES[family].configs(spec, epilogue)
                   if families.unsupported_reason(spec, c, weights, epilogue) is None]
        pick = families.configure(spec, family, epilogue)
        for config in [pick, *(offered if every else offered[:CONFIGS_PER_FAMILY]), *cost.split_alternatives(pick)]:
            if families.unsupported_reason(spec, config, weights, epilogue) is None:
                names.append(config.name())
    for graphed in (True, False):
        names.append(heuristic_config(spec, weights, epilogue, graphed).name())
    default = heuristic_config(spec, weights, epilogue, graphed=True)
    names += [c.name() for c in families.FAMILIES[default.family].configs(spec, epilogue)
              if families.unsupported_reason(spec, c, weights, epilogue) is None]
    return list(dict.fromkeys(names))


def compile_one(job: tuple[str, tuple, int, str]) -> str | None:
    """Build one variant in a worker (fills the kernel cache); the error's first line, if any."""
    name, layer, batch, variant = job
    from opplugin.ops.conv import families

    LAYERS[name] = layer  # a spawned worker knows only the built-in layers

    try:
        families.build_kernel(spec_of(name, batch), variant, weights_of(name), epilogue_of(name))
    except Exception as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return None


def graph_us(kernel, inputs, out, stream) -> float:
    """µs per call of the kernel replayed from a graph of CALLS_PER_GRAPH calls."""
    import cupy

    from opplugin.gpu import cuda

    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        for _ in range(CALLS_PER_GRAPH):
            kernel(inputs, stream, out=out)
        graph = stream.end_capture()
    times = cuda.time_ms(lambda: graph.launch(stream), warmup=3, repeat=9, stream=stream)
    return 1e3 * statistics.median(times) / CALLS_PER_GRAPH


def measure(name: str, batch: int, names: list[str], errors: dict) -> list[dict]:
    import cupy

    from opplugin.lab.trial import EXACT_TOLERANCE, Problem
    from opplugin.ops.conv import families

    spec, epilogue, weights = spec_of(name, batch), epilogue_of(name), weights_of(name)
    problem = Problem.random(spec, epilogue, weights)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for variant in names:
        row = {"layer": name, "batch": batch, "variant": variant, "us": None, "error": errors.get((name, variant))}
        rows.append(row)
        if row["error"]:
            continue
        try:
            kernel = families.build_kernel(spec, variant, weights, epilogue)
            out = cupy.full(kernel.output_shape(batch), cupy.nan, dtype=cupy.float32)
            with stream:
                kernel(problem.inputs, stream, out=out)
            stream.synchronize()
            rel, unwritten = problem.error(out)
            if unwritten or not rel <= EXACT_TOLERANCE:
                row["error"] = f"wrong: rel {rel:.3g}, unwritten {unwritten}"
                continue
            row["us"] = graph_us(kernel, problem.inputs, out, stream)
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--layers", nargs="+", default=None, help="built-in layers (default all of them)")
    parser.add_argument("--batch32-layers", nargs="*", default=None, help="layers measured at batches above 1 (default: all)")
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--families", nargs="*", default=None, help="time only these families' picks (and the defaults)")
    parser.add_argument("--every-config", action="store_true", help="time every configuration the families offer, not their first few")
    parser.add_argument("--extra-layers", nargs="*", default=[], help="more layers as NAME=C,M,SIZE,KERNEL,STRIDE,PAD[,ACT]")
    parser.add_argument("--suite-layers", nargs="*", default=[], help="layers of bench --suite cnn, by name (grouped ones too)")
    args = parser.parse_args()
    if args.suite_layers:
        from opplugin.lab.cnn_layers import LAYERS as SUITE

        by_name = {layer.name: layer for layer in SUITE}
        unknown = [name for name in args.suite_layers if name not in by_name]
        if unknown:
            parser.error(f"no suite layer {unknown}; the suite has {sorted(by_name)}")
        for name in args.suite_layers:
            layer = by_name[name]
            LAYERS[name] = (layer.in_channels, layer.out_channels, layer.size, layer.kernel, layer.stride, layer.pad, None, layer.group)
    # the named layers; by default the built-in ones, unless suite layers are named
    args.layers = [*(args.layers if args.layers is not None else [] if args.suite_layers else BUILT_IN), *args.suite_layers]
    for text in args.extra_layers:
        name, fields = text.split("=")
        *numbers, act = fields.split(",") if not fields.split(",")[-1].isdigit() else (*fields.split(","), None)
        LAYERS[name] = (*map(int, numbers), act)
        args.layers.append(name)
    from opplugin.ops.conv.choice import heuristic_config

    cases = [(name, batch) for batch in args.batches for name in args.layers
             if batch == 1 or args.batch32_layers is None or name in args.batch32_layers]
    only = set(args.families) if args.families else None
    plan = {case: variants(*case, only, args.every_config) for case in cases}
    # one compile per layer and variant: the batch is a kernel argument
    jobs = list({(name, v): (name, LAYERS[name], batch, v) for (name, batch), names in reversed(plan.items()) for v in names}.values())
    start = time.time()
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        errors = {(name, v): err for (name, _, _, v), err in zip(jobs, pool.map(compile_one, jobs, chunksize=2)) if err}
    print(f"compiled {len(jobs)} variants in {time.time() - start:.0f} s", flush=True)
    rows = []
    for case in cases:
        rows += measure(*case, plan[case], errors)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
        name, batch = case
        spec, weights, epilogue = spec_of(name, batch), weights_of(name), epilogue_of(name)
        timed = {r["variant"]: r["us"] for r in rows if r["layer"] == name and r["batch"] == batch and r["us"]}
        if not timed:
            continue
        best = min(timed, key=timed.get)
        graphed = heuristic_config(spec, weights, epilogue, graphed=True).name()
        eager = heuristic_config(spec, weights, epilogue, graphed=False).name()
        figure = timed.get(graphed)
        ratio = f"{figure / timed[best]:.2f}x" if figure else "untimed"
        print(f"{name} b{batch}: default {graphed} {figure and round(figure, 1)} us ({ratio}; eager default {eager}), "
              f"best {best} {timed[best]:.1f} us; " + ", ".join(f"{v} {u:.1f}" for v, u in sorted(timed.items(), key=lambda t: t[1])[:8]),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
