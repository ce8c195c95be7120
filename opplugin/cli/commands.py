"""The command line's entry: opplugin run | check | plan | tune | bench | new.

Each command is a module of this package (run.py, check.py, ...) with three functions:
`add_arguments(parser)` adds its flags, `read(args)` reads them into its typed options
(every value checked; the options' `files()` names what the command reads and writes),
and `execute(options)` runs it, returning the exit status. A command's module is imported
only when that command is asked for: `opplugin --help` and each command start without the
others' imports (bench's help alone reads half the lab). Here: the parser, and what a
command's outcome becomes (its exit status, one line for an error).
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import traceback
from types import ModuleType
from typing import Any, Iterable

from .. import __version__
from ..core.files import human_text_to_stderr
from ..errors import OpPluginError, first_line
from .ort_builds import both_builds_warning, require_onnxruntime

# each command's one line in `opplugin --help`, in its order
COMMANDS = {
    "run": "run the swapped model and print the per-op timing report",
    "check": "compare the swapped model with onnxruntime, step by step",
    "plan": "show how the model is split into plugin and onnxruntime steps",
    "bench": "time every Conv variant of the models and the peers (cuDNN, onnxruntime CUDA) on this GPU",
    "tune": "time every Conv configuration on this GPU and cache the fastest that passes",
    "profile": "the GPU's counters (Nsight Compute) for the slowest steps, or those named, by ONNX node",
    "new": "write a starter kernel for an op type (no arguments: list the op types)",
}


def command_module(name: str) -> ModuleType:
    """The module of the command `name` (opplugin.cli.run for run)."""
    return importlib.import_module(f"{__package__}.{name}")


class StoreOnce(argparse.Action):
    """A flag that takes one value (every plain `store` flag): given twice, it is an error, not the last one kept."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None):
        given = vars(namespace).setdefault("_given", set())
        if option_string is not None and self.dest in given:
            parser.error(f"{option_string} is given twice ({getattr(namespace, self.dest)} and {values}); give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """argparse's parser, its flags of one value given once (StoreOnce); its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for name in (None, "store"):  # argument groups share these registries
            self.register("action", name, StoreOnce)


def build_parser(flags_of: Iterable[str] = tuple(COMMANDS)) -> argparse.ArgumentParser:
    """opplugin's parser: every command, with the flags of those in `flags_of` (main asks only
    for the command it runs)."""
    parser = Parser(prog="opplugin", description="Run ONNX models with Conv swapped for custom CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"opplugin {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_line in COMMANDS.items():
        command = commands.add_parser(name, help=help_line)
        if name in flags_of:
            command_module(name).add_arguments(command)
    return parser


def named_command(argv: list[str]) -> tuple[str, ...]:
    """The command `argv` asks for: its first word that is no option (opplugin's own options take
    no value), if that is a command; () for `opplugin --help`, `--version` or a misspelt command."""
    words = [word for word in argv if not word.startswith("-")]
    return (words[0],) if words and words[0] in COMMANDS else ()


def _streams_closed_at_start() -> None:
    """Started with standard output or error closed (`>&-`: Python then has no stream at all): the
    command still runs and writes its files, its text going nowhere, and says so where it can."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
        print("opplugin: standard output is closed: the report goes nowhere (its --json and other files are written)",
              file=sys.stderr)


def _plain_where_unicode_fails() -> None:
    """On a stream that cannot encode the reports' dashes and arrows (PYTHONIOENCODING=ascii, a
    latin-1 terminal), print what it can and a `?` for the rest, rather than fail at the first one."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            "\u2014\u2192".encode(encoding)
        except (UnicodeEncodeError, LookupError):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="replace")


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` names; its exit status. Ctrl-C, from start-up to the end, is one line and 130."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        print("opplugin: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    _streams_closed_at_start()
    _plain_where_unicode_fails()
    args = build_parser(named_command(argv)).parse_args(argv)
    command = command_module(args.command)
    from .file_guard import check_files, stdout_outputs  # after parsing, as the command's module: --help needs neither

    try:
        options = command.read(args)  # every flag checked before any work
        files = options.files()
        check_files(files)  # outputs writable, and none of them a file the command reads
        if not stdout_outputs(files):
            return _run_command(command, options)
        with human_text_to_stderr():  # the report is standard output's: the rest goes to stderr
            return _run_command(command, options)
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as err:
        if err.errno not in FULL_DEVICE:
            return _internal_error()
        return _device_full(err)
    except OpPluginError as err:
        # the first line says it all; what follows (a compiler's log) is detail
        print(err if err.located else f"opplugin: error: {err}", file=sys.stderr)
        if err.abandon_process:  # a hung kernel: exiting normally would wait for the GPU forever
            sys.stderr.flush()
            os._exit(2)
        return 2
    except Exception as err:
        from ..gpu.cuda import is_out_of_memory  # only an unforeseen error needs it

        if not is_out_of_memory(err):
            return _internal_error()
        # an allocation outside a run (the input arrays, pinned or not)
        print(f"opplugin: error: out of memory: {first_line(err)}", file=sys.stderr)
        return 2


def _run_command(command: ModuleType, options: Any) -> int:
    require_onnxruntime()
    if (both := both_builds_warning()) is not None:
        print(f"opplugin: warning: {both}", file=sys.stderr)
    import onnxruntime  # here, once require_onnxruntime has said how to install it where it is missing

    onnxruntime.set_default_logger_severity(3)  # errors only: provider-discovery warnings are not the user's business
    status = command.execute(options)
    sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at the interpreter's exit
    return status


# The exit status of a command whose reader closed standard output (`opplugin check | head -1`):
# 128 + SIGPIPE, as a Unix tool killed by the signal reports it to the shell.
CLOSED_PIPE = 141


# a write that failed for want of room: the disk, the user's quota, or the file size limit
FULL_DEVICE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _device_full(err: OSError) -> int:
    """A write found no room (a full disk, `> /dev/full`): one line, exit 2. Standard output then
    points at /dev/null, so that the interpreter's last flush does not fail again."""
    where = f" ({err.filename})" if err.filename else " (standard output)"
    print(f"opplugin: error: cannot write{where}: {os.strerror(err.errno)}", file=sys.stderr)
    _stdout_to_null()
    return 2


def _stdout_to_null() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        pass


def _closed_pipe() -> int:
    """The reader of standard output has gone: stop quietly. Standard output then points at
    /dev/null, so that the interpreter's last flush at exit does not fail again."""
    _stdout_to_null()
    return CLOSED_PIPE


# Exit status of a failure opplugin did not foresee: not 1, which scripts read as a failed comparison.
INTERNAL_ERROR = 3


def _internal_error() -> int:
    """A bug, not the user's input: the traceback for the report, then a line that says so."""
    traceback.print_exc()
    print("opplugin: internal error (a bug in opplugin; the traceback above helps to report it)", file=sys.stderr)
    return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
