"""`opplugin new [OP FILE.cu]`: a starter kernel for an op type, or the op types that have one.

Conv and Relu have starters of their own (--kernel OP=FILE.cu runs them); any other ONNX op
type, and any op a --ops file declares, gets a starter for a custom-op declaration's CudaSource
(custom/starter.py)."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from ..core.files import create_new, write_atomic
from ..errors import InputError
from ..user_kernels import starter_text
from ..user_kernels.contract import CONTRACTS
from ..user_kernels.flags import op_type_named
from ..user_kernels.source import check_file_name
from .file_guard import STDOUT, CommandFiles


@dataclass(frozen=True)
class NewOptions:
    op: str | None = None  # as typed; None: list the op types
    op_type: str | None = None  # its op type with a contract ("conv" -> "Conv"); None for a declared op
    file: str | None = None
    force: bool = False
    declared: Any = None  # the CustomOp whose CudaSource starter is written, where op_type is None
    ops: tuple[str, ...] = ()  # the --ops files read for it

    def files(self) -> CommandFiles:
        # whether the starter's file may be replaced (--force) is checked as it is written; that it is
        # not a file the command reads (an --ops file) is checked here, as for every command
        if not self.file:
            return CommandFiles(ops=self.ops)
        path = f".{os.sep}{STDOUT}" if self.file == STDOUT else self.file  # `new conv -` writes a file named -
        return CommandFiles(((f"opplugin new {self.op}", path),), ops=self.ops)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("op", nargs="?", help=f"the op type: {', '.join(c.lower() for c in CONTRACTS)}, any other ONNX "
                                              "op type, or a declared op (domain::OpType, with --ops)")
    parser.add_argument("file", nargs="?", help="the .cu file to write")
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    parser.add_argument("--ops", action="append", metavar="FILE.py", default=None,
                        help="custom-op declarations, for a starter of a declared op")


def read(args: argparse.Namespace) -> NewOptions:
    if not args.op:
        return NewOptions(force=args.force)
    if not args.file:
        raise InputError(f"opplugin new {args.op} needs the file to write, e.g. opplugin new {args.op} "
                         f"my_{args.op.lower().split('::')[-1]}.cu")
    if any(name.lower() == args.op.lower() for name in CONTRACTS) and not args.ops:
        return NewOptions(args.op, op_type_named(args.op), args.file, args.force)
    ops = tuple(args.ops or ())
    return NewOptions(args.op, None, args.file, args.force, declared_op(args.op, ops), ops)


def declared_op(name: str, ops_files: tuple[str, ...]):
    """The op a starter is written for: one the --ops files declare, else an ONNX op type (any
    case) as its schema declares it; InputError otherwise."""
    from ..custom import CustomOp
    from .loading import read_ops

    for op in read_ops(ops_files):
        if name in (op.op_type, op.name) or name.lower() == op.op_type.lower():
            return op
    if "::" in name:
        raise InputError(f"no declaration for {name}" + (f" in {', '.join(ops_files)}" if ops_files else "; pass --ops FILE.py"))
    schema = next((s for s in onnx.defs.get_all_schemas() if s.domain == "" and s.name.lower() == name.lower()), None)
    if schema is None:
        raise InputError(f"no op type {name!r}: give an ONNX op type (softmax), a declared op (domain::OpType, with "
                         f"--ops FILE.py), or one with a starter of its own: {', '.join(c.lower() for c in CONTRACTS)}")
    return CustomOp("", schema.name)


def execute(options: NewOptions) -> int:
    if options.op is None:
        print("Starter kernels (opplugin new OP FILE.cu):")
        for op_type, contract in CONTRACTS.items():
            print(f"  {op_type.lower():<6} {contract.signature}")
        print("Any other ONNX op type (opplugin new softmax my_softmax.cu), and any op a declaration file names\n"
              "(opplugin new example.ops::Swish swish.cu --ops ops.py): a starter for the op's CudaSource")
        return 0
    target = Path(options.file)
    check_file_name(options.file)
    if os.path.lexists(target) and not options.force:  # a dangling symbolic link is a name taken too
        raise _exists(options.file)
    if options.op_type is None:
        from ..custom.starter import starter_text as declared_starter

        op = options.declared
        _write(target, declared_starter(op, target.name), options)
        print(f"Wrote {options.file}: a {op.op_type} kernel to fill in, one thread per element of {op.output_names[0]}. "
              f"Declare it with CudaSource({target.name!r}) and pass the file with --ops")
        return 0
    _write(target, starter_text(options.op_type).replace("THIS_FILE.cu", target.name), options)
    print(f"Wrote {options.file}: a {options.op_type} kernel, one thread per output. "
          f"Try: opplugin check --kernel {options.op_type}={options.file}")
    return 0


def _write(target: Path, text: str, options: NewOptions) -> None:
    """Replace the file with --force (through a symbolic link, as every output is written); else
    create it, refused if it exists by now: of two `new` at once, one writes and the other is told."""
    if options.force:
        write_atomic(target, text)
        return
    try:
        create_new(target, text)
    except FileExistsError:
        raise _exists(options.file) from None


def _exists(file: str) -> InputError:
    return InputError(f"{file} exists; pass --force to overwrite it")
