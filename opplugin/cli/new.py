"""`opplugin new [OP FILE.cu]`: a starter kernel for an op type, or the op types that have one."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..core.files import check_writable, write_atomic
from ..errors import InputError
from ..user_kernels import starter_text
from ..user_kernels.contract import CONTRACTS
from ..user_kernels.flags import op_type_named
from .file_guard import CommandFiles


@dataclass(frozen=True)
class NewOptions:
    op: str | None = None  # as typed; None: list the op types
    op_type: str | None = None  # its op type ("conv" -> "Conv")
    file: str | None = None
    force: bool = False

    def files(self) -> CommandFiles:
        return CommandFiles()  # the starter's file is checked as it is written: --force may overwrite it


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("op", nargs="?", help=f"the op type: {', '.join(c.lower() for c in CONTRACTS)}")
    parser.add_argument("file", nargs="?", help="the .cu file to write")
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def read(args: argparse.Namespace) -> NewOptions:
    if not args.op:
        return NewOptions(force=args.force)
    op_type = op_type_named(args.op)
    if not args.file:
        raise InputError(f"opplugin new {args.op} needs the file to write, e.g. opplugin new {args.op} my_{args.op.lower()}.cu")
    return NewOptions(args.op, op_type, args.file, args.force)


def execute(options: NewOptions) -> int:
    if options.op_type is None:
        print("Starter kernels (opplugin new OP FILE.cu):")
        for op_type, contract in CONTRACTS.items():
            print(f"  {op_type.lower():<6} {contract.signature}")
        return 0
    target = Path(options.file)
    if target.is_dir():
        raise InputError(f"{options.file} is a folder; give the path of the .cu file to write")
    if target.exists() and not options.force:
        raise InputError(f"{options.file} exists; pass --force to overwrite it")
    check_writable(options.file, f"opplugin new {options.op}")  # a missing, read-only or forbidden folder: one line
    write_atomic(target, starter_text(options.op_type).replace("THIS_FILE.cu", target.name))
    print(f"Wrote {options.file}: a {options.op_type} kernel, one thread per output. "
          f"Try: opplugin check --kernel {options.op_type}={options.file}")
    return 0
