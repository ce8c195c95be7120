"""A user's kernel file as the runner sees it: its text, the directives in its
comments, and the source NVRTC compiles for one node.

Directives are comment lines of the form ``// opplugin: key=value``:

- ``block=N``: threads per block (default 256);
- ``outputs_per_thread=N``: how many output elements one thread writes; the grid
  covers the output with that many per thread (default 1);
- ``grid=X[, Y[, Z]]``: the grid itself, as arithmetic on the node's macros and
  ``batch`` (``cdiv(a, b)`` rounds up); overrides outputs_per_thread;
- ``weights=constant``: the runner declares ``__constant__ float W_CONST[]`` (and
  ``B_CONST[]`` with a bias) and uploads the node's weights into them; the
  pointers are passed all the same;
- ``fuses=epilogue``: the kernel applies the ACT / PKH x PKW macros itself (else
  the runner applies a fused activation and max pool as a separate step; a fused
  residual Add, or an activation other than Relu and Tanh, always runs that way).

The generated source puts the node's macros first, then ``#line 1 "FILE"`` and the
user's text, so that NVRTC's messages name the user's own lines, then a
compile-time check of the entry point's signature.
"""
from __future__ import annotations

import ast
import operator
import re
import unicodedata
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from ..errors import PluginError
from .contract import Contract, contract_for

DEFAULT_BLOCK = 256
DIRECTIVE = re.compile(r"^\s*//\s*opplugin:\s*(\w+)\s*=\s*(.*?)\s*$")
KNOWN_DIRECTIVES = ("block", "outputs_per_thread", "grid", "weights", "fuses")
# the name the generated signature check carries in NVRTC's messages
CONTRACT_FILE = "<opplugin contract>"


class UserKernelError(PluginError):
    """Something wrong with a user's kernel file. Its message starts with the file
    (and line, where there is one), like a compiler's."""

    located = True  # the CLI prints the message as it is, without its own prefix


class UserKernelHang(UserKernelError):
    """The kernel did not finish in time; the GPU is still busy with it, so the process must not wait for it."""

    abandon_process = True


@dataclass(frozen=True)
class LaunchSpec:
    block: int = DEFAULT_BLOCK
    outputs_per_thread: int = 1
    grid: tuple[str, ...] = ()  # expressions; empty: from the outputs
    grid_line: int = 0  # the grid directive's line, for messages
    constant_weights: bool = False
    fuses_epilogue: bool = False


@dataclass
class KernelSource:
    """A user's .cu file for one op type. `path` is shown in every message as given."""

    path: str
    op_type: str = "Conv"
    text: str = field(default="", repr=False)
    # the contract, where it is not the op type's own (a custom op's, made from its declaration)
    declared: Contract | None = field(default=None, repr=False)
    # the launch where the file's directives say nothing (a custom op's CudaSource arguments)
    defaults: LaunchSpec | None = field(default=None, repr=False)

    def __post_init__(self):
        check_file_name(self.path)
        self.contract: Contract = self.declared or contract_for(self.op_type)
        if not self.text:
            self.reload()
        else:
            self.launch = parse_directives(self.path, self.text, self.defaults)

    @classmethod
    def coerce(cls, value: "KernelSource | str | Path", op_type: str) -> "KernelSource":
        if isinstance(value, KernelSource):
            if value.op_type != op_type:
                raise UserKernelError(f"{value.path}: written for {value.op_type}, given for {op_type}")
            return value
        return cls(str(value), op_type)

    @property
    def label(self) -> str:
        """How reports name the kernel: the file's name."""
        return Path(self.path).name

    def reload(self) -> None:
        """Read the file again (after an edit)."""
        self.text = read_kernel_file(self.path)
        self.launch = parse_directives(self.path, self.text, self.defaults)
        check_entry_point(self.path, self.text, self.contract)

    @property
    def uses_shared_memory(self) -> bool:
        return "__shared__" in strip_comments(self.text)

    @property
    def grid_where(self) -> str:
        """FILE:LINE of the grid directive, as messages about it start."""
        return f"{self.path}:{self.launch.grid_line}"

    def grid_names(self, defines: Mapping[str, int], batch: int) -> dict[str, int]:
        """The names a grid expression may use: the node's whole-number macros, batch, BLOCK and OUTPUTS_PER_THREAD."""
        numbers = {name: value for name, value in defines.items() if isinstance(value, int)}
        return numbers | {"batch": batch, "BLOCK": self.launch.block, "OUTPUTS_PER_THREAD": self.launch.outputs_per_thread}

    def check_grid(self, defines: Mapping[str, int]) -> None:
        """UserKernelError at the directive's line when a grid expression names something that is
        not a macro of this node, or divides by zero: found when the node compiles, not at launch."""
        for text in self.launch.grid:
            evaluate(text, self.grid_names(defines, 1), self.grid_where)

    def generated(self, defines: Mapping[str, int]) -> str:
        """The source NVRTC compiles for one node: macros, the user's text at its own lines, the signature check."""
        macros = "".join(f"#define {name} {macro_text(value)}\n" for name, value in defines.items())
        macros += f"#define BLOCK {self.launch.block}\n#define OUTPUTS_PER_THREAD {self.launch.outputs_per_thread}\n"
        if self.launch.constant_weights and "C" in defines:
            weights = defines["M"] * (defines["C"] // defines["G"]) * defines["KH"] * defines["KW"]
            macros += f"__constant__ float W_CONST[{weights}];\n__constant__ float B_CONST[{defines['M'] if defines['HAS_BIAS'] else 1}];\n"
        quoted = c_string(self.path)
        contract = self.contract
        if not contract.parameters:  # a CudaSourcePlugin's own entry point: no parameter list to hold it to
            return f'{macros}#line 1 {quoted}\n{self.text}\n'
        check = (
            f'\n#line 1 "{CONTRACT_FILE}"\n'
            "template <class A, class B> struct opplugin_same_ { static constexpr bool value = false; };\n"
            "template <class A> struct opplugin_same_<A, A> { static constexpr bool value = true; };\n"
            f"static_assert(opplugin_same_<decltype(&{contract.entry}), void (*)({contract.parameter_types})>::value, "
            '"opplugin: wrong signature");\n'
        )
        return f'{macros}#line 1 {quoted}\n{self.text}\n{check}'


def check_file_name(path: str) -> None:
    """UserKernelError for a file name holding a control character (a newline, a tab...): NVRTC
    writes the name into its messages as it is, so they, and every FILE:LINE message, would break."""
    if any(unicodedata.category(c) == "Cc" for c in path):
        shown = "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in path)
        raise UserKernelError(f"{shown}: a kernel file's name must not hold a control character "
                              "(a newline, a tab ...); rename the file")


def c_string(text: str) -> str:
    """`text` as a C string literal (for #line): backslash and quote escaped, a control character as
    an octal escape (three digits, so a digit after it is not read into it)."""
    def escaped(c: str) -> str:
        if c in '\\"':
            return "\\" + c
        return f"\\{ord(c):03o}" if ord(c) < 0x20 or ord(c) == 0x7F else c
    return '"' + "".join(escaped(c) for c in text) + '"'


def macro_text(value) -> str:
    """A macro's value as C: a whole number as it is, a float as a float literal, text (an
    expression such as "(batch)") as given."""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return f"{value!r}f" if value == value and abs(value) != float("inf") else ("(0.0f/0.0f)" if value != value else
                                                                                  ("(1.0f/0.0f)" if value > 0 else "(-1.0f/0.0f)"))
    return str(int(value))


def read_kernel_file(path: str) -> str:
    """A kernel file's text; UserKernelError, one line, where it is missing or cannot be read."""
    if not Path(path).is_file():
        raise UserKernelError(f"{path}: no such kernel file")
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise UserKernelError(f"{path}: cannot read it: {err}") from None


def strip_comments(text: str) -> str:
    """The source without // and /* */ comments (string literals are rare enough in kernels to ignore)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.DOTALL)


def check_entry_point(path: str, text: str, contract: Contract) -> None:
    """A one-line error when the entry point is missing or not extern "C" __global__."""
    code = strip_comments(text)
    match = re.search(rf"\b{contract.entry}\s*\(", code)
    if match is None:
        raise UserKernelError(f"{path}: no entry point: it must define {contract.signature}")
    line = code.count("\n", 0, match.start()) + 1
    head = code[max(0, code.rfind(";", 0, match.start()), code.rfind("}", 0, match.start())): match.start()]
    if "__global__" not in head or not re.search(r'extern\s+"C"', head):
        raise UserKernelError(f'{path}:{line}: the entry point {contract.entry} must be declared extern "C" __global__: {contract.signature}')


def parse_directives(path: str, text: str, defaults: LaunchSpec | None = None) -> LaunchSpec:
    """The launch the file's directives give, over `defaults` (LaunchSpec's own where None)."""
    values: dict[str, object] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = DIRECTIVE.match(line)
        if not match:
            continue
        key, value = match.group(1), match.group(2)
        where = f"{path}:{number}"
        if key not in KNOWN_DIRECTIVES:
            raise UserKernelError(f"{where}: unknown directive {key!r}; known: {', '.join(KNOWN_DIRECTIVES)}")
        if key in ("block", "outputs_per_thread"):
            if not value.isdigit() or int(value) < 1 or (key == "block" and int(value) > 1024):
                raise UserKernelError(f"{where}: {key} must be a whole number from 1{' to 1024' if key == 'block' else ''}, got {value!r}")
            values[key] = int(value)
        elif key == "grid":
            parts = _split_grid(value, where)
            for part in parts:
                _parse_expression(part, where)
            values["grid"], values["grid_line"] = parts, number
        elif key == "weights":
            if value not in ("constant", "pointer"):
                raise UserKernelError(f"{where}: weights is constant or pointer, got {value!r}")
            values["constant_weights"] = value == "constant"
        elif key == "fuses":
            if value not in ("epilogue", "nothing"):
                raise UserKernelError(f"{where}: fuses is epilogue or nothing, got {value!r}")
            values["fuses_epilogue"] = value == "epilogue"
    return replace(defaults, **values) if defaults is not None else LaunchSpec(**values)


# --- grid expressions: integer arithmetic on macros and `batch` -----------------------------

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Div: operator.floordiv, ast.Mod: operator.mod}


def _split_grid(value: str, where: str) -> tuple[str, ...]:
    """The one to three expressions of a grid directive (commas inside cdiv() belong to it)."""
    try:
        tree = ast.parse(f"({value},)", mode="eval").body
    except SyntaxError:
        tree = None
    if not isinstance(tree, ast.Tuple) or not 1 <= len(tree.elts) <= 3:
        raise UserKernelError(f"{where}: grid takes one to three expressions separated by commas, got {value!r}")
    return tuple(ast.unparse(element) for element in tree.elts)


def _parse_expression(text: str, where: str) -> ast.expr:
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise UserKernelError(f"{where}: cannot read the grid expression {text!r}") from None
    for node in ast.walk(tree):
        allowed = (ast.BinOp, ast.Name, ast.Constant, ast.Load, ast.Call, ast.operator, ast.UnaryOp, ast.USub)
        if not isinstance(node, allowed) or (isinstance(node, ast.BinOp) and type(node.op) not in _OPERATORS):
            raise UserKernelError(f"{where}: the grid expression {text!r} may use + - * / %, cdiv(a, b), numbers and macros only")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "cdiv" and len(node.args) == 2):
            raise UserKernelError(f"{where}: the only function a grid expression may call is cdiv(a, b)")
    return tree


def evaluate(text: str, names: Mapping[str, int], where: str) -> int:
    """The value of a grid expression with these macro values."""

    def value(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise UserKernelError(f"{where}: the grid expression {text!r} names {node.id}, which is not a macro of this node")
            return int(names[node.id])
        if isinstance(node, ast.UnaryOp):
            return -value(node.operand)
        if isinstance(node, ast.Call):
            a, b = (value(arg) for arg in node.args)
            return -(-a // b)
        if isinstance(node, ast.BinOp):
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise UserKernelError(f"{where}: cannot evaluate {text!r}")

    try:
        return value(_parse_expression(text, where))
    except ZeroDivisionError:
        raise UserKernelError(f"{where}: the grid expression {text!r} divides by zero for this node") from None
