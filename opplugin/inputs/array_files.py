"""A .npy or .npz file read as plain numeric arrays and nothing else.

Whatever else the file is (empty, text, a damaged zip, a zip member that is not a .npy
array, Python objects that only pickle could load, a header that promises more bytes than
the file holds) is one InputError line naming the file and what is wrong. numpy's own
messages advise allow_pickle, which opplugin never uses: a file of inputs must not run code.
The first bytes decide what the file is, not its name.
"""
from __future__ import annotations

import math
import os
import stat
import zipfile
import zlib
from typing import BinaryIO

import numpy as np

from ..errors import InputError

NPY_MAGIC = b"\x93NUMPY"
# a zip's first member, or the end record of a zip without members
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
# what a damaged file or zip member raises while it is read
DAMAGED = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError)
# the .npy header readers numpy makes public; version 3.0 is written only for structured
# arrays with non-Latin-1 field names, which are never the float32 arrays opplugin takes
HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def read_arrays(path: str, flag: str) -> np.ndarray | dict[str, np.ndarray]:
    """A .npy file's array, or a .npz file's arrays by name; `flag` ("--load-inputs FILE") begins each error."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{flag}: no such file") from None
    except OSError as err:
        raise InputError(f"{flag}: cannot read it ({err.strerror or err})") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{flag} is a folder; give a .npz or .npy file")
    if not stat.S_ISREG(info.st_mode):  # a pipe would hold the command until someone writes to it
        raise InputError(f"{flag}: not a regular file (a pipe, socket or device); give a .npz or .npy file")
    if info.st_size == 0:
        raise InputError(f"{flag}: the file is empty (0 bytes)")
    try:
        with open(path, "rb") as stream:
            head = stream.read(len(NPY_MAGIC))
            if head == NPY_MAGIC:
                stream.seek(0)
                return _array(stream, os.fstat(stream.fileno()).st_size, f"{flag}: a .npy file")
    except OSError as err:
        raise InputError(f"{flag}: cannot read it ({err.strerror or err})") from None
    if head[:4] in ZIP_MAGICS:
        return _members(path, flag)
    raise InputError(f"{flag}: not a .npy or .npz file (it begins with neither numpy's .npy signature nor a zip's)")


def _members(path: str, flag: str) -> dict[str, np.ndarray]:
    """Every member of a .npz file, each a .npy array named after its member (less .npy)."""
    arrays = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.is_dir():
                    continue
                name = member.filename
                if not name.endswith(".npy"):
                    raise InputError(f"{flag}: its member {name!r} is not a .npy array; a .npz file holds only "
                                     "arrays, as numpy.savez writes them")
                with archive.open(member) as stream:
                    arrays[name[: -len(".npy")]] = _array(stream, member.file_size, f"{flag}: member {name!r}")
    except InputError:
        raise
    except DAMAGED as err:
        raise InputError(f"{flag}: a damaged .npz file, not a complete zip archive ({err})") from None
    return arrays


def _array(stream: BinaryIO, size: int, where: str) -> np.ndarray:
    """The .npy array at the start of `stream` (`size` bytes in all): numbers only, all of them there."""
    try:
        version = np.lib.format.read_magic(stream)
        reader = HEADER_READERS.get(version)
        if reader is None:
            raise InputError(f"{where} is .npy format {version[0]}.{version[1]}, which numpy writes only for structured "
                             "arrays; opplugin takes float32 arrays")
        shape, _, dtype = reader(stream)
        if dtype.hasobject:
            raise InputError(f"{where} holds Python objects (dtype {dtype}), not numbers; opplugin never unpickles "
                             "a file of inputs: save float32 arrays")
        wanted = math.prod(shape) * dtype.itemsize
        held = size - stream.tell()
        if wanted > held:  # checked before numpy allocates what the header claims
            raise InputError(f"{where} is cut short: its header promises {'x'.join(map(str, shape)) or 'a scalar'} "
                             f"{dtype} ({wanted} bytes), and it holds {max(held, 0)}")
        stream.seek(0)
        return np.lib.format.read_array(stream, allow_pickle=False)
    except InputError:
        raise
    except DAMAGED as err:
        raise InputError(f"{where} is damaged ({err})") from None
