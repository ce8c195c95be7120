"""A group of pointwise nodes as one description: the values one kernel computes per element
(ops of ops.py over the group's inputs, constants and earlier values), the tensors it reads and
writes, and the shape it runs over. `evaluate` is the numpy reference (float64: the oracle and
the CPU device); codegen.py writes the CUDA source from the same record.

ONNX nodes lower here: most to one value of their own op; an inference BatchNormalization to
an `Affine` over the per-channel scale and shift it derives (float64, rounded to float32 for the
kernel); a Clip's constant bounds, a LeakyRelu's alpha, Gelu's form to parameters. A constant of
one element becomes a literal; a larger one an array the kernel holds.

Batch: axis 0 of the group's shape. A runtime tensor of the group's rank whose axis 0 has the
group's extent follows the batch (its rows are the run's), any other tensor broadcasts as
compiled. A constant with a batch axis of its own (the node's rank, more than one row) is
refused: it would not follow the batch through a run in chunks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...errors import PluginError
from ...graph.functions import OPPLUGIN_DOMAIN
from ...registry import NodeInfo
from .. import activation as activations
from .ops import GELU_TANH, OPS

FLOAT_TYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
ARITHMETIC_TYPES = FLOAT_TYPES[:2]  # float64 only crosses a group through a Cast
BOOL = np.dtype(np.bool_)
ONNX_TYPES = {1: np.dtype(np.float32), 10: np.dtype(np.float16), 11: np.dtype(np.float64)}  # Cast's `to` of the float types
NODE_OPS = (*OPS.keys() - {"Affine"}, "BatchNormalization")


@dataclass(frozen=True)
class Operand:
    """Where a value's operand comes from: a runtime input (kernel argument), a constant array the
    kernel holds, a literal, or an earlier value; `index` into the group's list of that kind."""

    kind: str  # "input", "constant", "literal", "value"
    index: int = 0
    literal: float = 0.0


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class Value:
    op: str
    operands: tuple[Operand, ...]
    params: tuple[float, ...]
    tensor: Tensor  # the node output it computes (its shape and type; a member of a lowered node: the node's)


@dataclass(frozen=True, eq=False)
class PointwiseGroup:
    values: tuple[Value, ...]
    # per kernel argument: the runtime tensor, or None for an argument the kernel ignores (a constant it holds)
    arguments: tuple[Tensor | None, ...]
    constants: tuple[np.ndarray, ...]  # float64, shaped to broadcast as ONNX's operand did
    outputs: tuple[tuple[int, Tensor], ...]  # (value index, output tensor), in the step's order
    shape: tuple[int, ...]  # the broadcast of every value's shape: what the kernel runs over

    @property
    def ops(self) -> list[str]:
        return [v.op for v in self.values]

    @property
    def suffix(self) -> str:
        """For kernel names: the ops in order, "sigmoid_mul"; past four, the first three and a count."""
        ops = [op.lower() for op in self.ops]
        return "_".join(ops) if len(ops) <= 4 else "_".join(ops[:3]) + f"_and{len(ops) - 3}more"

    def follows_batch(self, shape: Sequence[int]) -> bool:
        return len(self.shape) > 0 and len(shape) == len(self.shape) and shape[0] == self.shape[0]

    def batch_argument(self) -> int | None:
        """The kernel argument whose rows are the run's batch (None: the group has no batch axis to follow)."""
        return next((i for i, t in enumerate(self.arguments) if t is not None and self.follows_batch(t.shape)), None)

    def shape_at(self, shape: Sequence[int], rows: int) -> tuple[int, ...]:
        """A tensor's shape in a run of `rows` rows."""
        return (rows, *shape[1:]) if self.follows_batch(shape) else tuple(shape)

    def flops(self, rows: int) -> int:
        return self.elements(rows) * sum(OPS[v.op].flops * max(1, len(v.operands) - 1) for v in self.values)

    def elements(self, rows: int) -> int:
        return int(np.prod(self.shape_at(self.shape, rows), dtype=np.int64))

    def bytes_moved(self, rows: int) -> int:
        tensors = [t for t in self.arguments if t is not None] + [t for _, t in self.outputs]
        return sum(int(np.prod(self.shape_at(t.shape, rows), dtype=np.int64)) * t.dtype.itemsize for t in tensors)

    def evaluate(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """The outputs for the kernel's arguments (numpy), computed in float64 (bool stays bool) and
        returned in float64; a Cast rounds to its type, as its meaning is, and so does a float16 value."""
        inputs = [None if t is None else np.asarray(a, BOOL if t.dtype == BOOL else np.float64)
                  for t, a in zip(self.arguments, arrays)]
        values: list[np.ndarray] = []
        with np.errstate(all="ignore"):
            for value in self.values:
                operands = [self._operand(o, inputs, values) for o in value.operands]
                result = np.asarray(OPS[value.op].meaning(operands, value.params), np.float64)
                if value.op == "Expand":
                    result = np.broadcast_to(result, value.tensor.shape)
                if value.op == "Cast" or value.tensor.dtype == np.float16:  # a float16 node's result is float16
                    result = result.astype(value.tensor.dtype).astype(np.float64)
                values.append(result)
        return [values[index] for index, _ in self.outputs]

    def _operand(self, operand: Operand, inputs: list, values: list) -> np.ndarray:
        if operand.kind == "input":
            return inputs[operand.index]
        if operand.kind == "constant":
            return self.constants[operand.index]
        if operand.kind == "literal":
            return np.float64(operand.literal)
        return values[operand.index]

    @classmethod
    def of(cls, nodes: Sequence[NodeInfo], arguments: Sequence[str], outputs: Sequence[str]) -> "PointwiseGroup":
        """The group of `nodes` (in graph order), given the runtime tensors `arguments` (a name that is
        one of the nodes' constants is an argument the kernel ignores) and writing `outputs`."""
        return _Lowering(nodes, arguments).finish(outputs)


class _Lowering:
    """Turns nodes into values, one node at a time."""

    def __init__(self, nodes: Sequence[NodeInfo], arguments: Sequence[str]):
        self.tensors = {t.name: Tensor(t.name, tuple(t.shape), np.dtype(t.dtype)) for n in nodes for t in [*n.inputs, *n.outputs] if t.name}
        self.constants_by_name = {name: value for n in nodes for name, value in n.constants.items()}
        self.arguments = [None if not name or name in self.constants_by_name else self.tensors[name] for name in arguments]
        self.argument_index = {name: i for i, name in enumerate(arguments) if name and name not in self.constants_by_name}
        self.values: list[Value] = []
        self.value_of: dict[str, int] = {}  # tensor name -> the value computing it
        self.constants: list[np.ndarray] = []
        self.derived: dict[str, int] = {}  # name -> index in `constants` of a constant a node derived (a BatchNormalization's)
        for node in nodes:
            self._lower(node)

    def finish(self, outputs: Sequence[str]) -> PointwiseGroup:
        missing = [o for o in outputs if o not in self.value_of]
        if missing:
            raise PluginError(f"the group computes no {missing}")
        try:
            shape = tuple(np.broadcast_shapes(*(v.tensor.shape for v in self.values)))
        except ValueError:
            raise PluginError("the nodes' shapes do not broadcast to one shape") from None
        group = PointwiseGroup(tuple(self.values), tuple(self.arguments), tuple(self.constants),
                               tuple((self.value_of[o], self.tensors[o]) for o in outputs), shape)
        for tensor in [*(t for t in group.arguments if t is not None), *(t for _, t in group.outputs)]:
            if len(tensor.shape) == len(shape) and shape and tensor.shape[0] not in (1, shape[0]):
                raise PluginError(f"{tensor.name} of shape {list(tensor.shape)} does not broadcast along the batch axis")
        return group

    # --- one node ---------------------------------------------------------------------------

    def _lower(self, node: NodeInfo) -> None:
        where = f"{node.op_type} {node.name}"
        if node.node.domain not in ("", "ai.onnx") and not (node.op_type == "Gelu" and node.node.domain == OPPLUGIN_DOMAIN):
            raise PluginError(f"{where}: domain {node.node.domain!r} is not ONNX's")
        outputs = [o for o in node.node.output if o]
        if len(outputs) != 1:
            raise PluginError(f"{where}: only one output is implemented, not {len(outputs)}")
        output = self.tensors[outputs[0]]
        op, names, params = self._op(node, where)
        low, high = OPS[op].arity
        if not low <= len(names) <= high:
            raise PluginError(f"{where}: {len(names)} operands; {op} takes {low} to {high}")
        if names and all(n in self.constants_by_name or n in self.derived for n in names):
            raise PluginError(f"{where}: every operand is a constant (constant folding removes such a node)")
        self._check_types(node, op, names, output, where)
        operands = tuple(self._operand(name, output, where) for name in names)
        self.value_of[output.name] = len(self.values)
        self.values.append(Value(op, operands, params, output))

    def _op(self, node: NodeInfo, where: str) -> tuple[str, list[str], tuple[float, ...]]:
        """(op of ops.py, operand tensor names, parameters) of a node."""
        inputs = [i for i in node.node.input]
        if node.op_type == "Gelu":
            form = node.attributes.get("approximate", "none")
            form = form.decode() if isinstance(form, bytes) else form
            if form not in ("none", "tanh"):
                raise PluginError(f"{where}: approximate={form!r} is not an ONNX Gelu form")
            return "Gelu", inputs, (GELU_TANH if form == "tanh" else 0.0, 0.0)
        if node.op_type in activations.KINDS:
            activation = activations.from_node(node)
            if activation is None:
                raise PluginError(f"{where}: a bound computed at run time cannot be compiled in")
            return node.op_type, inputs[:1], (activation.a, activation.b)
        if node.op_type == "Elu":
            return "Elu", inputs, (float(node.attributes.get("alpha", 1.0)),)
        if node.op_type == "BatchNormalization":
            return self._batch_norm(node, where)
        if node.op_type == "Cast":
            target = ONNX_TYPES.get(int(node.attributes.get("to", 0)))
            if target is None:
                raise PluginError(f"{where}: only casts between float16, float32 and float64 are implemented")
            return "Cast", inputs, ()
        if node.op_type == "Expand":
            if len(inputs) != 2 or inputs[1] not in self.constants_by_name:
                raise PluginError(f"{where}: the shape to expand to is computed at run time")
            return "Expand", inputs[:1], ()
        if node.op_type not in OPS or node.op_type == "Affine":
            raise PluginError(f"{where}: {node.op_type} is no pointwise op")
        if any(not name for name in inputs):
            raise PluginError(f"{where}: an empty operand name")
        return node.op_type, inputs, ()

    def _batch_norm(self, node: NodeInfo, where: str) -> tuple[str, list[str], tuple[float, ...]]:
        """x * a + b, with a = scale / sqrt(var + epsilon) and b = B - mean * a per channel (axis 1)."""
        if int(node.attributes.get("training_mode", 0)):
            raise PluginError(f"{where}: training mode is not inference")
        names = list(node.node.input)
        if len(names) != 5 or any(n not in self.constants_by_name for n in names[1:]):
            raise PluginError(f"{where}: scale, B, mean and var must be constants")
        x = self.tensors[names[0]]
        if len(x.shape) < 2:
            raise PluginError(f"{where}: X must have a channel axis")
        scale, bias, mean, var = (np.asarray(self.constants_by_name[n], np.float64).reshape(-1) for n in names[1:])
        epsilon = float(node.attributes.get("epsilon", 1e-5))
        a = scale / np.sqrt(var + epsilon)
        b = bias - mean * a
        channel = (x.shape[1],) + (1,) * (len(x.shape) - 2)
        for derived, name in ((a, f"{node.name}/scale"), (b, f"{node.name}/shift")):
            self.derived[name] = len(self.constants)
            self.constants.append(derived.reshape(channel))
            self.tensors[name] = Tensor(name, channel, np.dtype(np.float32))
        return "Affine", [names[0], f"{node.name}/scale", f"{node.name}/shift"], ()

    def _check_types(self, node: NodeInfo, op: str, names: list[str], output: Tensor, where: str) -> None:
        types = [self.tensors[n].dtype for n in names]
        if op == "Cast":
            if types[0] not in FLOAT_TYPES or output.dtype not in FLOAT_TYPES:
                raise PluginError(f"{where}: only casts between float16, float32 and float64 are implemented")
            if types[0] == FLOAT_TYPES[2] and output.dtype == FLOAT_TYPES[0]:
                raise PluginError(f"{where}: a cast from float64 to float16 would round twice through float32")
            return
        if op == "Where":
            if types[0] != BOOL:
                raise PluginError(f"{where}: the condition must be a bool tensor")
            types = types[1:]
        if any(t not in ARITHMETIC_TYPES for t in [*types, output.dtype]):
            raise PluginError(f"{where}: arithmetic on {sorted({str(t) for t in [*types, output.dtype]})} is not implemented "
                              "(float32 and float16 are)")

    def _operand(self, name: str, output: Tensor, where: str) -> Operand:
        if name in self.value_of:
            return Operand("value", self.value_of[name])
        if name in self.derived:
            return Operand("constant", self.derived[name])
        if name in self.constants_by_name:
            value = np.asarray(self.constants_by_name[name])
            if value.size == 1 and value.ndim <= len(output.shape):
                return Operand("literal", literal=float(value.reshape(())) if value.dtype != BOOL else float(bool(value.reshape(()))))
            if value.ndim == len(output.shape) and value.ndim and value.shape[0] > 1:
                raise PluginError(f"{where}: the constant {name} of shape {list(value.shape)} has a batch axis; "
                                  "it would not follow the batch through a run in chunks")
            self.constants.append(value.astype(BOOL if value.dtype == BOOL else np.float64))
            return Operand("constant", len(self.constants) - 1)
        if name not in self.argument_index:
            raise PluginError(f"{where}: {name} is neither computed in the group nor given to it")
        return Operand("input", self.argument_index[name])
