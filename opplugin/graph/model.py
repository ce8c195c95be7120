"""Loading and validating ONNX models, and shape inference for a given batch."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import InputError, ModelError, OpPluginError, first_line, positive_int
from ..registry import Declaration, NodeInfo, TensorInfo, plugin_for
from ..core.paths import models_dir
from .simplify import Simplification, simplify_apart
from .bare import copy_without_initializers, skeleton, with_initializers
from . import declared_shapes
from .attributes import attributes
from .functions import inline_functions

SHIPPED_MODELS = ("lenet86", "ece408_high", "mlp_onehidden")
# lenet86 with an op onnxruntime does not know in place of its Relus, declared in
# models/lenet86_swish_ops.py (tools/make_custom_example.py): run it with --ops that file
CUSTOM_OP_EXAMPLES = ("lenet86_swish",)
BUNDLED_MODELS = SHIPPED_MODELS + CUSTOM_OP_EXAMPLES

# Batches a run takes when none is asked for: the whole bundled test set for the
# shipped models; for another model with a dynamic batch, a quick first run (the
# CPU runs plugin steps through the numpy reference, so it gets fewer images).
SHIPPED_BATCH = 10000
DYNAMIC_BATCH_GPU = 32
DYNAMIC_BATCH_CPU = 8

# File names (without .onnx) that say nothing about the model; the graph's name says more.
GENERIC_NAMES = {"model", "graph", "network", "net", "main_graph", "torch_jit", "torch-jit-export", "inference", "export"}


def resolve_model_path(model: str | Path) -> Path:
    """A path, or the name of a shipped model ("lenet86")."""
    path = Path(model)
    if not path.exists() and str(model) in BUNDLED_MODELS:
        path = models_dir() / f"{model}.onnx"
    return path


class Model:
    """A validated ONNX model. The batch is the first axis of every graph input.
    `proto` is what runs (simplified at load); `original` is the graph as the file
    gave it, which `check` runs in onnxruntime as the reference (the same as `proto`
    when none is given).

    Given `weights`, `proto` is bare (carries none of its initializers, see
    bare.py) and `weights` are its initializers as arrays: the weights then exist
    once as arrays (and in `original`), and the whole simplified proto is made only
    where something asks for it."""

    def __init__(self, proto: onnx.ModelProto, name: str, original: onnx.ModelProto | None = None,
                 simplification: Simplification | None = None, *, weights: dict[str, np.ndarray] | None = None):
        self.name = name
        self.simplification = simplification or Simplification()
        self._bare = proto if weights is not None else copy_without_initializers(proto)
        self._whole = None if weights is not None else proto
        if original is not None and not self.simplification.changed:
            self._whole = original  # what simplifying left alone is the graph as loaded
        self.original = original if original is not None else self.proto
        graph = self._bare.graph
        name_unnamed_nodes(graph)
        if weights is None:
            weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        self.initializers: dict[str, np.ndarray] = weights
        self.inputs: list[onnx.ValueInfoProto] = [i for i in graph.input if i.name not in self.initializers]
        self.outputs: list[str] = [o.name for o in graph.output]
        if not self.outputs:  # load_model says so first; this is for a model built in Python
            raise ModelError(f"{self.name}: its graph has no outputs, so a run would compute nothing to give back")
        self._inferred: dict[int, dict[str, TensorInfo]] = {}  # batch -> infer(batch)
        # custom ops declared for this model (`declare`), before those registered (registry.Declaration)
        self.declarations: dict[str, Declaration] = {}
        for value in self.inputs:
            elem = value.type.tensor_type.elem_type
            if elem != onnx.TensorProto.FLOAT:
                raise ModelError(
                    f"{self.name}: input {value.name!r} is {helper.tensor_dtype_to_np_dtype(elem)}; opplugin runs float32 models"
                )
            if not value.type.tensor_type.HasField("shape"):
                raise ModelError(f"{self.name}: input {value.name!r} has no shape")

    @property
    def proto(self) -> onnx.ModelProto:
        """The whole model, weights included (made on first use when the model holds them as arrays)."""
        if self._whole is None:
            self._whole = with_initializers(self._bare, self.initializers)
        return self._whole

    @property
    def bare(self) -> onnx.ModelProto:
        """The model without its initializers (see bare.py): opset, IR version, graph structure."""
        return self._bare

    @property
    def fixed_batch(self) -> int | None:
        """The batch the model runs at when every graph input's first axis is a fixed
        number (that of the first input that is not a Conv's weights); None when some
        input's batch is free."""
        dims = [v.type.tensor_type.shape.dim for v in self.inputs]
        if not dims or any(not d or not d[0].HasField("dim_value") for d in dims):
            return None
        return int(self.batch_input.type.tensor_type.shape.dim[0].dim_value)

    @property
    def batch_input(self) -> onnx.ValueInfoProto:
        """The input whose first axis is the batch: the first one that is not a Conv's weights."""
        weights = set(self.weight_inputs())
        return next((v for v in self.inputs if v.name not in weights), self.inputs[0])

    def weight_inputs(self) -> list[str]:
        """Graph inputs that a Conv reads as its weights or bias: a run fills them with data too."""
        names = {v.name for v in self.inputs}
        read = [n for node in self._bare.graph.node if node.op_type == "Conv" for n in node.input[1:3]]
        return [n for n in dict.fromkeys(read) if n in names]

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        return list(self._bare.graph.node)

    def set_input_sizes(self, sizes: dict[str, dict[int, int]]) -> None:
        """Give graph inputs' free axes a size ({input: {axis: size}}), in the graph that runs, the
        whole model if made, and the graph as loaded; shapes inferred before are forgotten."""
        graphs = {id(g): g for g in (self._bare.graph, self.original.graph, *([self._whole.graph] if self._whole else []))}
        for graph in graphs.values():
            for value in graph.input:
                for axis, size in sizes.get(value.name, {}).items():
                    value.type.tensor_type.shape.dim[axis].dim_value = size
        self._inferred.clear()

    def input_shape(self, name: str | None = None) -> tuple[int | str, ...]:
        """The declared shape of an input: ints, or names for symbolic axes."""
        value = self._input(name)
        return tuple(d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in value.type.tensor_type.shape.dim)

    def sample_shape(self, name: str | None = None) -> tuple[int, ...]:
        """The shape of one sample (the input shape without the batch axis)."""
        shape = self.input_shape(name)[1:]
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ModelError(f"{self.name}: only the batch axis may be symbolic, input shape is {shape}")
        return shape  # type: ignore[return-value]

    def _input(self, name: str | None) -> onnx.ValueInfoProto:
        if name is None:
            return self.inputs[0]
        for value in self.inputs:
            if value.name == name:
                return value
        raise InputError(f"{self.name} has no input {name!r}; its inputs are {[i.name for i in self.inputs]}")

    def with_batch(self, batch: int) -> onnx.ModelProto:
        """The model's skeleton (see bare.py) whose graph inputs with a symbolic (or unset)
        first axis have `batch` there. Inputs with a fixed first axis (weights fed as inputs,
        say) keep it; a model whose inputs are all fixed runs only at its own batch."""
        batch = positive_int(batch, "batch")
        if self.fixed_batch is not None and self.fixed_batch != batch:
            fixed = self.fixed_batch
            raise InputError(f"{self.name}: input {self.batch_input.name!r} has a fixed batch of {fixed}; run it with batch {fixed}")
        return skeleton(self._bare, self.initializers, batch)

    def input_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        """The shape of each graph input at this batch."""
        tensors = self.infer(batch)
        return {value.name: tensors[value.name].shape for value in self.inputs}

    def infer(self, batch: int) -> dict[str, TensorInfo]:
        """Shape and dtype of every tensor in the graph for this batch (inferred once per batch)."""
        if batch not in self._inferred:
            self._inferred[batch] = self._infer(batch)
        return dict(self._inferred[batch])

    def declare(self, declarations: "list[Declaration]") -> None:
        """Run shape inference through these custom ops' nodes (a Runner's `ops`); shapes inferred before are forgotten."""
        self.declarations.update({d.op_type: d for d in declarations})
        self._inferred.clear()

    def declaration(self, key: str) -> Declaration | None:
        """The declaration of the custom op filed under `key` (registry.op_key): the model's own, else a registered one."""
        if key in self.declarations:
            return self.declarations[key]
        plugin = plugin_for(key)
        return plugin if isinstance(plugin, Declaration) else None

    def custom_nodes(self) -> list[onnx.NodeProto]:
        """Nodes onnx does not know (see declared_shapes.custom_nodes)."""
        return declared_shapes.custom_nodes(self._bare)

    def _infer(self, batch: int) -> dict[str, TensorInfo]:
        proto = self.with_batch(batch)
        try:
            inferred = declared_shapes.infer(proto, self.declaration)
        except OpPluginError:
            raise
        except Exception as err:  # onnx raises several unrelated types here
            raise ModelError(f"{self.name}: shape inference failed: {err}") from None
        tensors: dict[str, TensorInfo] = {}
        graph = inferred.graph
        for value in [*graph.input, *graph.value_info, *graph.output]:
            tensor_type = value.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
            tensors[value.name] = TensorInfo(value.name, dims, np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
        for name, array in self.initializers.items():
            tensors[name] = TensorInfo(name, tuple(array.shape), array.dtype)
        return tensors

    def node_infos(self, batch: int, tensors: dict[str, TensorInfo] | None = None) -> list[NodeInfo]:
        """Every node as plugins see it; pass `tensors` from `infer(batch)` to skip inferring again."""
        tensors = self.infer(batch) if tensors is None else tensors
        missing = TensorInfo("", (), np.dtype(np.float32))
        opset = next((o.version for o in self._bare.opset_import if o.domain in ("", "ai.onnx")), 0)
        infos = []
        for node in self._bare.graph.node:
            infos.append(
                NodeInfo(
                    node=node,
                    inputs=[tensors.get(n, TensorInfo(n, (), np.dtype(np.float32))) if n else missing for n in node.input],
                    outputs=[tensors.get(n, TensorInfo(n, (), np.dtype(np.float32))) for n in node.output],
                    attributes=attributes(node),
                    constants={n: self.initializers[n] for n in node.input if n in self.initializers},
                    opset=opset,
                    batch=batch,
                )
            )
        return infos


def name_unnamed_nodes(graph: onnx.GraphProto) -> None:
    """Give each unnamed node a readable name, its op type and index ("Conv_3"), so a
    step is not called by its output tensor (often a bare number)."""
    taken = {node.name for node in graph.node if node.name}
    for index, node in enumerate(graph.node):
        if node.name:
            continue
        name, suffix = f"{node.op_type}_{index}", 1
        while name in taken:
            name, suffix = f"{node.op_type}_{index}_{suffix}", suffix + 1
        node.name = name
        taken.add(name)


def display_name(path: Path, proto: onnx.ModelProto) -> str:
    """The file's name, unless it says nothing ("model.onnx"): then the graph's name,
    else the folder's (model zoos ship "resnet50/model.onnx")."""
    for candidate in (path.stem, proto.graph.name, path.resolve().parent.name):
        if candidate and candidate.strip().lower() not in GENERIC_NAMES:
            return candidate.strip()
    return path.stem


def default_batch(model: Model, device) -> int:
    """The batch a run takes when none is asked for (see SHIPPED_BATCH)."""
    if model.fixed_batch is not None:
        return model.fixed_batch
    if model.name in BUNDLED_MODELS:
        return SHIPPED_BATCH
    return DYNAMIC_BATCH_GPU if device.is_cuda else DYNAMIC_BATCH_CPU


def choose_batch(model: Model, requested: int | None, device, *, default: int | None = None) -> int:
    """`requested`, or when None `default` (else default_batch) for a model with a free
    batch and the model's own for a fixed one. InputError when a fixed-batch model
    is asked for another batch."""
    fixed = model.fixed_batch
    if fixed == 0:  # onnxruntime gives back empty outputs; a run, its report and check need an image
        name = model.batch_input.name
        raise ModelError(f"{model.name} has a fixed batch of 0 (input {name!r} is {list(model.input_shape(name))}): "
                         f"an empty batch, and opplugin runs at least one image")
    if requested is None:
        return fixed if fixed is not None else (default if default is not None else default_batch(model, device))
    requested = positive_int(requested, "--batch")
    if fixed is not None and requested != fixed:
        name = model.batch_input.name
        raise InputError(f"--batch {requested}: {model.name} has a fixed batch of {fixed} (input {name!r} is "
                         f"{list(model.input_shape(name))}); leave --batch out or give {fixed}")
    return requested


def _checker_message(err: Exception) -> str:
    """onnx's checker puts what is wrong on the first line and which node on a later
    "==> Context:" line; both, as one line."""
    lines = [line.strip().removeprefix("==> Context:").strip() for line in str(err).splitlines()]
    return "; ".join(line for line in lines if line) or type(err).__name__


def _load_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Read tensors kept in external data files, found beside the model file whatever
    the working directory, into the proto: the sub-models handed to onnxruntime then
    carry their weights inline."""
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    if not any(uses_external_data(t) for t in proto.graph.initializer):
        return
    try:
        load_external_data_for_model(proto, str(path.resolve().parent))
    except Exception as err:  # onnx raises FileNotFoundError, ValidationError, ... here
        raise ModelError(f"{path}: cannot read its external data: {first_line(err)}") from None


def load_model(model: str | Path, *, keep_functions: Iterable[tuple[str, str]] = (), keep: Iterable[str] = ()) -> Model:
    """Load and check an ONNX model file (or a shipped model by name); ModelError says what is wrong.
    Calls of the model's own functions are inlined, but those of `keep_functions` ((domain, name):
    functions a custom op declares, which then run as one node). Load-time simplification leaves out a
    pass that would remove a tensor of `keep` (the tensors runs will hand back: --keep), and says so."""
    path = resolve_model_path(model)
    if not path.exists():
        shipped = ", ".join(BUNDLED_MODELS)
        raise ModelError(f"model file not found: {path} (shipped models: {shipped})")
    if path.is_dir():
        raise ModelError(f"{path} is a folder, not an ONNX model file")
    if not path.is_file():  # a pipe would hold the load until something writes to it
        raise ModelError(f"{path} is not a regular file (a pipe, socket or device), not an ONNX model file")
    data = path.read_bytes()
    if not data:
        raise ModelError(f"{path} is empty")
    try:
        proto = onnx.load_from_string(data)
    except Exception as err:
        raise ModelError(f"{path} is not an ONNX model (or is truncated): {type(err).__name__}: {err}") from None
    if not proto.graph.node:
        raise ModelError(f"{path} is not an ONNX model: its graph has no nodes")
    _refuse_outputs_no_node_writes(proto.graph, path)
    _load_external_data(proto, path)
    try:
        onnx.checker.check_model(proto, full_check=False)
    except onnx.checker.ValidationError as err:
        raise ModelError(f"{path} fails onnx's checker: {_checker_message(err)}") from None
    proto = inline_functions(proto, frozenset(keep_functions))
    name_unnamed_nodes(proto.graph)  # before simplifying, so a node has the same name in both graphs
    bare, constants, done = _simplified(proto, path, keep)
    return Model(bare, display_name(path, proto), original=proto, simplification=done, weights=constants)


def _refuse_outputs_no_node_writes(graph: onnx.GraphProto, path: Path) -> None:
    """ModelError for a graph without outputs, or with an output that no node writes (a graph input or
    a weight handed back as it is): opplugin's runs give back what their steps compute."""
    if not graph.output:
        raise ModelError(f"{path}: its graph has no outputs, so a run would compute nothing to give back")
    written = {o for node in graph.node for o in node.output}
    idle = next((o.name for o in graph.output if o.name not in written), None)
    if idle is not None:
        raise ModelError(f"{path}: output {idle!r} is a graph input or a weight that no node computes; opplugin runs "
                         f"graphs whose outputs their nodes compute (an Identity node can write a copy)")


class SimplificationWarning(UserWarning):
    """Load-time simplification failed; the model runs as loaded."""


def _simplified(proto: onnx.ModelProto, path: Path, keep: Iterable[str] = ()) -> tuple[onnx.ModelProto, dict[str, np.ndarray], Simplification]:
    """The simplified graph without its initializers, checked by onnx's checker, and its
    initializers as arrays; the graph as loaded (after one warning) if simplifying fails: a
    model that runs unsimplified beats one that cannot load."""
    try:
        bare, constants, done = simplify_apart(proto, keep)
        if done.changed:
            onnx.checker.check_model(skeleton(bare, constants), full_check=False)
        return bare, constants, done
    except Exception as err:  # any failure here is ours, not the model's
        warnings.warn(f"opplugin: {path}: graph simplification failed, running the graph as loaded: {first_line(err)}",
                      SimplificationWarning, stacklevel=3)
        return copy_without_initializers(proto), {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}, Simplification()
