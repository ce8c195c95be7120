"""opplugin: run ONNX models with some nodes swapped for custom CUDA kernels."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("opplugin")
except PackageNotFoundError:  # a plain checkout on PYTHONPATH
    __version__ = "0.1.0+checkout"
