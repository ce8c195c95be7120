"""Writing files so that a reader never sees half of one, and checking, before any
work, that a file the user named can be written.

Every output goes through write_atomic (or create_new, which never replaces), so all
writers treat paths alike: a symbolic link is written through to its target, as a
shell's `>` does, and the temporary file has a short name of its own beside the final
file, so a final name as long as the file system allows still works."""
from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Iterator, TextIO

from ..errors import InputError

# temporary files beside an output: short, whatever the output's name (a name near 255 bytes has no room for more)
TEMPORARY_PREFIX = ".opplugin-"


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


def final_path(path: str | Path) -> Path:
    """The file writing `path` changes: a symbolic link's target (a dangling link's too), else `path`.
    OSError (ELOOP) for links that lead round in a circle."""
    path = Path(path)
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # realpath gives up on a loop and returns a link
        raise OSError(errno.ELOOP, "its symbolic links lead round in a circle", str(path))
    return target


def _temporary_beside(path: Path, text: str | bytes, mode: int) -> str:
    """A temporary file in `path`'s folder holding `text`, flushed to disk, with `mode`; its name."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=TEMPORARY_PREFIX, suffix=".tmp")
    try:
        os.fchmod(handle, mode)
        binary = isinstance(text, bytes)
        with os.fdopen(handle, "wb" if binary else "w", encoding=None if binary else "utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return temporary


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write `text` (or bytes) to a temporary file beside `path`, flush it to disk, then
    rename it over `path` (over a symbolic link's target: the link stays). On any failure
    the old file (if any) is left whole and the temporary one is removed. The path `-`
    writes the text to standard output."""
    if str(path) == STDOUT and isinstance(text, str):
        stream = _report_stream or sys.stdout
        stream.write(text)
        stream.flush()
        return
    target = final_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary_beside(target, text, _mode_for(target))
    try:
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def create_new(path: str | Path, text: str | bytes) -> None:
    """Write `text` to `path`, which must not exist: FileExistsError when anything has the name
    (a dangling symbolic link too), also when another process creates it meanwhile, so of
    two writers exactly one wins. The file appears whole: it is written beside `path` and
    hard-linked to its name, which fails when the name is taken."""
    path = Path(path)
    temporary = _temporary_beside(path, text, 0o666 & ~_umask())
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        _create_exclusive(path, text)  # a file system without hard links: exclusive still, if not whole at once
    finally:
        Path(temporary).unlink(missing_ok=True)


def _create_exclusive(path: Path, text: str | bytes) -> None:
    """Create `path` with O_EXCL and write `text` into it; on failure remove what was begun."""
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # open() applies the umask
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def check_writable(path: str, flag: str) -> Path:
    """InputError naming `flag` unless write_atomic can write `path`: not empty, not a
    folder or a special file, in an existing folder where a file can be created (a
    symbolic link's target's folder: the write goes through the link).
    The folder is probed by creating a temporary file there and removing it at once,
    which is the only test that /proc, read-only mounts and permissions all answer
    truthfully; nothing is left behind and an existing file is not touched."""
    if not path or not path.strip():
        raise InputError(f"{flag} needs a file path, got an empty one")
    target = Path(path)
    try:
        os.stat(path)  # through a link too: its target's name may be the one too long
    except OSError as err:  # a name too long fails every look at it, so it is asked first
        if err.errno == errno.ENAMETOOLONG:
            raise InputError(f"{flag} {path}: the name is longer than the file system allows") from None
    if target.is_dir() or path.endswith(("/", os.sep)):  # Path() drops a trailing slash: "outdir/" would write a file "outdir"
        raise InputError(f"{flag} {path} is a folder; give a file path")
    if target.exists() and not target.is_file():
        raise InputError(f"{flag} {path} is not a regular file; give a file path")
    try:
        final = final_path(target)
    except OSError as err:
        raise InputError(f"{flag} {path}: {err.strerror}") from None
    folder = final.parent
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{flag} {path}: {folder} is not a folder")
    if not folder.is_dir():
        raise InputError(f"{flag} {path}: folder {folder} does not exist")
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=TEMPORARY_PREFIX, suffix=".probe")
    except OSError as err:
        raise InputError(f"{flag} {path}: cannot create a file in {folder} ({err.strerror or err})") from None
    os.close(handle)
    os.unlink(probe)
    return target
