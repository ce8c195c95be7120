"""Fixtures the graph tests share."""
import pytest

from opplugin.ort.sessions import Reference
from opplugin.verify import references as references_module


@pytest.fixture
def references(monkeypatch):
    """The models check's onnxruntime reference sessions are built from, in order."""
    built = []

    class Recording(Reference):
        def __init__(self, model_proto, extra_outputs=(), **options):
            built.append(model_proto)
            super().__init__(model_proto, extra_outputs, **options)

    monkeypatch.setattr(references_module, "Reference", Recording)
    return built
