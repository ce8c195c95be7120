import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def tiny_model_path(tmp_path):
    from onnx_builders import save, tiny_cnn

    return save(tiny_cnn(), tmp_path / "tiny.onnx")
