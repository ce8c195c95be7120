"""The command line: the only package that knows argparse."""
from .commands import main

__all__ = ["main"]
