"""The process `--sanitize` runs under compute-sanitizer: each user kernel of the model, on
`batch` images of standard-normal data, once: every --kernel file, and every variant of each
CUDA C or Triton implementation of the --ops declarations. Arguments: MODEL BATCH [OP=FILE ...]
[--ops=FILE ...]. Each kernel launched is named on standard output after sanitize.LAUNCHED.

CuPy's memory pool is off, so each array is a device allocation of its own size: a
write past the end of the output lands outside every allocation, where memcheck sees it.
"""
from __future__ import annotations

import sys

from .sanitize import LAUNCHED


def main(argv: list[str]) -> int:
    import cupy

    from ...custom.declaration import CustomOp
    from ...errors import OpPluginError
    from ...gpu.device import select_device
    from ...plan.partition import make_plan
    from ...user_kernels import user_registry
    from ...user_kernels.flags import parse_kernels
    from ...user_kernels.plugin import UserPlugin, probe_inputs
    from ..loading import load_declared
    from .cli_support import user_sources

    cupy.cuda.set_allocator(None)
    model_name, batch, *rest = argv
    batch = int(batch)
    ops = tuple(a.removeprefix("--ops=") for a in rest if a.startswith("--ops="))
    kernels = [a for a in rest if not a.startswith("--ops=")]
    try:
        registry = user_registry(user_sources(parse_kernels(kernels)), probe=False) if kernels else None
        device = select_device("cuda")
        plan = make_plan(load_declared(model_name, ops), batch, device, registry)
        for step in plan.plugin_steps:
            if isinstance(step.plugin, UserPlugin):
                step.build(device)(probe_inputs(step.node, batch), None)
                cupy.cuda.Device().synchronize()
                print(f"{LAUNCHED}{step.plugin.source.label}", flush=True)
            elif isinstance(step.plugin, CustomOp):
                launch_declared(step.plugin, step.node, device, batch)
    except OpPluginError as err:
        print(f"opplugin: {err}", file=sys.stderr)
        return 2
    return 0


def launch_declared(op, node, device, batch: int) -> None:
    """Every variant of each of the op's implementations whose device code is known, once."""
    import cupy

    from ...custom.cuda_source import sample_inputs

    for implementation in op.implementations:
        code = implementation.device_code(op)
        if code is None or implementation.unsupported_reason(op, node, device) is not None:
            continue
        for variant in implementation.variants():
            op.build(node, device, variant)(sample_inputs(node, batch), None)
            cupy.cuda.Device().synchronize()
            print(f"{LAUNCHED}{variant}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
