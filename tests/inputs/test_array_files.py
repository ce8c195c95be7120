"""A .npy or .npz file read as plain arrays: what numpy writes comes back as it was, and
everything else (empty, text, a damaged zip, a member that is not an array, Python
objects, a header promising more than the file holds, a pipe) is one InputError line
naming the file and what is wrong, never numpy's advice to allow pickle."""
from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

from opplugin.errors import InputError
from opplugin.inputs.array_files import read_arrays

X = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)


def flag(path) -> str:
    return f"--load-inputs {path}"


def test_what_numpy_writes_comes_back_whatever_the_file_is_called(tmp_path):
    np.save(tmp_path / "x.npy", X)
    assert np.array_equal(read_arrays(str(tmp_path / "x.npy"), "f"), X)
    np.savez(tmp_path / "plain.npz", x=X, y=X[0])
    np.savez_compressed(tmp_path / "small.npz", x=X)
    plain = read_arrays(str(tmp_path / "plain.npz"), "f")
    assert sorted(plain) == ["x", "y"] and np.array_equal(plain["x"], X) and np.array_equal(plain["y"], X[0])
    assert np.array_equal(read_arrays(str(tmp_path / "small.npz"), "f")["x"], X)
    os.rename(tmp_path / "plain.npz", tmp_path / "named.npy")  # the first bytes decide, not the name
    assert sorted(read_arrays(str(tmp_path / "named.npy"), "f")) == ["x", "y"]
    np.savez(tmp_path / "none.npz")
    assert read_arrays(str(tmp_path / "none.npz"), "f") == {}


def _savez(path, save=np.savez, **arrays) -> None:
    """A .npz file under any name (numpy.savez appends .npz to a name without it)."""
    with open(path, "wb") as stream:
        save(stream, **arrays)


def _npz_member(path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(name, data)


def _cut(path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def _header_claiming(path, shape) -> None:
    header = np.lib.format.header_data_from_array_1_0(X)
    header["shape"] = shape
    with open(path, "wb") as stream:
        np.lib.format.write_array_header_1_0(stream, header)
        stream.write(b"\0" * 64)


def _damaged_member(path) -> None:
    _savez(path, np.savez_compressed, x=X + 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside the deflated member: its CRC no longer matches
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b""), "FLAG: the file is empty (0 bytes)"),
    (lambda p: p.write_text("hello, these are not arrays"),
     "FLAG: not a .npy or .npz file (it begins with neither numpy's .npy signature nor a zip's)"),
    (lambda p: np.save(p, np.array([{"a": 1}, None], dtype=object), allow_pickle=True),
     "FLAG: a .npy file holds Python objects (dtype object), not numbers; opplugin never unpickles a file of inputs"),
    (lambda p: _savez(p, x=np.array([{"a": 1}], dtype=object)),
     "FLAG: member 'x.npy' holds Python objects (dtype object)"),
    (lambda p: _npz_member(p, "x", b"bytes that are no array"),
     "FLAG: its member 'x' is not a .npy array; a .npz file holds only arrays, as numpy.savez writes them"),
    (lambda p: _npz_member(p, "readme.txt", b"hello"), "FLAG: its member 'readme.txt' is not a .npy array"),
    (lambda p: (_savez(p, x=X), _cut(p, 200)), "FLAG: a damaged .npz file, not a complete zip archive ("),
    (lambda p: p.write_bytes(b"PK\x03\x04 not really a zip"), "FLAG: a damaged .npz file, not a complete zip archive ("),
    (lambda p: (np.save(p, X), _cut(p, 140)),
     "FLAG: a .npy file is cut short: its header promises 2x3x4 float32 (96 bytes), and it holds 12"),
    (lambda p: _header_claiming(p, (10**9, 10**9)),
     "FLAG: a .npy file is cut short: its header promises 1000000000x1000000000 float32 (4000000000000000000 bytes)"),
    (lambda p: _damaged_member(p), "FLAG: member 'x.npy' is damaged (Bad CRC-32"),
    (lambda p: p.write_bytes(b"\x93NUMPY\x03\x00" + b"\0" * 40), "FLAG: a .npy file is .npy format 3.0"),
    (lambda p: p.write_bytes(b"\x93NUMPY\x01\x00\x05\x00{'x'}" + b"\0" * 40), "FLAG: a .npy file is damaged ("),
    (lambda p: None, "FLAG: no such file"),
    (lambda p: p.mkdir(), "FLAG is a folder; give a .npz or .npy file"),
    (lambda p: os.mkfifo(p), "FLAG: not a regular file (a pipe, socket or device)"),
])
def test_anything_but_plain_arrays_is_one_line_naming_the_file(make, message, tmp_path):
    path = tmp_path / "inputs.npy"
    make(path)
    with pytest.raises(InputError) as caught:
        read_arrays(str(path), flag(path))
    text = str(caught.value)
    assert text.startswith(message.replace("FLAG", flag(path))), text
    assert "\n" not in text and "pickle=" not in text and "pickle.load" not in text
