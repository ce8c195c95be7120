"""Reductions and the normalisations built on them, over any run of axes but the batch:
ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare,
ReduceLogSum, Softmax, LogSoftmax, LayerNormalization, GroupNormalization and
InstanceNormalization (spec, numpy reference, plugins, and kernels/reduce.cu), and the rewrite
of a decomposed LayerNorm into one node."""
from .plugin import (GroupNormalizationPlugin, InstanceNormalizationPlugin, LayerNormalizationPlugin, LogSoftmaxPlugin,
                     ReduceL1Plugin, ReduceL2Plugin, ReduceLogSumPlugin, ReduceMaxPlugin, ReduceMeanPlugin, ReduceMinPlugin,
                     ReduceProdPlugin, ReduceSumPlugin, ReduceSumSquarePlugin, SoftmaxPlugin)

__all__ = ["GroupNormalizationPlugin", "InstanceNormalizationPlugin", "LayerNormalizationPlugin", "LogSoftmaxPlugin",
           "ReduceL1Plugin", "ReduceL2Plugin", "ReduceLogSumPlugin", "ReduceMaxPlugin", "ReduceMeanPlugin", "ReduceMinPlugin",
           "ReduceProdPlugin", "ReduceSumPlugin", "ReduceSumSquarePlugin", "SoftmaxPlugin"]
