"""The one rule every command keeps about files: nothing it reads is ever written.

Before any work, each file a command will write (`--json`, `--csv`, `--trace`, `--report`,
`--save-outputs`) is checked to be writable and compared with every other output
and with every file the command reads: the model (given by name or by path), its
external data files, `--kernel` sources, `--ops` files, the `--load-inputs` file and the `--images`
files. Two paths are the same file when they resolve to the same place or name the
same (device, inode), which catches symbolic and hard links alike. A clash is an
InputError, one line, before anything is loaded or written. A file the command
reads but cannot open, or that is a folder or a pipe where a file is read, is refused
here too, with the reason.

`-` names standard output for the report files that allow it (`--json`, `--csv`, `--report`).
Each command says which files it names (CommandFiles, from its options' `files()`).
"""
from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from ..core.files import check_writable
from ..errors import InputError
from ..graph.model import resolve_model_path
from ..inputs.user_data import image_files

STDOUT = "-"
# the outputs that may be `-` (standard output): text reports, not binary files
STDOUT_FLAGS = ("--json", "--csv", "--report")


@dataclass(frozen=True)
class CommandFiles:
    """The files one command names: each it writes, with its flag, and those it reads."""

    outputs: tuple[tuple[str, str], ...] = ()  # (flag, path), in the order their clashes are reported
    models: tuple[str, ...] = ()  # model files or shipped models' names, as given
    kernels: tuple[str, ...] = ()  # --kernel sources
    ops: tuple[str, ...] = ()  # --ops declaration files
    load_inputs: str | None = None
    images: str | None = None  # a folder


@dataclass(frozen=True)
class Place:
    """Where a path leads: its resolved path, and (device, inode) when it exists."""

    resolved: str
    inode: tuple[int, int] | None

    @classmethod
    def of(cls, path: str | Path) -> "Place":
        resolved = os.path.realpath(path)
        try:
            status = os.stat(resolved)
        except OSError:
            return cls(resolved, None)
        return cls(resolved, (status.st_dev, status.st_ino))

    def same_as(self, other: "Place") -> bool:
        return self.resolved == other.resolved or (self.inode is not None and self.inode == other.inode)


def stdout_outputs(files: CommandFiles) -> list[str]:
    """The flags of the outputs that go to standard output."""
    return [flag for flag, path in files.outputs if path == STDOUT]


def check_files(files: CommandFiles) -> None:
    """InputError for the first output that cannot be written, is given twice, or is a file
    the command reads; and for a file the command reads that cannot be opened."""
    outputs: list[tuple[str, str, Place]] = []
    for flag, path in files.outputs:
        if path == STDOUT:
            if flag not in STDOUT_FLAGS:
                raise InputError(f"{flag} writes a binary file; give a file path, not -")
            continue
        check_writable(path, flag)
        place = Place.of(path)
        for other_flag, other_path, other in outputs:
            if place.same_as(other):
                raise InputError(f"{flag} {path} is the same file as {other_flag}; give each output its own file")
        outputs.append((flag, path, place))
    if len(stdout_outputs(files)) > 1:
        raise InputError(f"{' and '.join(stdout_outputs(files))} both name standard output (-); give one of them a file")

    for what, path in files_named(files):
        _check_regular(what, path)
    reads = list(files_read(files))
    for what, path in reads:
        _check_readable(what, path)
    existing = [(flag, path, place) for flag, path, place in outputs if place.inode is not None]
    if not existing:
        return  # a file that does not exist yet cannot be one the command reads
    read_places = [(what, Place.of(path)) for what, path in reads]
    read_places += [(what, Place.of(path)) for what, path in external_data_near(files, existing)]
    for flag, path, place in existing:
        for what, read in read_places:
            if place.same_as(read):
                raise InputError(f"{flag} {path} is the same file as {what}, which the command reads; "
                                 "give the output another path")


def files_named(files: CommandFiles) -> Iterator[tuple[str, str]]:
    """(what, path) for each file the command reads by its flags, whether it exists or not (the
    models resolved from a shipped name)."""
    for name in files.models:
        yield "the model", str(resolve_model_path(name))
    for path in files.kernels:
        yield "a --kernel source", path
    for path in files.ops:
        yield "an --ops file", path


def files_read(files: CommandFiles) -> Iterator[tuple[str, str]]:
    """(what, path) for each existing file the command reads, as far as its flags say
    (the models' external data aside: see external_data_near)."""
    for model in _models(files):
        yield "the model", str(model)
    for path in files.kernels:
        if Path(path).is_file():
            yield "a --kernel source", path
    for path in files.ops:
        if Path(path).is_file():
            yield "an --ops file", path
    if files.load_inputs and Path(files.load_inputs).is_file():
        yield "the --load-inputs file", files.load_inputs
    if files.images and Path(files.images).is_dir():
        for image in image_files(files.images):
            yield "an --images file", str(image)


def _models(files: CommandFiles) -> Iterator[Path]:
    """The model files the command names (resolved from a shipped name), those that exist."""
    for name in files.models:
        path = resolve_model_path(name)
        if path.is_file():
            yield path


def external_data_near(files: CommandFiles, outputs: list[tuple[str, str, Place]]) -> Iterator[tuple[str, str]]:
    """The external data files of the models, read from the models' headers only when an
    existing output could be one: it lies in a model's folder, or has another hard link."""
    for model in _models(files):
        folder = os.path.realpath(model.parent)
        if not any(place.resolved.startswith(folder + os.sep) or os.stat(place.resolved).st_nlink > 1
                   for _, _, place in outputs):
            continue
        for location in external_data_files(model):
            yield f"external data of the model ({location})", str(model.parent / location)


def external_data_files(model: Path) -> list[str]:
    """The locations (relative to the model's folder) of the tensors the model keeps in external files."""
    if not _mentions(model, b"location"):
        return []  # every external tensor names its file under the key "location": a large model with its weights inline is not parsed
    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception:  # not ONNX at all: loading it says so, with the reason
        return []
    locations = []
    for tensor in _tensors(proto.graph):
        if uses_external_data(tensor):
            locations.append(ExternalDataInfo(tensor).location)
    return list(dict.fromkeys(locations))


def _mentions(path: Path, word: bytes) -> bool:
    """Whether the file's bytes hold `word` (read through a memory map, not into memory)."""
    try:
        with open(path, "rb") as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(word) != -1
    except (OSError, ValueError):  # an empty file cannot be mapped
        return False


def _tensors(graph) -> Iterator:
    """Every tensor of a graph: its initializers, and tensor attributes of its nodes and their subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            yield from attribute.tensors
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _tensors(sub)


def _check_regular(what: str, path: str) -> None:
    """InputError for a folder or a special file where a file is read: a pipe (FIFO) would hold the
    command until something writes to it. A missing file is left to the loader, which names the
    shipped models."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISDIR(mode):
        raise InputError(f"{path} ({what}) is a folder; give a file")
    if not stat.S_ISREG(mode):
        raise InputError(f"{path} ({what}) is not a regular file (a pipe, socket or device); give a file")


def _check_readable(what: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise InputError(f"{path} ({what}): cannot read it ({err.strerror or err})") from None
