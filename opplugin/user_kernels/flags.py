"""The --kernel flag's grammar, OP=FILE.cu with the op type in any case, shared by
the commands that take it (run, check, plan, tune, bench) and the sanitizer's child."""
from __future__ import annotations

from ..errors import InputError
from .contract import CONTRACTS, contract_for


def parse_kernels(values: list[str] | None) -> dict[str, str]:
    """{"Conv": "my_conv.cu"} from the --kernel flags; InputError (exit 2) for a bad one."""
    kernels: dict[str, str] = {}
    for value in values or []:
        op, sep, path = value.partition("=")
        if not sep or not op or not path:
            raise InputError(f"--kernel takes OP=FILE.cu, e.g. --kernel Conv=my_conv.cu; got {value!r}")
        op_type = op_type_named(op)
        if op_type in kernels:
            raise InputError(f"--kernel names {op_type} twice")
        kernels[op_type] = path
    return kernels


def op_type_named(name: str) -> str:
    """The op type a user spelt in any case ("conv" -> "Conv"); the contract's error for an unknown one."""
    for op_type in CONTRACTS:
        if op_type.lower() == name.lower():
            return op_type
    contract_for(name)  # raises, listing the op types with a contract
    raise AssertionError("unreachable")
