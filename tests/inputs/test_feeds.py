"""opplugin.inputs.feeds: the bundled test set, preprocessing, and the shipped models' accuracy."""
from __future__ import annotations

import gzip

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from opplugin.inputs import feeds
from opplugin.core.paths import models_dir

# Accuracy floors on the first 1,000 test images, a little under what
# tools/evaluate_models.py measured (see models/README.md).
MODEL_FLOORS = {"lenet86": 0.89, "ece408_high": 0.90, "mlp_onehidden": 0.88}


@pytest.fixture(scope="module")
def test_set():
    return feeds.load_test_set()


def _idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.tobytes()


# --- the bundled test set ------------------------------------------------------------

def test_load_test_set_shapes_and_dtypes(test_set):
    images, labels = test_set
    assert images.shape == (feeds.TEST_IMAGES, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (feeds.TEST_IMAGES,) and labels.dtype == np.int64
    assert labels.min() == 0 and labels.max() == 9
    assert np.bincount(labels).tolist() == [1000] * 10  # Fashion-MNIST's balanced test set
    assert images.max() == 255


# --- load_idx ------------------------------------------------------------------------

def test_load_idx_round_trip_plain_and_gzip(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "plain").write_bytes(_idx_bytes(array))
    (tmp_path / "packed.gz").write_bytes(gzip.compress(_idx_bytes(array)))
    np.testing.assert_array_equal(feeds.load_idx(tmp_path / "plain"), array)
    np.testing.assert_array_equal(feeds.load_idx(tmp_path / "packed.gz"), array)


def test_load_idx_big_endian_int32(tmp_path):
    array = np.array([1, -2, 70000], dtype=">i4")
    (tmp_path / "ints").write_bytes(_idx_bytes(array, 0x0C))
    assert feeds.load_idx(tmp_path / "ints").tolist() == [1, -2, 70000]


def test_load_idx_truncated_file(tmp_path):
    raw = _idx_bytes(np.zeros((10, 28, 28), dtype=np.uint8))
    path = tmp_path / "short-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(raw[:-100]))
    with pytest.raises(ValueError, match="truncated"):
        feeds.load_idx(path)


def test_load_idx_truncated_gzip_stream(tmp_path):
    packed = gzip.compress(_idx_bytes(np.arange(1000, dtype=np.uint8) % 7))
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ValueError, match="gzip"):
        feeds.load_idx(path)


@pytest.mark.parametrize("payload", [b"", b"\x00\x00", b"hello, world", b"\x00\x00\x08\x03\x00"])
def test_load_idx_garbage(tmp_path, payload):
    path = tmp_path / "garbage"
    path.write_bytes(payload)
    with pytest.raises(ValueError, match="IDX"):
        feeds.load_idx(path)


# --- resize_bilinear -----------------------------------------------------------------

@pytest.mark.parametrize("size", [(86, 86), (40, 13), (14, 14), (28, 100), (1, 1)])
def test_resize_matches_torch(size):
    torch = pytest.importorskip("torch")
    images = np.random.default_rng(1).random((6, 28, 28), dtype=np.float32)
    want = torch.nn.functional.interpolate(
        torch.from_numpy(images)[:, None], size=size, mode="bilinear", align_corners=False
    )[:, 0].numpy()
    got = feeds.resize_bilinear(images, *size)
    assert got.shape == (6, *size) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_resize_same_size_is_identity():
    images = np.random.default_rng(2).random((3, 28, 28), dtype=np.float32)
    np.testing.assert_array_equal(feeds.resize_bilinear(images, 28, 28), images)


def test_resize_keeps_constant_image_constant():
    images = np.full((2, 28, 28), 0.37, dtype=np.float32)
    np.testing.assert_allclose(feeds.resize_bilinear(images, 86, 86), 0.37, atol=1e-6)
    np.testing.assert_allclose(feeds.resize_bilinear(images, 9, 17), 0.37, atol=1e-6)


def test_resize_rejects_wrong_rank():
    with pytest.raises(ValueError, match=r"\[N,h,w\]"):
        feeds.resize_bilinear(np.zeros((28, 28), dtype=np.float32), 86, 86)


# --- to_model_input ------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 86, 86)])
def test_to_model_input(test_set, shape):
    x = feeds.to_model_input(test_set[0][:50], shape)
    assert x.shape == (50, *shape) and x.dtype == np.float32
    assert x.min() >= 0.0 and x.max() <= 1.0
    if shape == (1, 28, 28):  # no resize: exactly pixel / 255
        np.testing.assert_array_equal(x[:, 0], test_set[0][:50] / np.float32(255))


def test_to_model_input_rejects_colour():
    images = np.zeros((2, 28, 28), dtype=np.uint8)
    with pytest.raises(ValueError, match="1 channel"):
        feeds.to_model_input(images, (3, 28, 28))


# --- random_inputs -------------------------------------------------------------------

def test_random_inputs_reproducible_and_nonzero():
    a = feeds.random_inputs(4, (1, 28, 28), seed=7)
    b = feeds.random_inputs(4, (1, 28, 28), seed=7)
    c = feeds.random_inputs(4, (1, 28, 28), seed=8)
    assert a.shape == (4, 1, 28, 28) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.all(a > 0.0) and np.all(a < 1.0)


def test_random_inputs_of_any_batch_share_their_first_images():
    small = feeds.random_inputs(3, (1, 86, 86), seed=4)
    large = feeds.random_inputs(400, (1, 86, 86), seed=4)  # several blocks, filled by several threads
    np.testing.assert_array_equal(large[:3], small)
    assert np.all(large > 0.0) and np.all(large < 1.0)
    assert len(np.unique(large[:, 0, 0, 0])) == 400


def test_random_inputs_fill_a_given_array():
    out = np.empty((5, 2, 3), np.float32)
    assert feeds.random_inputs(5, (2, 3), seed=1, out=out) is out
    np.testing.assert_array_equal(out, feeds.random_inputs(5, (2, 3), seed=1))
    with pytest.raises(ValueError, match="out must be"):
        feeds.random_inputs(5, (2, 3), out=np.empty((5, 2, 3), np.float64))


def test_make_inputs_random_for_a_batch_beyond_the_test_set():
    from opplugin.inputs.feeds import make_inputs
    from opplugin.graph.model import load_model

    inputs = make_inputs(load_model("ece408_high"), 12000, "random", seed=3)
    assert inputs.feeds["input"].shape == (12000, 1, 28, 28) and inputs.labels is None
    assert not inputs.pinned


# --- the shipped models --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MODEL_FLOORS))
def test_shipped_model_accuracy(test_set, name):
    path = models_dir() / f"{name}.onnx"
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["probabilities"]
    assert not any(n.op_type == "Constant" for n in model.graph.node)
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:])

    images, labels = test_set[0][:1000], test_set[1][:1000]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    probs = sess.run(None, {"input": feeds.to_model_input(images, shape)})[0]
    assert probs.shape == (1000, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert (probs.argmax(axis=1) == labels).mean() >= MODEL_FLOORS[name]


def test_random_inputs_take_any_integer_seed():
    negative = feeds.random_inputs(3, (2, 5), seed=-1)
    np.testing.assert_array_equal(negative, feeds.random_inputs(3, (2, 5), seed=-1))
    np.testing.assert_array_equal(negative, feeds.random_inputs(3, (2, 5), seed=2**64 - 1))  # its two's complement
    assert not np.array_equal(negative, feeds.random_inputs(3, (2, 5), seed=1))
    assert np.all(negative > 0.0) and np.all(negative < 1.0)
