"""The example plugin of the README: ONNX Relu as a plugin step.

np.maximum works on numpy arrays and, through NumPy's ufunc protocol, on CuPy
arrays too, so the same kernel serves the CPU and the CUDA device.
"""
import numpy as np

from opplugin.registry import Kernel, Plugin


class ReluKernel(Kernel):
    name = "relu.example"

    def __init__(self, shape):
        self.elements_per_sample = int(np.prod(shape[1:]))

    def flops(self, batch):
        return batch * self.elements_per_sample

    def bytes_moved(self, batch):
        return 2 * 4 * batch * self.elements_per_sample

    def __call__(self, inputs, stream=None):
        return [np.maximum(inputs[0], 0)]


class ReluPlugin(Plugin):
    op_type = "Relu"

    def supports(self, node, device):
        if node.inputs[0].dtype != np.float32:
            return "only float32"
        return None

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        return ReluKernel(node.inputs[0].shape)
