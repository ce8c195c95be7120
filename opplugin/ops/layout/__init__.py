"""Layout ops on the device: Concat (its producers may write into its slices: runtime/buffers.py),
Transpose, Slice, Split, Pad and Resize. The views (Reshape, Flatten, Squeeze, Unsqueeze) are in ops/view.py."""
from .plugin import ConcatPlugin, PadPlugin, ResizePlugin, SlicePlugin, SplitPlugin, TransposePlugin

__all__ = ["ConcatPlugin", "PadPlugin", "ResizePlugin", "SlicePlugin", "SplitPlugin", "TransposePlugin"]
