"""Reductions and the normalisations built on them, over any run of axes but the batch:
ReduceSum, ReduceMean, ReduceMax, Softmax, LogSoftmax, LayerNormalization,
GroupNormalization and InstanceNormalization (spec, numpy reference, plugins, and
kernels/reduce.cu), and the rewrite of a decomposed LayerNorm into one node."""
from .plugin import (GroupNormalizationPlugin, InstanceNormalizationPlugin, LayerNormalizationPlugin, LogSoftmaxPlugin,
                     ReduceMaxPlugin, ReduceMeanPlugin, ReduceSumPlugin, SoftmaxPlugin)

__all__ = ["GroupNormalizationPlugin", "InstanceNormalizationPlugin", "LayerNormalizationPlugin", "LogSoftmaxPlugin",
           "ReduceMaxPlugin", "ReduceMeanPlugin", "ReduceSumPlugin", "SoftmaxPlugin"]
