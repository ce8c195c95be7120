"""ONNX Conv: its semantics (spec), numpy reference and fused epilogue, the plugin,
the CUDA families (families/) and the choice among them (choice)."""
from .plugin import ConvPlugin
from .spec import ConvSpec

__all__ = ["ConvPlugin", "ConvSpec"]
