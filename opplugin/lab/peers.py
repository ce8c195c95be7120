"""The peers `opplugin bench` measures opplugin's kernels against, in the same process:
cuDNN through PyTorch (FP32 and TF32; FP16 or BF16 in channels_last under --precision) and
onnxruntime's CUDA provider.

Each peer is a `Peer`: a name, whether it is FP32-exact, and a `prepare(...)` that
returns a zero-argument callable producing the step's output on the device (a
CuPy array, or a torch tensor CuPy can take through DLPack), or raises
`PeerUnavailable` saying why it cannot run. Neither torch nor an onnxruntime
with CUDA is a dependency: their absence is a reason, not an error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..ort import sessions
from ..ops.conv.epilogue import NONE, Epilogue
from ..ops.conv.spec import ConvSpec
from .graphed import torch_replay
from .torch_precision import TORCH_DTYPES, converted_input, torch_dtype

ONE_CONV_OPSET = 17


class PeerUnavailable(Exception):
    """This peer cannot run this step here; the message says why."""


@dataclass
class Peer:
    name: str  # stable key in the JSON: cudnn_fp32, cudnn_tf32, cudnn_fp16, cudnn_bf16, onnxruntime_cuda
    exact: bool
    implementation: str  # what ran, for the table and the JSON
    timer: str  # "cuda-events" or "host" (a call that synchronises before it returns)
    prepare: Callable[..., Callable[[], Any]]  # (spec, epilogue, x, w, b, residual) -> run
    # (run, calls) -> a replay of `calls` runs from one CUDA graph; None: timed as it runs
    capture: Callable[[Callable[[], Any], int], Callable[[], Any]] | None = None
    output_format: str | None = None  # fp16 or bf16: the 16-bit format run's output is stored in; None: FP32

    def fp32_output(self, y: Any) -> Any:
        """What run gave, as the FP32 array the check reads: a 16-bit torch tensor converted (after timing, never in it)."""
        return y if self.output_format is None else y.float().contiguous()


# --- cuDNN through PyTorch ------------------------------------------------------------


def torch_or_reason() -> tuple[Any, str | None]:
    """(torch, None) when torch imports and sees a CUDA device, else (None, why not)."""
    try:
        import torch
    except Exception as err:  # not installed, or a broken install: either way no peer
        return None, f"torch is not importable ({type(err).__name__}: {err})"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    return torch, None


def _symmetric_padding(spec: ConvSpec) -> tuple[int, int]:
    begin, end = spec.pads[: spec.rank], spec.pads[spec.rank :]
    if spec.rank != 2 or tuple(begin) != tuple(end):
        raise PeerUnavailable(f"torch conv2d takes symmetric 2-D pads only (this Conv has {spec.pads})")
    return int(begin[0]), int(begin[1])


def cudnn_peer(torch: Any, precision: str) -> Peer:
    """cuDNN in `precision`, benchmark mode on: FP32 (allow_tf32 False), TF32 (allow_tf32 True), or FP16 and
    BF16 on tensors of that dtype in channels_last, as PyTorch runs a half-precision CNN: the input, weights
    and residual converted once, here, before any timed call, and the output left in the format (opplugin's
    kernels take and give FP32 and convert inside the timed call). For a fused step, conv2d then relu/tanh
    then max_pool2d, as PyTorch runs a chain."""
    import torch.nn.functional as F

    half = precision in TORCH_DTYPES
    mode = f"{precision.upper()} channels_last" if half else precision.upper()
    version = torch.backends.cudnn.version()
    label = f"torch {torch.__version__.split('+')[0]} F.conv2d, cuDNN {version} {mode}"
    tf32 = precision == "tf32"

    def prepare(spec: ConvSpec, epilogue: Epilogue, x, w, b, residual=None):
        padding = _symmetric_padding(spec)
        x_t = torch.from_dlpack(x)
        # copies: initializers are read-only arrays, which torch will not wrap
        w_t = torch.tensor(np.array(w, dtype=np.float32), device=x_t.device)
        b_t = None if b is None else torch.tensor(np.array(b, dtype=np.float32), device=x_t.device)
        r_t = None if residual is None else torch.from_dlpack(residual)
        if half:
            x_t, w_t, r_t = (None if t is None else converted_input(torch, t, precision) for t in (x_t, w_t, r_t))
            b_t = None if b_t is None else b_t.to(dtype=torch_dtype(torch, precision))
        activation = _torch_activation(torch, epilogue)
        pool = epilogue.pool

        def run():
            # set on every call: the other cuDNN peers flip the same global switch
            torch.backends.cudnn.allow_tf32 = tf32
            y = F.conv2d(x_t, w_t, b_t, spec.strides, padding, spec.dilations, spec.group)
            if r_t is not None:
                y = y + r_t
            if activation is not None:
                y = activation(y)
            if pool:
                y = F.max_pool2d(y, kernel_size=pool, stride=pool)
            return y

        return run

    def capture(run, calls):
        return torch_replay(torch, run, calls)

    return Peer(f"cudnn_{precision}", exact=precision == "fp32", implementation=label, timer="cuda-events", prepare=prepare,
                capture=capture, output_format=precision if half else None)


def _torch_activation(torch: Any, epilogue: Epilogue) -> Callable[[Any], Any] | None:
    """The epilogue's activation as PyTorch runs it (parameters as the node gives them)."""
    act = epilogue.activation
    if act is None:
        return None
    import torch.nn.functional as F

    functions = {
        "Relu": torch.relu, "Tanh": torch.tanh, "Sigmoid": torch.sigmoid, "Silu": F.silu,
        "LeakyRelu": lambda y: F.leaky_relu(y, act.a), "Clip": lambda y: torch.clamp(y, act.a, act.b),
        "HardSigmoid": lambda y: torch.clamp(act.a * y + act.b, 0.0, 1.0),
        "HardSwish": lambda y: y * torch.clamp(act.a * y + act.b, 0.0, 1.0),
    }
    return functions[act.op]


# --- onnxruntime's CUDA provider -------------------------------------------------------


def one_conv_model(spec: ConvSpec, w: np.ndarray, b: np.ndarray | None) -> onnx.ModelProto:
    """An ONNX model of just this Conv (weights as initializers, batch axis "N")."""
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    node = helper.make_node(
        "Conv",
        inputs,
        ["y"],
        kernel_shape=list(spec.kernel),
        strides=list(spec.strides),
        pads=list(spec.pads),
        dilations=list(spec.dilations),
        group=spec.group,
    )
    initializers = [numpy_helper.from_array(np.ascontiguousarray(w, dtype=np.float32), "w")]
    if b is not None:
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(b, dtype=np.float32), "b"))
    graph = helper.make_graph(
        [node],
        "one_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", spec.in_channels, *spec.in_size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", spec.out_channels, *spec.out_size])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONE_CONV_OPSET)], producer_name="opplugin-bench")
    model.ir_version = 8
    return model


def onnxruntime_cuda_reason() -> str | None:
    """None when onnxruntime lists the CUDA provider, else why this peer is absent."""
    import onnxruntime

    if not sessions.has_cuda():
        return f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider (the CPU-only build is installed)"
    return None


def onnxruntime_peer(device_id: int) -> Peer:
    """One Conv through onnxruntime's CUDA provider, TF32 off, input and output bound
    to CuPy device buffers through IOBinding (no host copies)."""
    import cupy
    import onnxruntime

    made: dict[tuple, Any] = {}

    def session_for(spec: ConvSpec, w, b):
        key = (spec.in_channels, spec.out_channels, spec.in_size, spec.kernel, spec.strides, spec.pads, spec.dilations, spec.group, id(w))
        if key not in made:
            session = sessions.session(one_conv_model(spec, w, b), [sessions.cuda_provider(device_id), sessions.CPU_PROVIDER])
            if sessions.CUDA_PROVIDER not in session.get_providers():
                raise PeerUnavailable("onnxruntime fell back to the CPU provider (CUDA libraries not loadable?)")
            made[key] = session
        return made[key]

    def prepare(spec: ConvSpec, epilogue: Epilogue, x, w, b, residual=None):
        if epilogue != NONE:
            raise PeerUnavailable("the onnxruntime peer runs the Conv alone")
        session = session_for(spec, w, b)
        y = cupy.empty(spec.output_shape(int(x.shape[0])), dtype=cupy.float32)
        binding = session.io_binding()
        binding.bind_input("x", "cuda", device_id, np.float32, list(x.shape), x.data.ptr)
        binding.bind_output("y", "cuda", device_id, np.float32, list(y.shape), y.data.ptr)

        def run():
            session.run_with_iobinding(binding)
            return y

        return run

    label = f"onnxruntime {onnxruntime.__version__} CUDAExecutionProvider, use_tf32=0, IOBinding"
    return Peer("onnxruntime_cuda", exact=True, implementation=label, timer="host", prepare=prepare)
