"""Declarations from a Python file (`--ops FILE.py`): every CustomOp the file defines at its top
level, one per op."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Iterable

from ..errors import first_line
from .declaration import CustomOp, DeclarationError


def load_ops(path: str | Path) -> list[CustomOp]:
    """The CustomOps a Python file defines at its top level: DeclarationError, in one line, for a
    file that is missing, does not import, declares none or declares one op twice."""
    path = Path(path)
    if not path.is_file():  # a folder or a pipe exists, but is no file to import
        raise DeclarationError(f"--ops {path}: " + ("not a regular file; give a Python file" if path.exists() else "no such file"))
    spec = importlib.util.spec_from_file_location(f"opplugin_ops_{abs(hash(str(path.resolve())))}", path)
    if spec is None or spec.loader is None:
        raise DeclarationError(f"--ops {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # the file may import its neighbours (a kernel module beside it)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        line = _line_in(err, path)
        what = f"SyntaxError: {err.msg}" if isinstance(err, SyntaxError) else first_line(err, named=True)
        raise DeclarationError(f"{path}{f':{line}' if line else ''}: the file does not import: {what}") from None
    finally:
        sys.path.remove(folder)
    ops = [value for value in vars(module).values() if isinstance(value, CustomOp)]
    if not ops:
        raise DeclarationError(f"--ops {path}: the file defines no CustomOp at its top level")
    return distinct(ops, str(path))


def distinct(ops: Iterable[CustomOp], where: str = "ops") -> list[CustomOp]:
    """`ops` once each: DeclarationError where two different declarations are for one op."""
    seen: dict[str, CustomOp] = {}
    for op in ops:
        if not isinstance(op, CustomOp):
            raise DeclarationError(f"{where}: {op!r} is not a CustomOp")
        if op.op_type in seen and seen[op.op_type] is not op:
            raise DeclarationError(f"{where}: two declarations for {op.op_type}; keep one")
        seen[op.op_type] = op
    return list(seen.values())


def _line_in(err: BaseException, path: Path) -> int | None:
    """The line of `path` where the import failed, from the traceback (or a SyntaxError's own)."""
    if isinstance(err, SyntaxError) and err.filename and Path(err.filename).resolve() == path.resolve():
        return err.lineno
    trace, line = err.__traceback__, None
    while trace is not None:
        if Path(trace.tb_frame.f_code.co_filename).resolve() == path.resolve():
            line = trace.tb_lineno
        trace = trace.tb_next
    return line
