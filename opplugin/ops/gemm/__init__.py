"""ONNX Gemm (and MatMul of any rank, matmul.py): its semantics (spec), numpy reference and fused
epilogue, the plugin, and the CUDA families (kernels/gemm_*.cu) with the choice among them."""
from .plugin import GemmPlugin, MatMulPlugin
from .spec import GemmSpec

__all__ = ["GemmPlugin", "GemmSpec", "MatMulPlugin"]
