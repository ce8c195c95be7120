"""The opplugin domain: ops a load-time pass writes where the model's opset lacks them (a Gelu
before opset 20, a LayerNormalization over axes ONNX's own cannot name), each declared in the
model as a function, so that onnxruntime and `check` run its meaning and a plugin recognises it."""
from __future__ import annotations

import onnx

OPPLUGIN_DOMAIN = "opplugin"


def default_opset(proto: onnx.ModelProto, otherwise: int = 0) -> int:
    """The model's opset of the default ONNX domain (`otherwise` where it imports none)."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), otherwise)


def is_declared(proto: onnx.ModelProto, name: str) -> bool:
    """Whether the model already declares the opplugin function `name`."""
    return any(f.domain == OPPLUGIN_DOMAIN and f.name == name for f in proto.functions)


def declare(proto: onnx.ModelProto, function: onnx.FunctionProto) -> None:
    """Add an opplugin-domain function to the model, and the domain to its opset imports."""
    proto.functions.append(function)
    if not any(o.domain == OPPLUGIN_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(OPPLUGIN_DOMAIN, 1))


def inline_functions(proto: onnx.ModelProto, keep: frozenset[tuple[str, str]] = frozenset()) -> onnx.ModelProto:
    """The model with each call of one of its own functions replaced by the function's body, so that
    plugins run the ops inside; the calls of the functions in `keep` (those a custom op declares, by
    (domain, name)) and of opplugin's own stay whole. The model itself where there is nothing to inline."""
    inlined = [(f.domain, f.name) for f in proto.functions if (f.domain, f.name) not in keep and f.domain != OPPLUGIN_DOMAIN]
    if not inlined:
        return proto
    import onnx.inliner

    return onnx.inliner.inline_selected_functions(proto, inlined, exclude=False)
