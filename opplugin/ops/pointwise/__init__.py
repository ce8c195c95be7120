"""Pointwise ops compiled, not hand-written: each connected group of them becomes one generated
NVRTC kernel (codegen.py) from one description (group.py over ops.py's table), which is also
its numpy reference. One plugin class per op type (the registry tells built-ins by their class)."""
from .group import NODE_OPS, PointwiseGroup
from .plugin import GROUP_KIND, CudaPointwiseKernel, PointwisePlugin, ReferencePointwiseKernel

OPS = tuple(sorted(NODE_OPS))

# AddPlugin, ReluPlugin, ...: registry.BUILTINS names each
PLUGIN_CLASSES = {op: type(f"{op}Plugin", (PointwisePlugin,), {"op_type": op, "__module__": __name__}) for op in OPS}
globals().update({cls.__name__: cls for cls in PLUGIN_CLASSES.values()})

__all__ = ["GROUP_KIND", "OPS", "PLUGIN_CLASSES", "CudaPointwiseKernel", "PointwiseGroup", "PointwisePlugin", "ReferencePointwiseKernel"]
