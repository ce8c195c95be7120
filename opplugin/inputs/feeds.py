"""Datasets and feeds: the bundled Fashion-MNIST test set and its preprocessing,
seeded random data, and `make_inputs`, which picks between them for a model.

Preprocessing is deliberately tiny and shared with tools/train_models.py, so the
models see exactly the same pixels at training time and at inference time:
pixel / 255, then a half-pixel-centre bilinear resize when the model's input is
not 28x28. There is no mean/std normalisation.

With `pinned=True` the arrays `make_inputs` returns live in page-locked host
memory, so a GPU run copies them to the device by DMA without staging them
first (the fast path).
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..gpu import cuda
from ..core import host_threads
from ..errors import InputError, positive_int
from ..graph.model import BUNDLED_MODELS, Model
from ..core.paths import models_dir

TEST_IMAGES: int = 10000

TEST_IMAGES_FILE = "t10k-images-idx3-ubyte.gz"
TEST_LABELS_FILE = "t10k-labels-idx1-ubyte.gz"

# IDX element types (third byte of the magic number); multi-byte types are big-endian.
_IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(2)
    if head == b"\x1f\x8b":  # gzip magic, whatever the file is called
        try:
            with gzip.open(path, "rb") as f:
                return f.read()
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: damaged gzip stream ({exc})") from exc
    return path.read_bytes()


def load_idx(path) -> np.ndarray:
    """Read an IDX file (the MNIST container format), gzipped or plain."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise ValueError(f"{path}: not an IDX file (only {len(raw)} bytes, the header needs 4)")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()})")
    dtype = _IDX_DTYPES[raw[2]]
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions, {len(raw)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape)) * dtype.itemsize
    actual = len(raw) - header
    if actual != expected:
        what = "truncated" if actual < expected else "has trailing bytes"
        raise ValueError(
            f"{path}: IDX file {what}: shape {shape} needs {expected} data bytes, found {actual}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=True)


def load_test_set() -> tuple[np.ndarray, np.ndarray]:
    """The bundled Fashion-MNIST test set: (uint8 [10000,28,28], int64 [10000])."""
    folder = models_dir() / "data"
    images = load_idx(folder / TEST_IMAGES_FILE)
    labels = load_idx(folder / TEST_LABELS_FILE)
    if images.shape != (TEST_IMAGES, 28, 28) or labels.shape != (TEST_IMAGES,):
        raise ValueError(
            f"unexpected test set shapes {images.shape} / {labels.shape} in {folder}"
        )
    return images.astype(np.uint8), labels.astype(np.int64)


def _interp_matrix(size_in: int, size_out: int) -> np.ndarray:
    """[size_out, size_in] weights of 1-D linear interpolation, half-pixel centres.

    Same rule as torch's bilinear with align_corners=False: the source coordinate
    of output pixel i is (i + 0.5) * size_in / size_out - 0.5, clamped at 0, and
    the right neighbour is clamped at the last pixel.
    """
    scale = size_in / size_out
    src = np.maximum((np.arange(size_out, dtype=np.float64) + 0.5) * scale - 0.5, 0.0)
    left = np.minimum(np.floor(src).astype(np.int64), size_in - 1)
    right = np.minimum(left + 1, size_in - 1)
    frac = src - left
    rows = np.arange(size_out)
    weights = np.zeros((size_out, size_in), dtype=np.float64)
    np.add.at(weights, (rows, left), 1.0 - frac)
    np.add.at(weights, (rows, right), frac)
    return weights.astype(np.float32)


def resize_bilinear(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize float32 [N,h,w] -> [N,height,width] (rows then columns, by matmul)."""
    images = np.asarray(images, dtype=np.float32)
    if images.ndim != 3:
        raise ValueError(f"resize_bilinear wants [N,h,w] images, got shape {images.shape}")
    if height < 1 or width < 1:
        raise ValueError(f"resize_bilinear target size must be positive, got {height}x{width}")
    _, h, w = images.shape
    if (h, w) == (height, width):
        return images.copy()
    rows = _interp_matrix(h, height)        # [height, h]
    cols = _interp_matrix(w, width).T       # [w, width]
    return np.ascontiguousarray(np.matmul(np.matmul(rows, images), cols))


def to_model_input(images: np.ndarray, input_shape: tuple[int, int, int]) -> np.ndarray:
    """uint8 [N,28,28] -> float32 [N,C,H,W]: pixel/255, resized to (H,W) when needed."""
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {tuple(input_shape)}")
    channels, height, width = (int(d) for d in input_shape)
    if channels != 1:
        raise ValueError(
            f"the Fashion-MNIST images are greyscale (1 channel); the model wants {channels}"
        )
    images = np.asarray(images)
    if images.ndim != 3:
        raise ValueError(f"to_model_input wants [N,28,28] images, got shape {images.shape}")
    scaled = images.astype(np.float32) / np.float32(255.0)
    resized = resize_bilinear(scaled, height, width)
    return resized[:, None, :, :]


# Random data comes in blocks of this many elements, each from its own generator
# seeded by (seed, block number): the same images for any batch, any thread count.
RANDOM_BLOCK_ELEMENTS = 1 << 20


def numpy_seed(seed: int) -> int:
    """Any integer as a seed numpy takes (it refuses negative ones): a seed in
    [0, 2**64) is itself, a negative one its 64-bit two's complement (-1 is 2**64 - 1)."""
    return int(seed) % 2**64


def random_inputs(batch: int, input_shape: tuple[int, ...], seed: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [batch, *input_shape], uniform in (0, 1), reproducible by seed (any
    integer); the first n images are the same for every batch >= n. Fills `out` (a
    float32 array of that shape, pinned memory say) when given. Large batches are
    filled by several threads."""
    shape = (int(batch), *(int(d) for d in input_shape))
    if out is None:
        out = np.empty(shape, np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"random_inputs: out must be a C-contiguous float32 array of shape {shape}")
    flat = out.reshape(-1)
    blocks = -(-flat.size // RANDOM_BLOCK_ELEMENTS)
    seed = numpy_seed(seed)

    def fill(part: slice) -> None:
        for block in range(part.start, part.stop):
            piece = flat[block * RANDOM_BLOCK_ELEMENTS : (block + 1) * RANDOM_BLOCK_ELEMENTS]
            np.random.default_rng([seed, block]).random(out=piece, dtype=np.float32)
            # An exact 0.0 is possible in principle; nudge it so no element is ever zero
            # (an all-zero or zero-containing input can hide indexing bugs in a kernel).
            piece[piece == 0.0] = np.float32(2.0**-24)

    host_threads.for_pieces(blocks, RANDOM_BLOCK_ELEMENTS * 4, fill)
    return out


# --- feeds for a model ----------------------------------------------------------------

DATA_CHOICES = ("auto", "fashion-mnist", "random")


@dataclass
class Inputs:
    """Feeds for a run: `feeds` maps each graph input to its array, `labels` holds the
    test set's labels (None for random data), `source` says where the data came from."""

    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None
    source: str
    pinned: bool = False
    # graph inputs holding a Conv's weights that these feeds fill with random data
    random_weights: tuple[str, ...] = ()


def _empty(shape: tuple[int, ...], pinned: bool) -> np.ndarray:
    return cuda.pinned_empty(shape, np.float32) if pinned else np.empty(shape, np.float32)


def pinned_copy(array: np.ndarray) -> np.ndarray:
    """A float32 array's copy in page-locked memory (the array itself where there is no GPU)."""
    if not cuda.is_available():
        return array
    pinned = cuda.pinned_empty(array.shape, array.dtype)
    np.copyto(pinned, array)
    return pinned


def make_inputs(model: Model, batch: int, source: str = "auto", seed: int = 0, pinned: bool = False) -> Inputs:
    """`batch` images for `model`: the bundled Fashion-MNIST test set resized to the input
    (source "fashion-mnist", the default for shipped models) or seeded random data
    ("random"); `pinned` puts them in page-locked memory when there is a GPU."""
    if source not in DATA_CHOICES:
        raise InputError(f"unknown data source {source!r}; choose from {', '.join(DATA_CHOICES)}")
    batch = positive_int(batch, "batch")
    pinned = bool(pinned) and cuda.is_available()
    if source == "auto":
        source = "fashion-mnist" if model.name in BUNDLED_MODELS else "random"
    if source == "random":
        shapes = model.input_shapes(batch)
        feeds = {
            name: random_inputs(shape[0], shape[1:], seed=seed + n, out=_empty(shape, pinned))
            for n, (name, shape) in enumerate(shapes.items())
        }
        source = f"random uniform [0, 1), seed {seed}"
        weights = model.weight_inputs()
        if weights:  # the Conv's weights are graph inputs: the run makes them up too
            source += f"; Conv weights {', '.join(weights)} are graph inputs, filled with random data too"
        return Inputs(feeds, None, source, pinned, tuple(weights))

    if len(model.inputs) != 1:
        raise InputError(f"{model.name} has {len(model.inputs)} inputs; the Fashion-MNIST data feeds models with one image input")
    if batch > TEST_IMAGES:
        raise InputError(f"the bundled test set has {TEST_IMAGES} images; for batch {batch} use --data random")
    images, labels = load_test_set()
    name = model.inputs[0].name
    shape = model.sample_shape(name)
    if len(shape) != 3:
        raise InputError(f"{model.name}'s input {name!r} is {list(shape)}, not an image (C, H, W); use --data random")
    try:
        images = to_model_input(images[:batch], shape)
    except ValueError as err:
        raise InputError(f"{model.name}'s input {name!r} does not take Fashion-MNIST images: {err}; use --data random") from None
    if pinned:
        pageable, images = images, _empty(images.shape, True)
        np.copyto(images, pageable)
    return Inputs({name: images}, labels[:batch].astype(np.int64), f"Fashion-MNIST test set, first {batch} images", pinned)
