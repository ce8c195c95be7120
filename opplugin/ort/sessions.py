"""onnxruntime sessions: the one quiet set-up every session shares, the CUDA
provider's options, and the reference (the unmodified model on the CPU provider)."""
from __future__ import annotations

import contextlib
import copy
import io
from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


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
        proto = copy.deepcopy(model)
        self.views = {name: view for name, view in (views or {}).items() if name in extra_outputs}
        existing = {o.name for o in proto.graph.output}
        for name in dict.fromkeys(self.views.get(n, (n,))[0] for n in extra_outputs):
            if name not in existing:
                proto.graph.output.append(helper.make_empty_tensor_value_info(name))
        self.session = reference_session(proto)
        self.names = [o.name for o in proto.graph.output]

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = dict(zip(self.names, self.session.run(self.names, feeds)))
        for name, (source, perm, *rest) in self.views.items():
            value = np.expand_dims(np.transpose(values[source], perm), tuple(rest[0]) if rest else ())
            values[name] = np.ascontiguousarray(value.reshape(rest[1]) if len(rest) > 1 else value)
        return values
