"""ONNX 2-D pooling (MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool, and ReduceMean over H and W): the shape record
(spec), the numpy reference, the plugins and the CUDA kernels of kernels/pool.cu."""
from .plugin import AveragePoolPlugin, GlobalAveragePoolPlugin, GlobalMaxPoolPlugin, MaxPoolPlugin
from .spec import PoolSpec

__all__ = ["AveragePoolPlugin", "GlobalAveragePoolPlugin", "GlobalMaxPoolPlugin", "MaxPoolPlugin", "PoolSpec"]
