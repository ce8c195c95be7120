"""Elementwise ops as plugin steps: Add, Sum of two and Mul (same shape, or a per-channel or scalar
constant), and the activations of ops/activation.py's table, a binary op fusing the activation after it."""
from .plugin import (AddPlugin, ClipPlugin, HardSigmoidPlugin, HardSwishPlugin, LeakyReluPlugin, MulPlugin, ReluPlugin, SigmoidPlugin,
                     SumPlugin, TanhPlugin)
from .spec import ElementwiseSpec

OPS = ("Add", "Sum", "Mul", "Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish")

__all__ = ["OPS", "AddPlugin", "ClipPlugin", "ElementwiseSpec", "HardSigmoidPlugin", "HardSwishPlugin", "LeakyReluPlugin", "MulPlugin",
           "ReluPlugin", "SigmoidPlugin", "SumPlugin", "TanhPlugin"]
