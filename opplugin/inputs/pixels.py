"""One image file as float32 numbers in [0, 1], whatever its bit depth.

Each Pillow mode is scaled by its own full range: 8-bit samples (modes 1, L, P, RGB, CMYK
...) by 255 after Pillow's own conversion to L or RGB (greyscale repeated into RGB, RGB to
greyscale by ITU-R 601 luma, a palette looked up, CMYK by Pillow's plain formula), 16-bit
greyscale by 65535 (Pillow would clip it to 8 bits), and a float image taken as it is when it
lies in [0, 1]. Where no mapping is sound the file is refused in one InputError line naming it
and its mode: 32-bit integers (no full range to scale by), floats outside [0, 1], and
transparent pixels (the colour behind them is anybody's guess).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError

# Pillow's 8-bit mode of each channel count a model can take
EIGHT_BIT_TARGETS = {1: "L", 3: "RGB"}
# the modes whose samples have 8 bits (or 1), which Pillow converts to L and RGB without loss of range
EIGHT_BIT = ("1", "L", "P", "RGB", "RGBX", "RGBA", "RGBa", "LA", "PA", "CMYK", "YCbCr", "HSV", "LAB")
# one unsigned 16-bit sample a pixel: little, big and native endian
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
# the modes with an alpha band, and its name (lower case: premultiplied); LAB's "A" is a colour
ALPHA_BANDS = {"RGBA": "A", "LA": "A", "PA": "A", "RGBa": "a", "La": "a"}
RESAVE = "save it as an 8- or 16-bit PNG, or give the arrays with --load-inputs"


def read_image(path: Path, channels: int, size: tuple[int, int], where: str) -> np.ndarray:
    """The image at `path` as float32 [H, W, channels] in [0, 1], resized (bilinear) to `size` (H, W);
    `where` ("--images DIR") begins each error, which names the file."""
    from PIL import Image, UnidentifiedImageError

    named = f"{where}: {path.name}"
    try:
        if path.stat().st_size == 0:
            raise InputError(f"{named} is empty (0 bytes)")
        with Image.open(path) as image:
            image.load()
            return image_pixels(image, channels, size, named)
    except InputError:
        raise
    except UnidentifiedImageError:
        raise InputError(f"{where}: cannot read {path.name} as an image (Pillow does not recognise it)") from None
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise InputError(f"{where}: cannot read {path.name} as an image ({err})") from None


def image_pixels(image, channels: int, size: tuple[int, int], named: str) -> np.ndarray:
    """An open Pillow image as float32 [H, W, channels] in [0, 1], resized to `size`; `named` begins each error."""
    mode = image.mode
    _refuse_transparency(image, named)
    if mode in EIGHT_BIT:
        return _eight_bit(image, channels, size, named)
    if mode in SIXTEEN_BIT or (mode == "I" and image.format == "PNG"):  # older Pillow opens a 16-bit PNG as I
        grey = np.asarray(image, np.float32) / np.float32(65535.0)
    elif mode == "F":
        grey = _unit_floats(image, named)
    elif mode == "I":
        raise InputError(f"{named} is mode I (32-bit integers), which has no full range to scale to [0, 1]; {RESAVE}")
    else:
        raise InputError(f"{named} is mode {mode}, which opplugin cannot map to [0, 1]; {RESAVE}")
    return _resized_grey(grey, channels, size)


def _refuse_transparency(image, named: str) -> None:
    """InputError where a pixel is not fully opaque: a model takes colours, not what lies behind them."""
    alpha_band = ALPHA_BANDS.get(image.mode)
    if alpha_band is not None:
        transparent = image.getchannel(alpha_band).getextrema()[0] < 255
    elif "transparency" not in image.info:
        return
    elif image.mode in SIXTEEN_BIT or image.mode == "I":  # one grey value marked transparent
        transparent = bool(np.any(np.asarray(image) == image.info["transparency"]))
    else:  # a palette entry or colour marked transparent
        transparent = image.convert("RGBA").getchannel("A").getextrema()[0] < 255
    if transparent:
        raise InputError(f"{named} has transparent pixels (mode {image.mode}); opplugin does not guess the colour "
                         "behind them: flatten the image onto a background first")


def _eight_bit(image, channels: int, size: tuple[int, int], named: str) -> np.ndarray:
    """Converted by Pillow, resized in 8 bits (as PIL-based pipelines do), then / 255."""
    from PIL import Image

    target = EIGHT_BIT_TARGETS[channels]
    try:
        pixels = image.convert(target)
    except ValueError:
        raise InputError(f"{named} is mode {image.mode}, which Pillow cannot convert to {target}; {RESAVE}") from None
    if pixels.size != (size[1], size[0]):
        pixels = pixels.resize((size[1], size[0]), Image.BILINEAR)
    return (np.asarray(pixels, np.float32) / np.float32(255.0)).reshape(*size, channels)


def _unit_floats(image, named: str) -> np.ndarray:
    grey = np.asarray(image, np.float32)
    if not np.all(np.isfinite(grey)):
        raise InputError(f"{named} is mode F (32-bit floats) and holds NaN or infinite values")
    low, high = float(grey.min()), float(grey.max())
    if low < 0 or high > 1:
        raise InputError(f"{named} is mode F (32-bit floats) with values from {low:g} to {high:g}; opplugin takes "
                         f"a float image as it is only where it lies in [0, 1]: scale it, or give the arrays with --load-inputs")
    return grey


def _resized_grey(grey: np.ndarray, channels: int, size: tuple[int, int]) -> np.ndarray:
    """One float channel resized (bilinear, in float: no rounding to 8 bits), repeated into `channels`."""
    from PIL import Image

    if grey.shape != size:
        grey = np.asarray(Image.fromarray(np.ascontiguousarray(grey, np.float32)).resize((size[1], size[0]), Image.BILINEAR))
    return np.repeat(grey[:, :, None], channels, axis=2).astype(np.float32, copy=False)
