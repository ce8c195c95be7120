"""A per-channel Mul or Add after a Conv folded into its weights (graph/passes/conv_affine.py). The
ConvNeXt block's layer scale folding, compared with onnxruntime, is in test_layout_sink.py."""
import onnx

from channel_last_models import convnext_block, ops
from opplugin.graph.simplify import simplify


def test_a_conv_output_read_twice_keeps_its_mul():
    model = convnext_block()
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info("to_first"))
    simplified, _ = simplify(model)
    assert ops(simplified)["Mul"] == 1 and any(n.output[0] == "to_first" for n in simplified.graph.node if n.op_type == "Conv")
