"""A starter .cu file for a declared op, custom or standard (`opplugin new OP FILE.cu`): its
header comment is the contract CudaSource holds the file to (cuda_source.py), its body one
thread per element of the first output, to be filled in."""
from __future__ import annotations

from .declaration import REQUIRED, CustomOp


def starter_text(op: CustomOp, file_name: str) -> str:
    """The starter of `op` for a file named `file_name` (float tensors; change a type where a node's is another)."""
    entry = op.name.lower()
    inputs = [f"const float* {name.lower()}" for name in op.input_names]
    outputs = [f"float* {name.lower()}" for name in op.output_names]
    signature = f'extern "C" __global__ void {entry}({", ".join([*inputs, *outputs, "int batch"])})'
    first = op.output_names[0]
    tensors = [f"//   {name.upper():<10} {'input' if i < len(op.input_names) else 'output'}"
               + (" (optional: HAS_" + name.upper() + " is 0 where a node leaves it out, its pointer null)"
                  if i >= op.required_inputs and i < len(op.input_names) else "")
               for i, name in enumerate([*op.input_names, *op.output_names])]
    attributes = [f"//   ATTR_{name.upper():<10} {_attribute_note(value)}" for name, value in op.attributes.items()] or ["//   (none)"]
    lines = [
        f"// A starter kernel for {op.op_type}, for opplugin's CudaSource: one thread per element of {first}.",
        "//",
        "// Declare it (a Python file for --ops):",
        f"//     {_variable(op)} = {_construction(op)}  # reference: the float64 numpy one",
        f'//     {_variable(op)}.implement(CudaSource("{file_name}"))',
        f"// then: opplugin check MODEL --ops FILE.py   (each {op.name} node against the reference, on the GPU)",
        "//",
        "// THE CONTRACT: for every node the runner launches",
        "//",
        f"//     {signature}",
        "//",
        "// inputs in order, then outputs, then the images in this call. Macros, for each tensor by its name:",
        "// NAME_RANK, NAME_DIM0 .. NAME_DIM<rank-1>, NAME_PER_IMAGE (elements of one row of the first axis)",
        "// and NAME_SIZE (all its elements). Where the first axis is the batch, NAME_DIM0 is (batch) and",
        "// NAME_SIZE counts this call's rows: read them inside the kernel.",
        *tensors,
        "// Attributes (a list of numbers as ATTR_NAME_0 .. and ATTR_NAME_COUNT; text has no macro):",
        *attributes,
        "// Directives: block=N, outputs_per_thread=N, grid=X, Y, Z (arithmetic on whole-number macros and",
        "// batch). `#error reject: why` under an #if turns a node down: the op's next kernel, or its",
        "// reference, runs it.",
        "//",
        "// opplugin: block=256",
        "",
        signature,
        "{",
        "    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        f"    if (i >= {first.upper()}_SIZE) return;",
        f"    {first.lower()}[i] = 0.0f;  // TODO: element i of {first}; until then `check` fails here, as it should",
        "}",
        "",
    ]
    return "\n".join(lines)


def _construction(op: CustomOp) -> str:
    """How the declaration is written: an ONNX op's inputs, outputs and attributes come from its schema."""
    if op.op_type == op.name:
        return f'CustomOp("{op.domain}", "{op.name}", reference=...)'
    optional = ["" if i < op.required_inputs else "?" for i in range(len(op.input_names))]
    inputs = [f"{name}{mark}" for name, mark in zip(op.input_names, optional)]
    return f'CustomOp("{op.domain}", "{op.name}", inputs={inputs!r}, outputs={op.output_names!r}, reference=...)'


def _variable(op: CustomOp) -> str:
    return op.name.lower()


def _attribute_note(value) -> str:
    if value is REQUIRED:
        return "(every node gives it)"
    if value is None:
        return "(no default: no macro where a node leaves it out)"
    return f"(default {value!r})"
