"""Writing files so that a reader never sees half of one, and checking, before any
work, that a file the user named can be written."""
from __future__ import annotations

import os
import stat
import sys
import tempfile
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Iterator, TextIO

from ..errors import InputError


def _umask() -> int:
    # the only portable way to read the umask is to set it and put it back
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """The mode the written file gets: an existing file's own, else what open() would
    give a new file (0666 less the umask), not mkstemp's 0600."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


# `-` as a report's path: standard output (file_guard allows it for --json and --csv)
STDOUT = "-"
# where a report named `-` goes: standard output as it was before human_text_to_stderr
_report_stream: TextIO | None = None


@contextmanager
def human_text_to_stderr() -> Iterator[None]:
    """While a report goes to standard output, what the command prints for people goes to stderr."""
    global _report_stream
    _report_stream = sys.stdout
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _report_stream = None


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write `text` (or bytes) to a temporary file beside `path`, flush it to disk, then
    rename it over `path`. On any failure the old file (if any) is left whole and the
    temporary one is removed. The path `-` writes the text to standard output."""
    if str(path) == STDOUT and isinstance(text, str):
        stream = _report_stream or sys.stdout
        stream.write(text)
        stream.flush()
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, _mode_for(path))
        binary = isinstance(text, bytes)
        with os.fdopen(handle, "wb" if binary else "w", encoding=None if binary else "utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def check_writable(path: str, flag: str) -> Path:
    """InputError naming `flag` unless write_atomic can write `path`: not empty, not a
    folder or a special file, in an existing folder where a file can be created.
    The folder is probed by creating a temporary file there and removing it at once,
    which is the only test that /proc, read-only mounts and permissions all answer
    truthfully; nothing is left behind and an existing file is not touched."""
    if not path or not path.strip():
        raise InputError(f"{flag} needs a file path, got an empty one")
    target = Path(path)
    if target.is_dir() or path.endswith(("/", os.sep)):  # Path() drops a trailing slash: "outdir/" would write a file "outdir"
        raise InputError(f"{flag} {path} is a folder; give a file path")
    if target.exists() and not target.is_file():
        raise InputError(f"{flag} {path} is not a regular file; give a file path")
    folder = target.parent
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{flag} {path}: {folder} is not a folder")
    if not folder.is_dir():
        raise InputError(f"{flag} {path}: folder {folder} does not exist")
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".probe")
    except OSError as err:
        raise InputError(f"{flag} {path}: cannot create a file in {folder} ({err.strerror or err})") from None
    os.close(handle)
    os.unlink(probe)
    return target
