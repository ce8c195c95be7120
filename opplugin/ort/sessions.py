"""onnxruntime sessions: the one quiet set-up every session shares, the CUDA
provider's options, and the reference (the unmodified model on the CPU provider)."""
from __future__ import annotations

import contextlib
import copy
import io
import re
from typing import Any, Callable, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from ..core.node_reads import reads

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


def quiet() -> ort.RunOptions:
    """Run options that log nothing: a run that fails raises its error, and the log would only say it again."""
    options = ort.RunOptions()
    options.log_severity_level = 4
    return options


def session(model: onnx.ModelProto, providers: Sequence[Any] = (CPU_PROVIDER,), *, arena: bool = True,
            optimization: ort.GraphOptimizationLevel | None = None) -> ort.InferenceSession:
    """A session that logs errors only. `arena=False` stops the CPU provider keeping
    (and rounding up to a power of two) its largest allocation for good; `optimization`
    replaces onnxruntime's default level (all of its graph optimisations)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = arena
    if optimization is not None:
        options.graph_optimization_level = optimization
    return ort.InferenceSession(model.SerializeToString(), options, providers=list(providers))


def reference_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """The CPU provider's session of a model whose intermediate tensors are asked for as outputs. Its
    fullest optimisation can lose such a tensor (onnxruntime 1.32: a grouped Conv whose output an Add
    also reads is fused into the Add, and the session fails to find the Conv's output, as in FastViT);
    then the session is made without the layout optimisations that do it."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):  # onnxruntime prints its provider fallback there
            return session(model, arena=False)
    except Exception:  # onnxruntime raises its own exception types, or RuntimeError
        return session(model, arena=False, optimization=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)


def is_onnxruntime_error(err: BaseException) -> bool:
    """Whether onnxruntime raised `err` (its exceptions are its own types, not RuntimeError's)."""
    return type(err).__module__.startswith("onnxruntime")


def refusal(model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None) -> str | None:
    """What onnxruntime says, on one line, where it cannot run `model` on its CPU provider (a Conv in
    float64, which it has no kernel for), on `feeds` where given (a Conv over an empty image); None
    where it runs it."""
    try:
        made = reference_session(model)
        if feeds is not None:
            made.run(None, feeds, quiet())
    except Exception as err:  # onnxruntime raises its own exception types
        if not is_onnxruntime_error(err):
            raise
        message = " ".join(str(err).split())
        return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message)
    return None


def has_cuda() -> bool:
    """Whether the installed onnxruntime build has the CUDA provider."""
    return CUDA_PROVIDER in ort.get_available_providers()


def cuda_provider(device_id: int) -> tuple[str, dict[str, str]]:
    """The CUDA provider on this device with TF32 off, so that the steps onnxruntime
    runs stay FP32-exact like ours."""
    return CUDA_PROVIDER, {"device_id": str(device_id), "use_tf32": "0"}


class Reference:
    """The unmodified model on onnxruntime's CPU provider, also returning
    `extra_outputs` (intermediate tensors); one session serves every call.

    `views` names tensors that the simplified graph writes in another layout (Simplification.views:
    name -> (original tensor, perm[, axes[, shape]])): asked for one, the reference gives the original
    tensor transposed, with axes of 1 inserted at `axes` of the result where given, then reshaped to
    `shape` where given."""

    def __init__(self, model: onnx.ModelProto, extra_outputs: Sequence[str] = (), *, views: dict[str, tuple] | None = None):
        self.views = {name: view for name, view in (views or {}).items() if name in extra_outputs}
        self.wanted = list(dict.fromkeys([*(o.name for o in model.graph.output),
                                          *(self.views.get(n, (n,))[0] for n in extra_outputs)]))
        self._prepare(model)

    def _prepare(self, model: onnx.ModelProto) -> None:
        proto = copy.deepcopy(model)
        existing = {o.name for o in proto.graph.output}
        proto.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in self.wanted if name not in existing)
        self.session = reference_session(proto)
        self.names = [o.name for o in proto.graph.output]

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(self.names, feeds)))

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._run(feeds)
        for name, (source, perm, *rest) in self.views.items():
            value = np.expand_dims(np.transpose(values[source], perm), tuple(rest[0]) if rest else ())
            values[name] = np.ascontiguousarray(value.reshape(rest[1]) if len(rest) > 1 else value)
        return values


# runs one node onnxruntime cannot: (node, its inputs (None for an omitted one)) -> its outputs
ForeignNode = Callable[[onnx.NodeProto, list], list]


class SplitReference(Reference):
    """The reference of a model with nodes onnxruntime cannot run (custom ops): the graph cut at
    each such node into onnxruntime sub-models, run in order, the nodes between them run by
    `foreign`. Each sub-model is made on its first call, its inputs typed as the values it is given."""

    def __init__(self, model: onnx.ModelProto, foreign_nodes: set[str], run_foreign: ForeignNode,
                 extra_outputs: Sequence[str] = (), *, views: dict[str, tuple] | None = None):
        self.foreign_nodes, self.run_foreign = foreign_nodes, run_foreign
        super().__init__(model, extra_outputs, views=views)

    def _prepare(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.pieces: list[onnx.NodeProto | list[onnx.NodeProto]] = []  # a foreign node, or a run of the others
        for node in model.graph.node:
            if node.name in self.foreign_nodes:
                self.pieces.append(node)
            elif self.pieces and isinstance(self.pieces[-1], list):
                self.pieces[-1].append(node)
            else:
                self.pieces.append([node])
        self.sessions: dict[int, tuple[ort.InferenceSession, list[str], list[str]]] = {}

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = dict(feeds)
        for index, piece in enumerate(self.pieces):
            if isinstance(piece, onnx.NodeProto):
                results = self.run_foreign(piece, [self._value(i, values) if i else None for i in piece.input])
                values.update((name, value) for name, value in zip(piece.output, results) if name)
                continue
            session, inputs, outputs = self._session(index, piece, values)
            values.update(zip(outputs, session.run(outputs, {name: values[name] for name in inputs})))
        return {name: values[name] for name in self.wanted}

    def _value(self, name: str, values: dict[str, np.ndarray]) -> np.ndarray:
        """A tensor a foreign node reads: computed before it, or a weight of the model."""
        return values[name] if name in values else numpy_helper.to_array(self.initializers[name])

    def _session(self, index: int, nodes: list[onnx.NodeProto], values: dict[str, np.ndarray]):
        """The sub-model of a run of nodes: it reads what is written before it, and gives what is read after it."""
        if index in self.sessions:
            return self.sessions[index]
        produced = {o for n in nodes for o in n.output if o}
        # what a branch or loop body reads by name counts as read (core/node_reads.py)
        inputs = list(dict.fromkeys(i for n in nodes for i in reads(n) if i not in produced and i not in self.initializers))
        later = {i for piece in self.pieces[index + 1:] for n in ([piece] if isinstance(piece, onnx.NodeProto) else piece)
                 for i in reads(n)} | set(self.wanted)
        outputs = [o for n in nodes for o in n.output if o in later]
        graph = helper.make_graph(
            nodes, f"reference_part{index}",
            [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(values[name]).dtype), None)
             for name in inputs],
            [helper.make_empty_tensor_value_info(name) for name in outputs],
            initializer=[self.initializers[i] for i in dict.fromkeys(i for n in nodes for i in reads(n)) if i in self.initializers])
        sub = helper.make_model(graph, opset_imports=list(self.model.opset_import), functions=list(self.model.functions))
        sub.ir_version = max(self.model.ir_version, 4)
        self.sessions[index] = reference_session(sub), inputs, outputs
        return self.sessions[index]
