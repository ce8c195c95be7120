"""Launch one Conv variant of a shipped model a few times, for a profiler to watch.

    PYTHONPATH=$PWD ncu --kernel-name regex:^conv_ --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python3 tools/profile_conv.py lenet86 conv2 [--variant const_tile] [--fused] [--batch 10000]

The model `cnn` stands for the layer set of `opplugin bench --suite cnn`, its layers
named as there: `tools/profile_conv.py cnn "vgg 512->512 3x3 14" --batch 32`.

Without --variant the runner's own choice is taken (the tuning cache, else the
heuristic). Every kernel of the variants is named conv_<family>; the filter
matters, since the random input comes from cuRAND kernels that launch first.
Skip the first launches in the profiler (warm-up); the script prints the
kernel's name and its median time over the launches it made.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

from opplugin.gpu import cuda
from opplugin.gpu.device import current_cuda_device
from opplugin.lab.bench import conv_cases, suite_cases
from opplugin.lab.trial import Problem
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import choose_config
from opplugin.ops.conv.epilogue import NONE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("conv", help="the Conv node's name, e.g. conv1")
    parser.add_argument("--variant", help="family or configured name (default: the runner's choice)")
    parser.add_argument("--fused", action="store_true", help="with the activation and pool the plan fuses into it")
    parser.add_argument("--batch", type=int, default=10000)
    parser.add_argument("--launches", type=int, default=5)
    args = parser.parse_args()

    cases = {c.conv: c for c in (suite_cases() if args.model == "cnn" else conv_cases([args.model]))}
    if args.conv not in cases:
        parser.error(f"{args.model} has no Conv named {args.conv!r}; it has {', '.join(cases)}")
    case = cases[args.conv]
    spec = dataclasses.replace(case.spec, batch=args.batch)
    epilogue = case.epilogue if args.fused and case.epilogue else NONE
    weights = (case.w, case.b)
    variant = args.variant or choose_config(spec, weights, epilogue, current_cuda_device())
    kernel = families.build_kernel(spec, variant, weights, epilogue)
    # a random input and the model's own weights: variants with a constant bank ignore them, the others read them
    problem = Problem.random(spec, epilogue, weights)
    out = cuda.empty(kernel.output_shape(args.batch), "float32")
    times = cuda.time_ms(lambda: kernel(problem.inputs, None, out=out), warmup=0, repeat=args.launches)
    print(f"{kernel.name}: {args.model} {args.conv}, batch {args.batch}, median {statistics.median(times):.3f} ms "
          f"over {args.launches} launches")


if __name__ == "__main__":
    main()
