"""A user's own data: input shapes (`--input-shape`), tensors from a file (`--load-inputs`),
a folder of images (`--images`), and the outputs kept in a file (`--save-outputs`).

Every check here ends in one InputError line naming the flag, the file and what does
not match the model. The model's graph inputs are float32 (graph/model.py refuses others);
the batch is the first axis of every input whose first axis the model leaves free.
"""
from __future__ import annotations

import io
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..errors import InputError, ModelError
from .array_files import read_arrays
from .pixels import EIGHT_BIT_TARGETS, read_image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
FREE = None  # a dimension the model (and the user) leaves free


# --- shapes ---------------------------------------------------------------------------------


def declared_shape(value: onnx.ValueInfoProto) -> list[int | None]:
    """An input's dimensions: numbers, or None where the model leaves them free."""
    return [d.dim_value if d.HasField("dim_value") else FREE for d in value.type.tensor_type.shape.dim]


def shown(dims) -> str:
    """Dimensions as 1x3x224x224: N for a free batch axis, ? for another free one."""
    return "x".join(str(d) if d is not FREE else ("N" if axis == 0 else "?") for axis, d in enumerate(dims))


def parse_input_shapes(values: list[str] | None) -> dict[str, list[int | None]]:
    """{"x": [None, 3, 224, 224]} from --input-shape x:Nx3x224x224 flags; N (or ?) leaves an axis free."""
    shapes: dict[str, list[int | None]] = {}
    for value in values or []:
        name, sep, text = value.rpartition(":")
        if not sep or not name or not text:
            raise InputError(f"--input-shape takes NAME:DIMS, e.g. --input-shape input:1x3x224x224; got {value!r}")
        dims: list[int | None] = []
        for word in text.lower().split("x"):
            if word in ("n", "?"):
                dims.append(FREE)
            elif word.isdigit() and int(word) > 0:
                dims.append(int(word))
            else:
                raise InputError(f"--input-shape {value}: each dimension is a positive whole number, or N to leave it free")
        if name in shapes:
            raise InputError(f"--input-shape names {name!r} twice")
        shapes[name] = dims
    return shapes


def fix_input_shapes(model, shapes: dict[str, list[int | None]], flag: str = "--input-shape") -> None:
    """Give the model's free dimensions the sizes in `shapes`, in the graph that runs and in the
    one onnxruntime checks against; InputError for an unknown input, another rank, or a size
    the model fixes differently."""
    by_name = {value.name: value for value in model.inputs}
    for name, dims in shapes.items():
        if name not in by_name:
            raise InputError(f"{flag}: {model.name} has no input {name!r}; its inputs are {', '.join(by_name)}")
        have = declared_shape(by_name[name])
        if len(dims) != len(have):
            raise InputError(f"{flag} {name}:{shown(dims)} has rank {len(dims)}; {model.name}'s input {name!r} "
                             f"is {shown(have)}, rank {len(have)}")
        for axis, (want, fixed) in enumerate(zip(dims, have)):
            if want is not FREE and fixed is not FREE and want != fixed:
                raise InputError(f"{flag} {name}:{shown(dims)}: {model.name} fixes axis {axis} of {name!r} at {fixed} "
                                 f"(its shape is {shown(have)})")
    model.set_input_sizes({name: {axis: size for axis, size in enumerate(dims) if size is not FREE}
                           for name, dims in shapes.items()})


def require_runnable_inputs(model) -> None:
    """ModelError unless the model has graph inputs and every axis but the batch has a size."""
    if not model.inputs:
        raise ModelError(f"{model.name} has no graph inputs: opplugin feeds a batch of inputs, and this graph takes none")
    for value in model.inputs:
        dims = declared_shape(value)
        if not dims:
            continue
        if any(d is FREE for d in dims[1:]):
            fixed = "x".join(str(d) if d is not FREE else "?" for d in dims)
            raise InputError(f"{model.name}'s input {value.name!r} is {fixed}: only the batch axis may be free; "
                             f"give the others with --input-shape {value.name}:N{'x' * (len(dims) > 1)}"
                             f"{'x'.join('H' if d is FREE else str(d) for d in dims[1:])}")


# --- feeds from a file ------------------------------------------------------------------------


def load_feeds(path: str, model) -> dict[str, np.ndarray]:
    """The arrays of a .npz file (one per input name) or a .npy file (a one-input model),
    with the model's free dimensions taken from them; InputError for anything that does not fit."""
    flag = f"--load-inputs {path}"
    loaded = read_arrays(path, flag)
    names = [value.name for value in model.inputs]
    if isinstance(loaded, np.ndarray):
        if len(names) != 1:
            raise InputError(f"{flag}: a .npy file holds one array, and {model.name} has {len(names)} inputs "
                             f"({', '.join(names)}); give a .npz file with an array per input name")
        arrays = {names[0]: loaded}
    else:
        arrays = loaded
        unknown = [key for key in arrays if key not in names]
        if unknown:
            raise InputError(f"{flag} holds {', '.join(map(repr, unknown))}, which {model.name} does not take; "
                             f"its inputs are {', '.join(names)}")
        missing = [name for name in names if name not in arrays]
        if missing:
            raise InputError(f"{flag} has no array for {', '.join(map(repr, missing))}; {model.name}'s inputs are {', '.join(names)}")
    _fit(flag, model, arrays)
    return {name: np.ascontiguousarray(arrays[name]) for name in names}


def _fit(flag: str, model, arrays: dict[str, np.ndarray]) -> None:
    """Check dtypes and shapes against the model, then give its free axes (beyond the batch) the arrays' sizes."""
    shapes = {}
    for value in model.inputs:
        array, want = arrays[value.name], declared_shape(value)
        if array.dtype != np.float32:
            raise InputError(f"{flag}: {value.name!r} is {array.dtype}; {model.name} takes float32 "
                             "(convert it with .astype(numpy.float32))")
        if array.ndim != len(want) or any(w is not FREE and w != h for w, h in zip(want, array.shape)):
            raise InputError(f"{flag}: {value.name!r} has shape {shown(array.shape)}; {model.name} takes {shown(want)}")
        if array.ndim and array.shape[0] == 0:
            raise InputError(f"{flag}: {value.name!r} holds no samples (its first axis is 0)")
        shapes[value.name] = [FREE if axis == 0 and w is FREE else h for axis, (w, h) in enumerate(zip(want, array.shape))]
    fix_input_shapes(model, shapes, flag)
    batches = {arrays[v.name].shape[0] for v in model.inputs if declared_shape(v)[:1] == [FREE]}
    if len(batches) > 1:
        raise InputError(f"{flag}: the inputs have different batches {sorted(batches)}")


# --- feeds from images -----------------------------------------------------------------------


def image_files(folder: str | Path) -> list[Path]:
    """The PNG and JPEG files of a folder, sorted by name (the order of the batch)."""
    try:
        return sorted((p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()),
                      key=lambda p: p.name)
    except OSError as err:
        raise InputError(f"--images {folder}: cannot list it ({err.strerror or err})") from None


def parse_pair(text: str | None, flag: str) -> tuple[int, int] | None:
    """H,W of --resize."""
    if text is None:
        return None
    words = text.replace("x", ",").split(",")
    if len(words) != 2 or not all(w.strip().isdigit() and int(w) > 0 for w in words):
        raise InputError(f"{flag} takes H,W, two positive whole numbers, e.g. {flag} 224,224; got {text!r}")
    return int(words[0]), int(words[1])


def parse_channels(text: str | None, flag: str, channels: int, default: float, *, positive: bool = False) -> np.ndarray:
    """Per-channel values of --mean / --std: one value for every channel, or one per channel."""
    if text is None:
        return np.full(channels, default, np.float32)
    try:
        values = [float(word) for word in text.split(",")]
    except ValueError:
        raise InputError(f"{flag} takes numbers separated by commas, e.g. {flag} 0.485,0.456,0.406; got {text!r}") from None
    if len(values) not in (1, channels):
        raise InputError(f"{flag} gives {len(values)} values; the images have {channels} channel{'s' * (channels > 1)}")
    if not all(math.isfinite(v) and (v > 0 or not positive) for v in values):
        raise InputError(f"{flag} values must be finite{' and above 0' if positive else ''}; got {text}")
    with np.errstate(over="ignore"):
        array = np.array(values * (channels // len(values)), np.float32)  # what the images are computed with
    tiny = np.finfo(np.float32).tiny
    if not np.all(np.isfinite(array)) or (positive and not np.all(array >= tiny)):
        raise InputError(f"{flag} values must be float32 numbers{f' of at least {tiny:.3g}' if positive else ''} "
                         f"(the images are float32); got {text}")
    return array


@dataclass(frozen=True)
class ImageOptions:
    folder: str
    resize: str | None = None
    mean: str | None = None
    std: str | None = None


def load_images(options: ImageOptions, model) -> dict[str, np.ndarray]:
    """The folder's images as the model's one image input, float32 [N, C, H, W]: each pixel in [0, 1]
    by its image's full range (pixels.py), resized (bilinear) to --resize or the model's size, then
    (x - mean) / std per channel."""
    flag = f"--images {options.folder}"
    folder = Path(options.folder)
    if not folder.is_dir():
        raise InputError(f"{flag}: {'not a folder' if folder.exists() else 'no such folder'}")
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise InputError("--images needs Pillow, which is not installed: pip install 'opplugin[images]'") from None
    files = image_files(folder)
    if not files:
        raise InputError(f"{flag}: no PNG or JPEG files there")
    value = _image_input(flag, model)
    dims = declared_shape(value)
    channels = dims[1]
    if channels not in EIGHT_BIT_TARGETS:
        raise InputError(f"{flag}: {model.name}'s input {value.name!r} is {shown(dims)}; images give 1 or 3 channels")
    size = parse_pair(options.resize, "--resize")
    model_size = tuple(dims[2:])
    if size is None:
        if FREE in model_size:
            raise InputError(f"{flag}: {model.name}'s input {value.name!r} is {shown(dims)}; give the size with --resize H,W")
        size = model_size
    elif FREE not in model_size and size != model_size:
        raise InputError(f"--resize {options.resize}: {model.name}'s input {value.name!r} is {shown(dims)}")
    mean = parse_channels(options.mean, "--mean", channels, 0.0)
    std = parse_channels(options.std, "--std", channels, 1.0, positive=True)
    batch = np.empty((len(files), channels, *size), np.float32)
    for index, path in enumerate(files):
        batch[index] = read_image(path, channels, size, flag).transpose(2, 0, 1)
    batch -= mean[:, None, None]
    with np.errstate(over="ignore"):
        batch /= std[:, None, None]
    if not np.all(np.isfinite(batch)):
        raise InputError(f"--mean {options.mean} / --std {options.std}: they make some image values overflow float32")
    fix_input_shapes(model, {value.name: [dims[0], channels, *size]}, flag)
    return {value.name: batch}


def _image_input(flag: str, model) -> onnx.ValueInfoProto:
    if len(model.inputs) != 1 or len(declared_shape(model.inputs[0])) != 4:
        described = ", ".join(f"{v.name} {shown(declared_shape(v))}" for v in model.inputs)
        raise InputError(f"{flag}: images feed a model with one image input [N, C, H, W]; {model.name} takes {described}")
    return model.inputs[0]


# --- outputs ------------------------------------------------------------------------------


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
    """The arrays as a .npz file, one per tensor name, written atomically."""
    from ..core.files import write_atomic

    buffer = io.BytesIO()
    # what numpy.savez writes, without its keyword arguments (a tensor may be called "file")
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
    write_atomic(path, buffer.getvalue())
