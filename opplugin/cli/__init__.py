"""The command line: the only package that knows argparse. Flags become typed options here,
and nothing below sees the parsed Namespace.

commands      the entry: the table of commands, their parser, exit statuses and one-line errors
options       the argument groups the commands share (model, runner, data, timing, tolerance,
              reports, kernels): where each shared flag is declared, read and checked
run check plan tune bench new
              a command each: its options, its own flags, and its work
workload      what run and check share: their options, and the set-up before their work
loading       the model a command works on, its device and batch
output        what a command writes when done: JSON reports, --save-outputs
file_guard    no output is a file the command reads
progress      the progress bar
ort_builds    which onnxruntime build is installed, and what the CPU build costs a GPU run
kernel_tools  --sanitize, --watch and the lines about user kernels
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """The `opplugin` command (commands.main). Its modules load here, not when the package is
    imported, so that a Ctrl-C while numpy and onnx load is one line and exit 130 like any other."""
    try:
        from .commands import main as command_main
    except KeyboardInterrupt:
        print("opplugin: interrupted", file=sys.stderr)
        return 130
    return command_main(argv)


__all__ = ["main"]
