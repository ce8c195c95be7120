"""A user's own data: --load-inputs, --images (with --resize, --mean, --std), --save-outputs
with --keep, and the one-line errors of each; a saved output feeds a second model."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import finish, save

from opplugin.cli import main


def one_line_error(capsys, message: str) -> None:
    out, err = capsys.readouterr()
    err = err.strip()
    assert err.startswith("opplugin: error:") and message in err and "\n" not in err and "Traceback" not in err, err


def conv_relu(name: str, input_name: str, output_name: str, channels: int, maps: int, seed: int) -> onnx.ModelProto:
    """Conv 3x3 (pads 1) > Relu, [N, channels, 6, 6] -> [N, maps, 6, 6]."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((maps, channels, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", [input_name, "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], [output_name], name="relu")]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["N", channels, 6, 6])],
                              [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["N", maps, 6, 6])], initializer=[w])
    return finish(graph)


def onnxruntime_outputs(path: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_saved_outputs_of_one_model_feed_a_second(tmp_path, capsys):
    first = save(conv_relu("first", "x", "features", 3, 4, seed=1), tmp_path / "first.onnx")
    second = save(conv_relu("second", "features", "y", 4, 2, seed=2), tmp_path / "second.onnx")
    x = np.random.default_rng(0).random((5, 3, 6, 6), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    saved, final = tmp_path / "features.npz", tmp_path / "y.npz"
    assert main(["run", first, "--device", "cpu", "--load-inputs", str(tmp_path / "x.npy"), "--save-outputs", str(saved),
                 "--keep", "x"]) == 0
    out = capsys.readouterr().out
    assert "batch 5" in out and "PASS" in out
    with np.load(saved) as arrays:
        assert sorted(arrays.files) == ["features", "x"]
        features = arrays["features"]
        expected = onnxruntime_outputs(first, {"x": x})["features"]
        np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(arrays["x"], x)
    assert main(["check", second, "--device", "cpu", "--load-inputs", str(saved), "--save-outputs", str(final)]) == 2
    one_line_error(capsys, "holds 'x', which second does not take")
    np.savez(saved, features=features)  # the kept input out: a file for the second model alone
    assert main(["check", second, "--device", "cpu", "--load-inputs", str(saved), "--save-outputs", str(final)]) == 0
    assert "PASS" in capsys.readouterr().out
    with np.load(final) as arrays:
        np.testing.assert_allclose(arrays["y"], onnxruntime_outputs(second, {"features": features})["y"], rtol=1e-5, atol=1e-5)


def test_check_saves_outputs_of_a_batch_compared_in_passes(tmp_path, tiny_model_path, capsys):
    x = np.random.default_rng(3).random((7, 3, 12, 12), dtype=np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    saved = tmp_path / "out.npz"
    assert main(["check", tiny_model_path, "--device", "cpu", "--load-inputs", str(tmp_path / "in.npz"), "--check-chunk", "3",
                 "--save-outputs", str(saved), "--keep", "p1"]) == 0
    assert "3 passes" in capsys.readouterr().out
    expected = onnxruntime_outputs(tiny_model_path, {"x": x})["y"]
    with np.load(saved) as arrays:
        assert arrays["y"].shape == (7, 5) and arrays["p1"].shape == (7, 4, 6, 6)
        np.testing.assert_allclose(arrays["y"], expected, rtol=1e-5, atol=1e-6)


def savez_as(path, **arrays) -> None:
    """A .npz file under any name (numpy.savez appends .npz to a name without it)."""
    with open(path, "wb") as stream:
        np.savez(stream, **arrays)


def non_array_member(path) -> None:
    """A zip whose member is named after the input but holds bytes, not a .npy array."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x", b"not an array")


@pytest.mark.parametrize("make, message", [
    (lambda d: np.save(d / "f.npy", np.ones((2, 3, 12, 12), np.float64)), "'x' is float64; tiny takes float32"),
    (lambda d: np.save(d / "f.npy", np.ones((2, 3, 11, 12), np.float32)), "'x' has shape 2x3x11x12; tiny takes Nx3x12x12"),
    (lambda d: savez_as(d / "f.npy", y=np.ones((2, 3, 12, 12), np.float32)), "holds 'y', which tiny does not take; its inputs are x"),
    (lambda d: savez_as(d / "f.npy"), "has no array for 'x'"),
    (lambda d: (d / "f.npy").write_bytes(b"PK\x03\x04 not really a zip"), "FILE: a damaged .npz file, not a complete zip archive"),
    (lambda d: (d / "f.npy").write_text("hello"), "FILE: not a .npy or .npz file"),
    (lambda d: (d / "f.npy").write_bytes(b""), "FILE: the file is empty (0 bytes)"),
    (lambda d: savez_as(d / "f.npy", x=np.array([{"a": 1}], dtype=object)), "FILE: member 'x.npy' holds Python objects"),
    (lambda d: np.save(d / "f.npy", np.array([None], dtype=object), allow_pickle=True), "FILE: a .npy file holds Python objects"),
    (lambda d: non_array_member(d / "f.npy"), "FILE: its member 'x' is not a .npy array"),
    (lambda d: np.save(d / "f.npy", np.ones((0, 3, 12, 12), np.float32)), "holds no samples"),
    (lambda d: None, "--load-inputs FILE: no such file"),
])
def test_a_bad_inputs_file_is_one_line(make, message, tmp_path, tiny_model_path, capsys):
    make(tmp_path)
    message = message.replace("FILE", str(tmp_path / "f.npy"))
    for command in ("run", "check"):
        before = sorted(p.name for p in tmp_path.iterdir())
        assert main([command, tiny_model_path, "--device", "cpu", "--load-inputs", str(tmp_path / "f.npy"),
                     "--save-outputs", str(tmp_path / "out.npz")]) == 2
        one_line_error(capsys, message)
        assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("command", ["run", "check"])
def test_keep_of_a_tensor_a_fusion_would_hide_gives_that_fusion_up(tmp_path, capsys, command):
    proto = conv_relu("first", "x", "features", 3, 4, seed=1)
    first = save(proto, tmp_path / "first.onnx")
    x = np.random.default_rng(2).standard_normal((3, 3, 6, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    saved = tmp_path / "o.npz"
    assert main([command, first, "--device", "cpu", "--load-inputs", str(tmp_path / "x.npy"), "--save-outputs", str(saved),
                 "--keep", "c"]) == 0
    assert "PASS" in capsys.readouterr().out
    proto.graph.output.append(onnx.ValueInfoProto(name="c"))  # onnxruntime's value of the Conv's output, for comparison
    expected = onnxruntime_outputs(save(proto, tmp_path / "with_c.onnx"), {"x": x})
    with np.load(saved) as arrays:
        assert sorted(arrays.files) == ["c", "features"]
        np.testing.assert_allclose(arrays["c"], expected["c"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(arrays["features"], expected["features"], rtol=1e-5, atol=1e-5)


def test_keep_naming_no_tensor_is_one_line_before_any_work(tmp_path, capsys):
    first = save(conv_relu("first", "x", "features", 3, 4, seed=1), tmp_path / "first.onnx")
    assert main(["run", first, "--device", "cpu", "--batch", "2", "--save-outputs", str(tmp_path / "o.npz"), "--keep", "w"]) == 2
    one_line_error(capsys, "--keep w: it is a weight of first (a constant), not computed by a run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.onnx"]


def test_a_batch_other_than_the_files_is_one_line(tmp_path, tiny_model_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((4, 3, 12, 12), np.float32))
    assert main(["run", tiny_model_path, "--device", "cpu", "--load-inputs", str(tmp_path / "x.npy"), "--batch", "3"]) == 2
    one_line_error(capsys, "--batch 3: the inputs given hold a batch of 4")


def test_a_npy_file_for_a_model_of_two_inputs_is_one_line(tmp_path, capsys):
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "two",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    path = save(finish(graph), tmp_path / "two.onnx")
    np.save(tmp_path / "a.npy", np.ones((2, 4), np.float32))
    assert main(["run", path, "--device", "cpu", "--load-inputs", str(tmp_path / "a.npy")]) == 2
    one_line_error(capsys, "a .npy file holds one array, and two has 2 inputs (a, b)")
    np.savez(tmp_path / "ab.npz", a=np.ones((2, 4), np.float32), b=np.ones((3, 4), np.float32))
    assert main(["run", path, "--device", "cpu", "--load-inputs", str(tmp_path / "ab.npz")]) == 2
    one_line_error(capsys, "the inputs have different batches [2, 3]")


@pytest.mark.parametrize("argv, message", [
    (["--load-inputs", "a.npz", "--images", "."], "--load-inputs and --images both say where the inputs come from"),
    (["--images", ".", "--data", "random"], "--images and --data random both say"),
    (["--resize", "4,4"], "--resize apply to --images FOLDER"),
    (["--keep", "c1"], "--keep names tensors for --save-outputs FILE.npz"),
    (["--images", ".", "--resize", "4"], "--resize takes H,W"),
])
def test_data_flags_that_do_not_go_together_are_refused_first(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "lenet86", "--device", "cpu", *argv]) == 2
    one_line_error(capsys, message)


# --- images -------------------------------------------------------------------------------


def write_images(folder, count: int, size=(10, 14), mode="RGB") -> list[np.ndarray]:
    image_module = pytest.importorskip("PIL.Image")
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(7)
    pixels = []
    for index in range(count):
        array = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        suffix = ".png" if index % 2 == 0 else ".PNG"
        image_module.fromarray(array).convert(mode).save(folder / f"img{index}{suffix}")
        pixels.append(np.asarray(image_module.fromarray(array).convert(mode)))
    (folder / "notes.txt").write_text("not an image")
    return pixels


def transparent_corner(path) -> None:
    from PIL import Image

    with Image.open(path) as image:
        image.load()
    image.putpixel((0, 0), (0, 0, 0, 0))
    image.save(path)


def test_images_feed_a_model_in_name_order_with_mean_and_std(tmp_path, tiny_model_path, capsys):
    pixels = write_images(tmp_path / "images", 3, size=(12, 12))
    saved = tmp_path / "out.npz"
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    assert main(["run", tiny_model_path, "--device", "cpu", "--images", str(tmp_path / "images"),
                 "--mean", ",".join(map(str, mean)), "--std", ",".join(map(str, std)),
                 "--save-outputs", str(saved), "--keep", "x"]) == 0
    out = capsys.readouterr().out
    assert "batch 3" in out and "PASS" in out
    expected = np.stack([(p.astype(np.float32) / 255 - np.float32(mean)) / np.float32(std) for p in pixels]).transpose(0, 3, 1, 2)
    with np.load(saved) as arrays:
        np.testing.assert_allclose(arrays["x"], expected, rtol=1e-6, atol=1e-6)


def test_16_bit_images_feed_pixel_over_65535_not_clipped(tmp_path, tiny_model_path, capsys):
    image_module = pytest.importorskip("PIL.Image")
    (tmp_path / "deep").mkdir()
    rng = np.random.default_rng(11)
    pixels = [rng.integers(0, 65536, (12, 12), dtype=np.uint16) for _ in range(2)]
    for index, values in enumerate(pixels):
        image = image_module.fromarray(values)
        assert image.mode == "I;16"
        image.save(tmp_path / "deep" / f"d{index}.png")
    saved = tmp_path / "out.npz"
    assert main(["run", tiny_model_path, "--device", "cpu", "--images", str(tmp_path / "deep"),
                 "--save-outputs", str(saved), "--keep", "x"]) == 0
    assert "batch 2" in capsys.readouterr().out
    grey = np.stack([values.astype(np.float32) / np.float32(65535) for values in pixels])
    with np.load(saved) as arrays:
        fed = arrays["x"]
    assert fed.shape == (2, 3, 12, 12)
    for channel in range(3):  # greyscale repeated into the model's three channels
        np.testing.assert_array_equal(fed[:, channel], grey)
    assert np.mean(fed == 1.0) < 0.01  # clipped to 8 bits, nearly all of them were 1.0


def test_images_are_resized_and_fix_a_free_size(tmp_path, capsys):
    write_images(tmp_path / "images", 2, size=(10, 14), mode="L")
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "grey",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "OH", "OW"])], initializer=[w])
    path = save(finish(graph), tmp_path / "grey.onnx")
    images = str(tmp_path / "images")
    assert main(["run", path, "--device", "cpu", "--images", images]) == 2
    one_line_error(capsys, "give the size with --resize H,W")
    saved = tmp_path / "y.npz"
    assert main(["run", path, "--device", "cpu", "--images", images, "--resize", "8,9", "--save-outputs", str(saved)]) == 0
    with np.load(saved) as arrays:
        assert arrays["y"].shape == (2, 2, 6, 7)


@pytest.mark.parametrize("prepare, argv, message", [
    (lambda d: None, ["--images", "{d}/missing"], "missing: no such folder"),
    (lambda d: (d / "empty").mkdir(), ["--images", "{d}/empty"], "no PNG or JPEG files there"),
    (lambda d: write_images(d / "i", 1), ["--images", "{d}/i", "--resize", "9,9"], "--resize 9,9: tiny's input 'x' is Nx3x12x12"),
    (lambda d: write_images(d / "i", 1), ["--images", "{d}/i", "--mean", "0.1,0.2"], "--mean gives 2 values; the images have 3 channels"),
    (lambda d: write_images(d / "i", 1), ["--images", "{d}/i", "--std", "0"], "--std values must be finite and above 0"),
    (lambda d: write_images(d / "i", 1), ["--images", "{d}/i", "--std", "1e-50"],
     "--std values must be float32 numbers of at least 1.18e-38 (the images are float32); got 1e-50"),
    (lambda d: write_images(d / "i", 1), ["--images", "{d}/i", "--mean", "1e39"],
     "--mean values must be float32 numbers (the images are float32); got 1e39"),
    (lambda d: write_images(d / "i", 1), ["--images", "{d}/i", "--mean=-3e38", "--std", "1e-3"],
     "--mean -3e38 / --std 1e-3: they make some image values overflow float32"),
    (lambda d: write_images(d / "i", 1) and (d / "i" / "bad.jpg").write_text("no"), ["--images", "{d}/i"], "cannot read bad.jpg as an image"),
    (lambda d: write_images(d / "i", 1) and (d / "i" / "void.png").write_bytes(b""), ["--images", "{d}/i"], "i: void.png is empty (0 bytes)"),
    (lambda d: write_images(d / "i", 1, mode="RGBA") and transparent_corner(d / "i" / "img0.png"), ["--images", "{d}/i"],
     "i: img0.png has transparent pixels (mode RGBA)"),
])
def test_bad_image_requests_are_one_line(prepare, argv, message, tmp_path, tiny_model_path, capsys):
    prepare(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert main(["run", tiny_model_path, "--device", "cpu", *argv, "--save-outputs", str(tmp_path / "o.npz")]) == 2
    one_line_error(capsys, message)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_images_without_pillow_say_how_to_install_it(tmp_path, tiny_model_path, monkeypatch, capsys):
    import builtins

    (tmp_path / "i").mkdir()
    real_import = builtins.__import__

    def no_pillow(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pillow)
    assert main(["run", tiny_model_path, "--device", "cpu", "--images", str(tmp_path / "i")]) == 2
    one_line_error(capsys, "--images needs Pillow, which is not installed: pip install 'opplugin[images]'")


def test_image_models_need_one_image_input(tmp_path, capsys):
    write_images(tmp_path / "i", 1)
    graph = helper.make_graph([helper.make_node("Relu", ["v"], ["y"], name="relu")], "vector",
                              [helper.make_tensor_value_info("v", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    path = save(finish(graph), tmp_path / "vector.onnx")
    assert main(["run", path, "--device", "cpu", "--images", str(tmp_path / "i")]) == 2
    one_line_error(capsys, "images feed a model with one image input [N, C, H, W]; vector takes v Nx8")



def test_a_folder_that_cannot_be_listed_is_one_line(tmp_path, tiny_model_path, monkeypatch, capsys):
    from pathlib import Path

    (tmp_path / "locked").mkdir()
    real_iterdir = Path.iterdir

    def refusing(self):  # what listing a folder without read permission does
        if self.name == "locked":
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", refusing)
    assert main(["run", tiny_model_path, "--device", "cpu", "--images", str(tmp_path / "locked")]) == 2
    one_line_error(capsys, "cannot list it (Permission denied)")
