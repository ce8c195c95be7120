"""The plugin protocol and the registry of plugins by ONNX op type.

A plugin claims ONNX nodes of one op type. For each node it either says why it
cannot run it (`supports` returns the reason, shown by `opplugin plan`) or builds
a `Kernel` for a device: a callable taking the node's inputs as arrays (numpy on
the CPU device, CuPy on a CUDA device) and returning its outputs.

`Plugin` and `Kernel` list every member the runtime, the plan and other plugins read.
Subclass them: the optional members (fusing followers and prologues, groups, variants,
the variant of a precision, compile jobs, workspace, NaN/Inf exactness, device work, writing into a Concat's slice)
then have their defaults, and a plugin need only write `op_type`, `supports` and `build`.

Third-party plugins register with `register(plugin)` or through the entry-point
group ``opplugin.plugins`` (each entry point names a Plugin instance, a Plugin
class or a zero-argument callable returning one). The built-in plugins are named
the same way, so the registry imports none of them until it is asked for plugins.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np
import onnx

from .gpu.device import Device
from .gpu.kernel_cache import CompileJob
from .errors import PluginError

# op type -> "module:attribute" of the built-in plugin class
BUILTINS = {
    "Conv": "opplugin.ops.conv:ConvPlugin",
    "Gemm": "opplugin.ops.gemm:GemmPlugin",
    "MatMul": "opplugin.ops.gemm:MatMulPlugin",
    "Flatten": "opplugin.ops.view:FlattenPlugin",
    "Reshape": "opplugin.ops.view:ReshapePlugin",
    "MaxPool": "opplugin.ops.pool:MaxPoolPlugin",
    "AveragePool": "opplugin.ops.pool:AveragePoolPlugin",
    "GlobalMaxPool": "opplugin.ops.pool:GlobalMaxPoolPlugin",
    "GlobalAveragePool": "opplugin.ops.pool:GlobalAveragePoolPlugin",
    "ReduceMean": "opplugin.ops.reduction:ReduceMeanPlugin",  # over H and W of NCHW: the global average pool's kernel
    **{op: f"opplugin.ops.reduction:{op}Plugin"
       for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
                  "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "InstanceNormalization")},
    "Squeeze": "opplugin.ops.view:SqueezePlugin",
    "Unsqueeze": "opplugin.ops.view:UnsqueezePlugin",
    **{op: f"opplugin.ops.layout:{op}Plugin" for op in ("Concat", "Transpose", "Slice", "Split", "Gather", "Pad", "Resize")},
    # opplugin.ops.pointwise.OPS: each connected group of them one generated kernel, where no Conv or Gemm epilogue took them
    **{op: f"opplugin.ops.pointwise:{op}Plugin"
       for op in ("Add", "Sub", "Mul", "Div", "Pow", "Sum", "Min", "Max", "Where", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp",
                  "Log", "Erf", "Elu", "Softplus", "Gelu", "Cast", "Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid",
                  "HardSwish", "BatchNormalization", "Expand")},
}


# Domains whose ops the built-in plugins run by op type alone: ONNX's own, and opplugin's (ops a
# load-time pass writes, graph/functions.py)
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "opplugin"})


def op_key(domain: str, op_type: str) -> str:
    """What the registry files an op under: its op type in a standard domain, else "domain::OpType"
    (a com.example::Swish is no ONNX op, and no built-in plugin runs it)."""
    return op_type if domain in STANDARD_DOMAINS else f"{domain}::{op_type}"


def node_key(node: onnx.NodeProto) -> str:
    """The registry key of a node's op (see op_key)."""
    return op_key(node.domain, node.op_type)


def node_name(node: onnx.NodeProto) -> str:
    """How opplugin names a node: its own name, else its first output's."""
    return node.name or node.output[0]


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of a node after shape inference: name, shape at the plan's batch and dtype
    (a constant's value is in NodeInfo.constants)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class NodeInfo:
    """One ONNX node as a plugin sees it: attributes with ONNX defaults not yet
    filled (the op's own plugin knows them), shapes after inference for the
    runner's batch, and constant inputs (initializers) as arrays."""

    node: onnx.NodeProto
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    attributes: dict[str, Any]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    # the plugin's normalised record of the node (a ConvSpec, say), made once by the plan
    # through `Plugin.make_spec`; None where no plan made one (a NodeInfo built by hand)
    spec: Any = None
    # the model's opset of the default ONNX domain (0: unknown), for ops whose meaning changed (Softmax's axis)
    opset: int = 0
    # the images the shapes are at (the plan's batch; 0: unknown), for a kernel whose cost per image is not
    # its first axis's (Swin's windows fold N x 64 matrices into it)
    batch: int = 0

    @property
    def name(self) -> str:
        return node_name(self.node)

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def op_key(self) -> str:
        """The registry key of the node's op: its op type, with the domain outside ONNX's (op_key)."""
        return node_key(self.node)

    def data_input(self) -> str | None:
        """The tensor this node transforms, where it is pointwise: its first input that is no
        constant and has its one output's shape (None where there is none, or several outputs)."""
        outputs = [t for t in self.outputs if t.name]
        if len(outputs) != 1:
            return None
        shape = tuple(outputs[0].shape)
        return next((t.name for t in self.inputs if t.name and t.name not in self.constants and tuple(t.shape) == shape), None)


@dataclass(frozen=True)
class NodeGroup:
    """Connected nodes that one kernel runs together, as the plan gives them to a plugin with a
    `group_kind`: convex (no path leaves the group and comes back), so one step can run it."""

    nodes: tuple[NodeInfo, ...]  # in graph order; the first leads the group
    inputs: tuple[str, ...]  # what the kernel is given: tensors the nodes read and none writes, weights left out
    outputs: tuple[str, ...]  # what it returns: the nodes' outputs read outside the group or graph outputs


@runtime_checkable
class Kernel(Protocol):
    """A node's computation, built for one device.

    The members with a value here are optional: a subclass gets these defaults. An object
    that does not subclass Kernel must have every member (the runner checks with isinstance)."""

    name: str  # for the report: says variant and configuration, e.g. "conv.const_mo_m4+relu"
    variant: str | None = None  # the configured variant it was built from, when its plugin has variants
    # True when NaN and Inf leave the kernel exactly where onnxruntime's nodes would put them. Where
    # a kernel does not promise it (a fused max pool's NaN rule, 3xTF32's split operands) and the
    # exact path has something else to run (the fusion split up, or the plugin's
    # `nonfinite_exact_variant`), its outputs are watched and the chunks where NaN or Inf appear
    # run again that way (runtime/exact.py); so is every MaxPool or GlobalMaxPool step.
    nonfinite_exact: bool = False
    # False for a kernel that enqueues nothing on the device (a reshape view): its step is then
    # timed by the host clock, not by CUDA events
    device_work: bool = True
    # How `__call__(inputs, stream, out=Y)` may be handed the array Y to write its one output into (in
    # full), so that a Concat's producer writes straight into its slice (runtime/buffers.py):
    # "contiguous" (a C-contiguous Y), "strided" (any view, e.g. a channel slice of a larger NCHW
    # buffer), or "": it takes no `out`.
    out_view: str = ""
    # For a kernel that copies each input into a slice of its one output (Concat): (axis, ((start, stop)
    # of each input along it)); None for any other kernel. Such a kernel has `copying` too.
    input_slices: tuple[int, tuple[tuple[int, int], ...]] | None = None
    # True for a kernel that reads strided views as they are (a slice of a Concat's buffer): its input
    # may then be such a view rather than a tensor of its own (runtime/buffers.py)
    in_views: bool = False
    # True for a kernel with `out_view` whose calls launch device work only through the functions of
    # opplugin's modules (gpu/cuda.py), with launches that follow from its buffers' addresses and the
    # batch alone: an eager run then replays them from packed arguments while the buffers stay the
    # same (runtime/eager_replay.py, gpu/recorded_launches.py)
    replayable: bool = False
    # True for a kernel of one output whose `__call__(inputs, stream, nonfinite=A)` sets the zeroed
    # device byte at address A if any output value is NaN or Inf, as it stores them: a watched step
    # then needs no NaN/Inf check of its own after it (runtime/exact.py)
    flags_nonfinite: bool = False

    def flops(self, batch: int) -> int:
        """Arithmetic operations of one call at this batch, for GFLOP/s."""
        ...

    def bytes_moved(self, batch: int) -> int:
        """Fewest bytes one call at this batch must read and write, for GB/s."""
        ...

    def workspace_bytes(self, batch: int) -> int:
        """Device memory a call at this batch allocates besides its outputs; the
        runner sizes its chunks so that this fits beside them."""
        return 0

    def copying(self, positions: frozenset[int]) -> "Kernel | None":
        """For a kernel with `input_slices`: the kernel that copies only the inputs not at `positions`
        (their producers wrote those in place) into `out=`; None when none is left to copy."""
        raise PluginError(f"{self.name} copies no inputs into slices of its output (it has no input_slices)")

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        """The node's outputs for its inputs; on a CUDA device, work enqueued on `stream`."""
        ...


# What a kernel needs when it does not subclass Kernel (the runner's error message names them)
KERNEL_MEMBERS = ("name", "variant", "nonfinite_exact", "device_work", "out_view", "input_slices", "in_views", "replayable",
                  "flags_nonfinite", "flops", "bytes_moved", "workspace_bytes", "copying", "__call__")


@dataclass(frozen=True)
class PrecisionChoice:
    """A plugin's answer for one step under a reduced --precision (Plugin.precision_variant): the variant that
    runs it in that precision, or None and, in a few words, why the step stays FP32; or a variant in another
    precision (its variant_precision) and why that one (a fused attention's TF32 under fp16)."""

    variant: str | None
    reason: str | None = None  # None where `variant` runs in the precision asked for


@dataclass(frozen=True)
class ChannelLast:
    """Where a step's kernel can keep tensors in a 16-bit format, channel-last ([N][H][W][C], the format's bits
    in uint16), rather than in FP32 in the model's layout (Plugin.channel_last; plan/channel_last.py links them)."""

    # "fp16" or "bf16"; None: any, that of the tensors it is linked with (an op exact in every 16-bit format,
    # as a max pool is: the max of rounded values is the rounded max), which the plan takes from the producer
    # of its input
    format: str | None
    inputs: frozenset[int]  # the step's input positions it can take so
    output: bool  # whether it can write its one output so
    # True: the step links every input at `inputs` and its output in one format, or none of them (a Concat, whose
    # output holds its inputs as they come); such a step copies what it takes, so the plan links none whose input
    # another such step reads too (DenseNet's pattern: each would copy it again)
    all_or_none: bool = False


@runtime_checkable
class Plugin(Protocol):
    """Runs the nodes of one ONNX op type.

    `build`, `kernel_name` and `compile_jobs` take the same arguments: the node, the device, the
    variant asked for (None: the plugin's choice), the `fused` followers (as `fuse` agreed), the
    `prologue` nodes before it (as `fuse_prologue` agreed), and `graphed`: whether the kernel will
    be launched from CUDA graphs (then the host's cost of a launch does not count in a choice)."""

    op_type: str  # the op's registry key: an ONNX op type, or "domain::OpType" (op_key)
    # Plugins of one group kind run connected nodes together as one kernel (see GroupPlugin); None:
    # this plugin runs one node at a time, with the followers it fuses
    group_kind: str | None = None
    # Where the operand of a fused prologue comes in the step's inputs (plan/prologue.py); None: the
    # plugin applies no prologue (its `fuse_prologue` is never asked)
    prologue_input: int | None = None
    # Whether its kernels run a node with an empty tensor (an axis of size 0) as ONNX says; False:
    # such a node stays with onnxruntime (plan/partition.py)
    empty_tensors: bool = False

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        """None when this plugin can run the node on the device, else the reason."""
        ...

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        """A kernel for the node, computing the `fused` followers and the `prologue` nodes too. The
        kernels it loads are compiled first, side by side, where `compile_jobs` declares them
        (runtime/prebuild.py); any other it compiles as it goes."""
        ...

    def make_spec(self, node: NodeInfo) -> Any:
        """The node's normalised record (attributes resolved, shapes checked) that `supports`,
        `fuse` and `build` read as `node.spec`: the plan calls this once per node. Raise a
        PluginError when the node is not one this plugin can read; its text is the reason
        `opplugin plan` shows. None: the plugin keeps no record."""
        return None

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str | None:
        """The name `build` would give the kernel, without building it (what `opplugin plan`
        shows); None when only a build can tell."""
        return None

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Sequence[CompileJob]:
        """The kernel sources `build` will compile for the node, without compiling them: a runner
        compiles those the kernel cache lacks side by side before it builds (runtime/prebuild.py).
        None declared: the build compiles as it goes."""
        return ()

    def view_of(self, node: NodeInfo, output: str) -> Callable[[Any], Any] | None:
        """For a layout node whose `output` is a view of its first input (a Transpose, a Reshape): the
        function from that input's array (NumPy or CuPy) to the view; None for any other node. A step
        reading the output may then apply it itself (plan/input_views.py)."""
        return None

    def reads_views(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> bool:
        """True where the kernel `build` makes for `node` and `fused` reads its inputs as they lie, any strides:
        the plan may then hand it strided views in place of layout steps (plan/input_views.py)."""
        return False

    def fuse(self, node: NodeInfo, followers: Sequence[NodeInfo], device: Device) -> int:
        """How many of `followers` (the nodes after `node`, each the only reader of
        the one before) the node's kernel computes as well; 0: none."""
        return 0

    def fuse_prologue(self, node: NodeInfo, chain: Sequence[NodeInfo], data: str, device: Device) -> bool:
        """Whether the node's kernel applies `chain` (pointwise nodes in graph order from the tensor
        `data`, the last writing the node's first input) to its input as it loads it; asked only of a
        plugin with a `prologue_input`."""
        return False

    def variant_notes(self, node: NodeInfo, device: Device) -> dict[str, str | None]:
        """Per variant this plugin has, why it cannot run the node (None: it can)."""
        return {}

    def nonfinite_exact_variant(self, node: NodeInfo, device: Device) -> str | None:
        """A variant whose kernel keeps NaN and Inf where onnxruntime would, for the exact path's
        rerun of a chunk in which a kernel that does not met them (runtime/exact.py); None: none
        other than what `build` makes."""
        return None

    def precision_variant(self, node: NodeInfo, device: Device, precision: str, fused: Sequence[NodeInfo] = (),
                          prologue: Sequence[NodeInfo] = ()) -> PrecisionChoice:
        """The variant that runs the node, with `fused` and `prologue` as the plan made them, in `precision`
        ("tf32", "fp16" or "bf16": a run's --precision) on the device, for `build` and the other methods that
        take a variant; or none, with the reason the step stays FP32 (plan/precision.py asks each step whose op
        has no --variant); or, where the plugin has no kernel in `precision` but one in another reduced precision
        that suits it better than FP32, that variant with the reason (the step's precision is then its
        variant_precision). On the CPU device a variant that emulates the precision, where a GPU would run it.
        Default: none."""
        return PrecisionChoice(None, f"no {precision} kernel for {self.op_type}")

    def channel_last(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = ()) -> ChannelLast | None:
        """Which tensors the kernel `build` makes with `variant` (as the plan chose it under a reduced precision;
        None: the plugin's own choice) can keep channel-last in a 16-bit format, and in which (None: any);
        None: none (the default)."""
        return None

    def linked_variant(self, node: NodeInfo, device: Device, variant: str | None, inputs: frozenset[int], output: bool,
                       format: str, fused: Sequence[NodeInfo] = (), prologue: Sequence[NodeInfo] = ()) -> str:
        """`variant` taking the inputs at `inputs` and (where `output`) writing its output channel-last in `format`:
        only asked within what `channel_last` allowed, in the format it named (where it named none, the format
        of the tensors the plan links the step with)."""
        raise PluginError(f"{self.op_type} keeps no tensor channel-last")

    def variant_precision(self, node: NodeInfo, device: Device, variant: str | None) -> str:
        """The precision the kernel `build` makes with `variant` (None: the plugin's own choice) computes its
        products in: "fp32", or "tf32", "fp16", "bf16" for a variant that rounds its operands. Default: "fp32"."""
        return "fp32"


# What a plugin needs when it does not subclass Plugin (register's error message names them)
PLUGIN_MEMBERS = ("op_type", "group_kind", "prologue_input", "empty_tensors", "supports", "build", "make_spec", "kernel_name", "compile_jobs",
                  "fuse", "fuse_prologue", "variant_notes", "nonfinite_exact_variant", "precision_variant", "variant_precision", "view_of",
                  "reads_views", "channel_last", "linked_variant")


class GroupPlugin(Plugin, Protocol):
    """A plugin that also runs connected nodes together as one kernel (subclass it, as Plugin, for
    the defaults). Plugins of one `group_kind` share groups: the plan grows a group from each node
    such a plugin supports and no other plugin fused first, asking the lead node's plugin whether it
    `admits` each larger group, and builds the step with `build_group`."""

    group_kind: str

    def admits(self, group: NodeGroup, device: Device) -> str | None:
        """None when one kernel of this plugin can run `group`, else the reason."""
        ...

    def build_group(self, group: NodeGroup, device: Device, variant: str | None = None, graphed: bool = True) -> Kernel:
        """A kernel for `group`: given `group.inputs`, returning `group.outputs`."""
        ...

    def group_compile_jobs(self, group: NodeGroup, device: Device, variant: str | None = None,
                           graphed: bool = True) -> Sequence[CompileJob]:
        """The kernel sources `build_group` will compile (see Plugin.compile_jobs)."""
        return ()


_registry: dict[str, Plugin] = {}
_entry_points_loaded = False


def register(plugin: Plugin, *, replace: bool = False) -> Plugin:
    """Make `plugin` run its op type in every plan made from now on; `replace` to take the
    place of one already registered (a built-in, say)."""
    if isinstance(plugin, type) or not isinstance(plugin, Plugin):
        raise TypeError(
            f"{plugin!r} is not a Plugin instance: it needs {', '.join(PLUGIN_MEMBERS)} "
            "(subclass opplugin.registry.Plugin for the defaults of all but op_type, supports and build)"
        )
    if plugin.op_type in _registry and not replace and _registry[plugin.op_type] is not plugin:
        raise PluginError(f"a plugin for {plugin.op_type} is already registered; pass replace=True to override it")
    _registry[plugin.op_type] = plugin
    return plugin


def unregister(op_type: str) -> None:
    """Forget the plugin registered for `op_type`: its nodes go back to onnxruntime."""
    _registry.pop(op_type, None)


def _instance(obj: Any) -> Any:
    """An entry point may name a plugin class, a factory function, or an instance."""
    return obj() if isinstance(obj, type) or not isinstance(obj, Plugin) else obj


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in entry_points(group="opplugin.plugins"):
        register(_instance(entry.load()), replace=True)


def _load_builtins() -> None:
    for op_type, target in BUILTINS.items():
        if op_type not in _registry:
            module, attribute = target.split(":")
            register(_instance(getattr(importlib.import_module(module), attribute)))


def is_builtin(plugin: Plugin) -> bool:
    """Whether `plugin` is an instance of the built-in plugin class for its op type (not a user's or a third party's)."""
    target = BUILTINS.get(plugin.op_type)
    if target is None:
        return False
    module, attribute = target.split(":")
    return type(plugin) is getattr(importlib.import_module(module), attribute)


def plugins() -> dict[str, Plugin]:
    """All registered plugins by op type: built-ins, entry points, then API calls."""
    _load_builtins()
    _load_entry_points()
    return dict(_registry)


def plugin_for(op_type: str) -> Plugin | None:
    """The plugin that runs `op_type` (a registry key, see op_key), or None when onnxruntime does."""
    return plugins().get(op_type)


@runtime_checkable
class Declaration(Protocol):
    """A plugin that declares an op onnx does not know (a custom op): shape inference asks it for
    the outputs of the op's nodes (custom/declaration.py's CustomOp is one)."""

    op_type: str

    def check_arity(self, name: str, inputs: int, outputs: int) -> None:
        """Raise a PluginError where a node with this many inputs and outputs does not fit the declaration."""
        ...

    def output_types(self, name: str, inputs: Sequence[Any], attributes: dict[str, Any]) -> list[Any]:
        """The outputs' shapes and dtypes (objects with `shape` and `dtype`) for inputs given the same way."""
        ...

    def node_attributes(self, node: NodeInfo) -> dict[str, Any]:
        """The node's attributes over the declared defaults."""
        ...
