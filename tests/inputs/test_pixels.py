"""An image file in [0, 1] by its own bit depth: 16-bit PNGs / 65535 (never clipped to 8 bits),
8-bit modes / 255 after Pillow's conversion, floats in [0, 1] as they are; transparent pixels,
32-bit integers and floats outside [0, 1] refused in one line naming the file and its mode."""
from __future__ import annotations

import numpy as np
import pytest

from opplugin.errors import InputError
from opplugin.inputs.pixels import image_pixels, read_image

Image = pytest.importorskip("PIL.Image")
WHERE = "--images photos"


def sixteen_bit(shape=(6, 5), seed=0) -> np.ndarray:
    """uint16 values over the whole range, the extremes among them."""
    values = np.random.default_rng(seed).integers(0, 65536, shape, dtype=np.uint16)
    values.flat[:2] = (0, 65535)
    return values


def refused(work, *words: str) -> str:
    with pytest.raises(InputError) as caught:
        work()
    message = str(caught.value)
    assert "\n" not in message and all(word in message for word in words), message
    return message


def test_a_16_bit_png_is_pixel_over_65535_not_clipped_to_8_bits(tmp_path):
    values = sixteen_bit()
    image = Image.fromarray(values)
    assert image.mode == "I;16"
    image.save(tmp_path / "deep.png")
    with Image.open(tmp_path / "deep.png") as check:
        assert check.mode == "I;16"  # the file really holds 16-bit samples
    grey = read_image(tmp_path / "deep.png", 1, values.shape, WHERE)
    assert grey.dtype == np.float32 and grey.shape == (*values.shape, 1)
    np.testing.assert_array_equal(grey[:, :, 0], values.astype(np.float32) / np.float32(65535))
    assert grey.min() == 0.0 and grey.max() == 1.0 and np.mean(grey == 1.0) < 0.1  # before: 99.6% of them 1.0
    rgb = read_image(tmp_path / "deep.png", 3, values.shape, WHERE)
    assert all(np.array_equal(rgb[:, :, c], grey[:, :, 0]) for c in range(3))  # greyscale repeated, as for 8 bits


def test_a_16_bit_png_is_resized_in_float(tmp_path):
    values = sixteen_bit((40, 30))
    Image.fromarray(values).save(tmp_path / "deep.png")
    grey = read_image(tmp_path / "deep.png", 1, (20, 15), WHERE)[:, :, 0]
    exact = values.astype(np.float32) / np.float32(65535)
    expected = np.asarray(Image.fromarray(exact).resize((15, 20), Image.BILINEAR))
    np.testing.assert_array_equal(grey, expected)
    assert 0 <= grey.min() and grey.max() <= 1 and len(np.unique(grey)) > 256  # finer than 8 bits


@pytest.mark.parametrize("dtype", ["<u2", ">u2"])
def test_each_16_bit_byte_order_is_read_alike(dtype):
    values = sixteen_bit()
    image = Image.fromarray(values.astype(dtype))
    assert image.mode in ("I;16", "I;16B")
    np.testing.assert_array_equal(image_pixels(image, 1, values.shape, "x.png")[:, :, 0], values.astype(np.float32) / np.float32(65535))


def test_mode_i_of_a_png_is_16_bit_as_older_pillow_opens_it():
    values = sixteen_bit().astype(np.int32)
    image = Image.fromarray(values)
    assert image.mode == "I"
    image.format = "PNG"  # what Pillow before I;16 gave for a 16-bit greyscale PNG
    np.testing.assert_array_equal(image_pixels(image, 1, values.shape, "x.png")[:, :, 0], values.astype(np.float32) / np.float32(65535))
    image.format = "TIFF"
    refused(lambda: image_pixels(image, 1, values.shape, "--images photos: x.png"),
            "--images photos: x.png is mode I (32-bit integers), which has no full range to scale to [0, 1]")


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "CMYK", "YCbCr"])
@pytest.mark.parametrize("channels", [1, 3])
def test_8_bit_modes_are_pillows_conversion_over_255(mode, channels):
    rgb = np.random.default_rng(1).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    image = Image.fromarray(rgb).convert(mode)
    target = {1: "L", 3: "RGB"}[channels]
    expected = np.asarray(image.convert(target), np.float32).reshape(6, 5, channels) / np.float32(255)
    got = image_pixels(image, channels, (6, 5), "x.png")
    np.testing.assert_array_equal(got, expected)
    if mode == "1":
        assert set(np.unique(got)) <= {0.0, 1.0}


@pytest.mark.parametrize("mode", ["RGBA", "LA", "PA"])
def test_an_opaque_alpha_channel_is_dropped(mode):
    rgb = np.random.default_rng(2).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    image = Image.fromarray(rgb).convert(mode)
    without_alpha = image.convert("RGB")
    np.testing.assert_array_equal(image_pixels(image, 3, (6, 5), "x.png"), np.asarray(without_alpha, np.float32) / 255)


def test_transparent_pixels_are_refused_naming_the_file_and_mode(tmp_path):
    rgba = np.full((6, 5, 4), 200, np.uint8)
    rgba[0, 0, 3] = 0
    Image.fromarray(rgba).save(tmp_path / "clear.png")
    refused(lambda: read_image(tmp_path / "clear.png", 3, (6, 5), WHERE),
            "--images photos: clear.png has transparent pixels (mode RGBA)", "flatten")
    palette = Image.fromarray(np.arange(30, dtype=np.uint8).reshape(6, 5)).convert("P")
    palette.info["transparency"] = int(np.asarray(palette)[2, 2])
    palette.save(tmp_path / "palette.png")
    with Image.open(tmp_path / "palette.png") as check:
        assert check.mode == "P" and "transparency" in check.info
    refused(lambda: read_image(tmp_path / "palette.png", 1, (6, 5), WHERE), "palette.png has transparent pixels (mode P)")
    grey = Image.fromarray(sixteen_bit())
    grey.info["transparency"] = 65535
    refused(lambda: image_pixels(grey, 1, (6, 5), "deep.png"), "deep.png has transparent pixels (mode I;16)")


def test_a_float_image_is_taken_as_it_is_only_within_0_and_1():
    inside = np.random.default_rng(3).random((6, 5), dtype=np.float32)
    assert Image.fromarray(inside).mode == "F"
    np.testing.assert_array_equal(image_pixels(Image.fromarray(inside), 1, (6, 5), "f.png")[:, :, 0], inside)
    refused(lambda: image_pixels(Image.fromarray(inside * 4), 1, (6, 5), "f.png"),
            "f.png is mode F (32-bit floats) with values from", "[0, 1]")
    inside[1, 1] = np.nan
    refused(lambda: image_pixels(Image.fromarray(inside), 1, (6, 5), "f.png"), "f.png is mode F", "NaN or infinite")


def test_a_mode_pillow_cannot_convert_is_refused():
    lab = Image.new("LAB", (5, 6))
    refused(lambda: image_pixels(lab, 1, (6, 5), "lab.png"), "lab.png is mode LAB, which Pillow cannot convert to L")


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b""), "--images photos: a.png is empty (0 bytes)"),
    (lambda p: p.write_text("not an image"), "--images photos: cannot read a.png as an image (Pillow does not recognise it)"),
    (lambda p: p.write_bytes(_png_bytes()[:60]), "--images photos: cannot read a.png as an image ("),
])
def test_a_file_that_is_not_a_whole_image_is_one_line(make, message, tmp_path):
    make(tmp_path / "a.png")
    refused(lambda: read_image(tmp_path / "a.png", 1, (6, 5), WHERE), message)


def _png_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (40, 40), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()
