"""A GELU written out as its arithmetic folded into one Gelu node (graph/passes/gelu.py). The ConvNeXt
block's GELU, in each form exporters write, is folded and checked in test_layout_sink.py."""
import numpy as np
import onnx

from channel_last_models import convnext_block, ops, outputs_of
from opplugin.graph.simplify import simplify
from reduction_cases import fresh


def test_a_gelu_with_other_constants_is_not_folded():
    model = convnext_block()
    for tensor in model.graph.initializer:
        if tensor.name == "half":
            tensor.CopyFrom(onnx.numpy_helper.from_array(np.array(0.6, np.float32), "half"))
    simplified, done = simplify(model)
    assert "Gelu" not in ops(simplified) and ops(simplified)["Erf"] == 1
    x = fresh((2, 8, 7, 7), 3)
    np.testing.assert_allclose(outputs_of(simplified, x)["y"], outputs_of(model, x)["y"], rtol=1e-4, atol=1e-5)
