"""Layout ops on the device: Concat (its producers may write into its slices: runtime/buffers.py),
Transpose, Slice, Split, Gather by constant indices, Pad and Resize. The views (Reshape, Flatten, Squeeze,
Unsqueeze) are in ops/view.py."""
from .plugin import ConcatPlugin, GatherPlugin, PadPlugin, ResizePlugin, SlicePlugin, SplitPlugin, TransposePlugin

__all__ = ["ConcatPlugin", "GatherPlugin", "PadPlugin", "ResizePlugin", "SlicePlugin", "SplitPlugin", "TransposePlugin"]
