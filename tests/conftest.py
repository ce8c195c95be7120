import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip, with the reason, where CuPy sees no CUDA device."""
    from opplugin import cuda

    if cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (CuPy missing or no GPU visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny_model_path(tmp_path):
    from onnx_builders import save, tiny_cnn

    return save(tiny_cnn(), tmp_path / "tiny.onnx")
