"""The process `--sanitize` runs under compute-sanitizer: each user kernel of the model,
on `batch` images of standard-normal data, once. Arguments: MODEL BATCH OP=FILE...

CuPy's memory pool is off, so each array is a device allocation of its own size: a
write past the end of the output lands outside every allocation, where memcheck sees it.
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import cupy

    from ...gpu.device import select_device
    from ...errors import OpPluginError
    from ...graph.model import load_model
    from ...plan.partition import make_plan
    from ...user_kernels import user_registry
    from ...user_kernels.flags import parse_kernels
    from ...user_kernels.plugin import UserPlugin, probe_inputs
    from .cli_support import user_sources

    cupy.cuda.set_allocator(None)
    model_name, batch, *kernels = argv
    try:
        registry = user_registry(user_sources(parse_kernels(kernels)), probe=False)
        device = select_device("cuda")
        plan = make_plan(load_model(model_name), int(batch), device, registry)
        for step in plan.plugin_steps:
            if isinstance(registry.get(step.node.op_key), UserPlugin):
                kernel = step.build(device)
                kernel(probe_inputs(step.node, int(batch)), None)
                cupy.cuda.Device().synchronize()
    except OpPluginError as err:
        print(f"opplugin: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
