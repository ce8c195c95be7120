"""A custom operator declared in Python, in the spirit of MXNet's CustomOp and CustomOpProp:
its domain and op type, its inputs, outputs and attributes, how its outputs' shapes and
dtypes follow from its inputs, a numpy reference that `check` runs in float64, and the
kernels that implement it.

    swish = CustomOp("example.ops", "Swish", inputs=["X"], outputs=["Y"], attributes={"beta": 1.0},
                     reference=lambda x, beta: x / (1 + np.exp(-beta * x)))
    swish.implement(CuPy(lambda x, beta: x / (1 + cupy.exp(-beta * x))))

A declaration is a plugin (registry.Plugin) of the op key "example.ops::Swish": `register`,
the ``opplugin.plugins`` entry points, `Runner(ops=[swish])` and `--ops FILE.py` all take it.
Its reference alone runs it on the CPU; on a GPU each implementation is a variant, the first
the default, and the reference runs where none can (copied to the host and back).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from ..gpu.device import Device
from ..registry import Kernel, NodeInfo, Plugin, TensorInfo, op_key
from . import choices
from .calling import DeclarationError, accepted, run_reference
from .outputs import batched_inputs
from .reference import ReferenceKernel


@dataclass(frozen=True)
class DeviceCode:
    """An implementation's kernel as the GPU's tools see it (--sanitize, --watch): the name its
    entry point has on the device, the file its lines are in and that file's text, and whether
    it uses shared memory (racecheck's business)."""

    label: str
    entry: str
    path: str
    text: str
    shared_memory: bool = False
    is_file: bool = True  # False: source text given inline, no file to watch


class Implementation:
    """One kernel for a custom op (CudaSource, CuPy, Triton): `variants` names what it offers
    (an autotuned Triton kernel offers each configuration), `build` makes the Kernel of one,
    `device_code` says where its device code is (None: a Python callable, whose kernels have no
    name known in advance)."""

    name: str = ""

    def variants(self) -> list[str]:
        return [self.name]

    def unsupported_reason(self, op: "CustomOp", node: NodeInfo, device: Device) -> str | None:
        return None if device.is_cuda else f"{self.name} needs a GPU"

    def build(self, op: "CustomOp", node: NodeInfo, device: Device, variant: str, poison: bool) -> Kernel:
        raise NotImplementedError

    def device_code(self, op: "CustomOp") -> DeviceCode | None:
        return None


class CustomOp(Plugin):
    """The declaration of one op, and the plugin that runs its nodes (see the module's docstring).

    `inputs` and `outputs` are names; an input named with a trailing "?" is optional (a node may
    leave it out or give ""). `attributes` maps each attribute to its default (REQUIRED: the node
    must give it; None: the reference is given None where the node leaves it out). For an ONNX op
    (domain "" and a standard op type: a user's own Conv, say) what is left out comes from the op's
    schema, and onnx's own shape inference holds. `shapes(*inputs, **attributes)`, given each input's TensorInfo (name, shape, dtype), returns
    each output's (shape, dtype) (a pair alone for one output); by default each output has the
    first input's shape and dtype.
    `reference(*inputs, **attributes)` computes the outputs from float64 arrays (integers stay as
    they are); `check` holds every implementation to it."""

    def __init__(self, domain: str, op_type: str, *, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None,
                 attributes: Mapping[str, Any] | None = None, reference: Callable[..., Any] | None = None,
                 shapes: Callable[..., Any] | None = None, implementations: Sequence[Implementation] = ()):
        if not op_type or not isinstance(op_type, str):
            raise DeclarationError(f"a custom op needs an op type, got {op_type!r}")
        self.domain, self.name = domain or "", op_type
        self.op_type = op_key(self.domain, op_type)
        schema = onnx_schema(self.domain, op_type) if self.op_type == op_type else None
        if schema is not None:  # an ONNX op: what the declaration leaves out, its schema says
            inputs = schema_inputs(schema) if inputs is None else inputs
            outputs = [o.name for o in schema.outputs] if outputs is None else outputs
            attributes = schema_attributes(schema) if attributes is None else attributes
        self.input_names = [name.rstrip("?") for name in inputs or ()]
        self.required_inputs = sum(1 for name in inputs or () if not name.endswith("?"))
        self.output_names = list(outputs or ())  # none: a model function's, when it declares one (functions.py)
        self.attributes = dict(attributes or {})
        self.reference_function = reference
        self.shape_function = shapes
        self.implementations: list[Implementation] = []
        self.poison = False  # outputs filled with NaN before each launch (check's setting, `poisoned`)
        for implementation in implementations:
            self.implement(implementation)

    def __repr__(self) -> str:
        return f"CustomOp({self.op_type}, {len(self.implementations)} implementation(s))"

    def poisoned(self) -> "CustomOp":
        """This declaration, its kernels' outputs filled with NaN before each launch: what a kernel
        leaves unwritten then shows in a check."""
        twin = copy.copy(self)
        twin.poison = True
        return twin

    # --- declaring -----------------------------------------------------------------------

    def reference(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: the float64 reference."""
        self.reference_function = function
        return function

    def shapes(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: the outputs' shapes and dtypes from the inputs'."""
        self.shape_function = function
        return function

    def implement(self, implementation: Implementation) -> Implementation:
        """Add a kernel; the first one added is the default on a GPU."""
        if not isinstance(implementation, Implementation):
            raise DeclarationError(f"{self.op_type}: {implementation!r} is not an implementation (CudaSource, CuPy or Triton)")
        taken = {v for i in self.implementations for v in i.variants()}
        clash = taken.intersection(implementation.variants())
        if clash:
            raise DeclarationError(f"{self.op_type}: two implementations named {sorted(clash)[0]!r}; give one another name")
        self.implementations.append(implementation)
        return implementation

    # --- reading a node --------------------------------------------------------------------

    def node_attributes(self, node: NodeInfo) -> dict[str, Any]:
        """The node's attributes over the declared defaults: DeclarationError for one the
        declaration does not have, or one it requires that the node lacks."""
        unknown = sorted(set(node.attributes) - set(self.attributes))
        if unknown:
            raise DeclarationError(f"{node.name}: {self.op_type} declares no attribute {unknown[0]!r} "
                                   f"(it declares {', '.join(self.attributes) or 'none'})")
        values = {**self.attributes, **{k: _plain(v) for k, v in node.attributes.items()}}
        missing = [name for name, value in values.items() if value is REQUIRED]
        if missing:
            raise DeclarationError(f"{node.name}: {self.op_type} needs attribute {missing[0]!r}, which the node does not give")
        return values

    def check_arity(self, name: str, inputs: int, outputs: int) -> None:
        """DeclarationError where a node's input or output count does not match the declaration."""
        if not self.required_inputs <= inputs <= len(self.input_names):
            wanted = (f"{self.required_inputs} to {len(self.input_names)}" if self.required_inputs < len(self.input_names)
                      else str(len(self.input_names)))
            raise DeclarationError(f"{name}: {self.op_type} takes {wanted} inputs ({', '.join(self.input_names)}), "
                                   f"the node gives {inputs}")
        if not self.output_names:
            raise DeclarationError(f"{name}: {self.op_type} declares no outputs (and is no function of the model)")
        if outputs != len(self.output_names):
            raise DeclarationError(f"{name}: {self.op_type} declares {len(self.output_names)} outputs "
                                   f"({', '.join(self.output_names)}), the node has {outputs}")

    def output_types(self, name: str, inputs: Sequence[TensorInfo], attributes: Mapping[str, Any]) -> list[TensorInfo]:
        """The outputs' shapes and dtypes (unnamed TensorInfos) for these inputs (what shape inference asks)."""
        if self.shape_function is None:
            return [TensorInfo("", tuple(inputs[0].shape), np.dtype(inputs[0].dtype))] * len(self.output_names)
        try:
            given = self.shape_function(*inputs, **accepted(self.shape_function, attributes))
        except Exception as err:
            raise DeclarationError(f"{name}: the shape function of {self.op_type} raised {type(err).__name__}: {err}") from None
        given = [given] if _is_pair(given) or hasattr(given, "shape") else list(given)
        if len(given) != len(self.output_names):
            raise DeclarationError(f"{name}: the shape function of {self.op_type} gave {len(given)} outputs, "
                                   f"it declares {len(self.output_names)}")
        return [_tensor_type(name, self.op_type, item) for item in given]

    def call_reference(self, name: str, inputs: Sequence[np.ndarray | None], attributes: Mapping[str, Any]) -> list[np.ndarray]:
        """The reference's outputs in float64 (see run_reference)."""
        if self.reference_function is None:
            raise DeclarationError(f"{self.op_type} declares no reference; `check` and the CPU need one")
        return run_reference(self.reference_function, self.op_type, name, inputs, attributes, len(self.output_names))

    # --- the plugin ------------------------------------------------------------------------

    def make_spec(self, node: NodeInfo) -> dict[str, Any]:
        """The node's attributes over the defaults; a DeclarationError where the node does not fit."""
        self.check_arity(node.name, sum(1 for t in node.inputs if t.name) if node.inputs else 0, len(node.outputs))
        return self.node_attributes(node)

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        return None  # the reference runs anywhere: no custom node is left to onnxruntime

    def variant_names(self) -> list[str]:
        return [v for i in self.implementations for v in i.variants()]

    def variant_notes(self, node: NodeInfo, device: Device) -> dict[str, str | None]:
        notes = {"reference": None}
        for implementation in self.implementations:
            for variant in implementation.variants():
                notes[variant] = implementation.unsupported_reason(self, node, device)
        return notes

    def default_variant(self, node: NodeInfo, device: Device) -> str:
        """What `opplugin tune` chose for the node here, else the first implementation that can run
        it, else the reference."""
        notes = self.variant_notes(node, device)
        tuned = choices.load().get(self.choice_key(node, device)) if device.is_cuda else None
        if tuned is not None and notes.get(tuned, "gone") is None:
            return tuned
        return next((v for v in self.variant_names() if notes.get(v) is None), "reference")

    def choice_key(self, node: NodeInfo, device: Device) -> str:
        """What a tuned choice for this node on this device is filed under (choices.py): its inputs'
        shapes without the batch, so that the choice holds for every chunk a run cuts the batch into."""
        attributes = node.spec if node.spec is not None else self.make_spec(node)
        shapes = [tuple(t.shape[1:]) if batched else tuple(t.shape) for t, batched in zip(node.inputs, batched_inputs(node)) if t.name]
        return choices.choice_key(self.op_type, device.name, shapes, attributes, self.variant_names())

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str | None:
        return f"{self.name}.{variant or self.default_variant(node, device)}"

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        variant = variant or self.default_variant(node, device)
        attributes = node.spec if node.spec is not None else self.make_spec(node)
        if variant == "reference":
            return ReferenceKernel(self, node, attributes, device)
        implementation = next((i for i in self.implementations if variant in i.variants()), None)
        if implementation is None:
            raise DeclarationError(f"{self.op_type} has no implementation {variant!r}; it has "
                                   f"{', '.join(['reference', *self.variant_names()])}")
        reason = implementation.unsupported_reason(self, node, device)
        if reason is not None:
            raise DeclarationError(f"{node.name}: {variant} cannot run it: {reason}")
        kernel = implementation.build(self, node, device, variant, self.poison)
        kernel.variant = variant
        return kernel


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # an attribute's default that says the node must give it


def onnx_schema(domain: str, op_type: str):
    """The ONNX schema of a standard op (None for any other)."""
    try:
        return onnx.defs.get_schema(op_type, domain="" if domain == "ai.onnx" else domain)
    except onnx.defs.SchemaError:
        return None


def schema_inputs(schema) -> list[str]:
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    return [p.name + ("?" if p.option == optional else "") for p in schema.inputs]


def schema_attributes(schema) -> dict[str, Any]:
    """Each attribute's default as the schema gives it; REQUIRED, or None where it gives none."""
    attributes = {}
    for name, attribute in schema.attributes.items():
        if attribute.required:
            attributes[name] = REQUIRED
        else:
            attributes[name] = _plain(onnx.helper.get_attribute_value(attribute.default_value)) if attribute.default_value.type else None
    return attributes


def _plain(value: Any) -> Any:
    """An ONNX attribute as a Python value (bytes as str, repeated fields as lists)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _is_pair(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], (tuple, list)) and not isinstance(value[1], (tuple, list))


def _tensor_type(name: str, op: str, item: Any) -> TensorInfo:
    """An unnamed TensorInfo from what a shape function returned for one output: a (shape, dtype)
    pair, or anything with a shape and dtype (a TensorInfo it was given, a numpy array)."""
    if hasattr(item, "shape") and hasattr(item, "dtype"):
        shape, dtype = item.shape, item.dtype
    elif _is_pair(item):
        shape, dtype = item
    else:
        raise DeclarationError(f"{name}: the shape function of {op} returned {item!r}; give (shape, dtype) per output")
    try:
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
    except (TypeError, ValueError) as err:
        raise DeclarationError(f"{name}: the shape function of {op} returned shape {shape!r}, dtype {dtype!r}: {err}") from None
    if any(d < 0 for d in shape):
        raise DeclarationError(f"{name}: the shape function of {op} returned a negative dimension: {list(shape)}")
    return TensorInfo("", shape, dtype)
