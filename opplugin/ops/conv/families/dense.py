"""Dense Convs run on the Gemm kernels: a Conv whose filter covers its whole input map (no
pads, one group) computes one output pixel per map from every input value of its image, so
it is a dense layer over the images, Y[N, M] = X[N, C*KH*KW] W[M, C*KH*KW]^T + B. The
squeeze and excite Convs of squeeze-and-excitation blocks (1x1 filters on 1x1 maps) are
such layers: a few thousand multiply-adds per image, which the Conv families spread over
too few threads while the Gemm families read each weight once with every lane busy.

X in NCHW is already the N x K matrix (an image's channels, rows and columns are the
filter's order) and Y's N x M x 1 x 1 is the N x M one, so the kernels read and write the
Conv's own tensors. Each FP32-FMA Gemm family (ops/gemm/families.py: `gemv` for batch 1-16, `tiled`,
`rowwarp` for narrow outputs) is a Conv family here, its name prefixed with `dense_` and its
configuration spelled as the Gemm's ("dense_gemv_w1x1_k4"); the fused activation runs on
the Gemm epilogue. A residual Add or a max pool has no place there, so such a step goes to
the direct families.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ...gemm import families as gemm
from ...gemm.epilogue import GemmEpilogue
from ...gemm.kernel import padded_weights
from ...gemm.spec import BIAS_COLUMN, BIAS_NONE, GemmSpec
from ..epilogue import NONE, Epilogue
from ..spec import ConvSpec
from .base import CompileUnit, ConvKernel, Family

PREFIX = "dense_"
GEMV_SPLITS = (1, 2, 4, 8, 16)  # warps per output: what tuning tries beside the heuristic's
ROWWARP_ROWS = (1, 2, 4, 8)


def is_dense(spec: ConvSpec) -> bool:
    """Whether the filter covers the whole input map with no pads: one output pixel per map,
    computed from every input value of the image (the stride and dilation then do nothing)."""
    return tuple(spec.kernel) == tuple(spec.in_size) and not any(spec.pads)


def gemm_spec(spec: ConvSpec) -> GemmSpec:
    """The dense layer a dense Conv is, with W as its N x K weight rows (transB)."""
    k = spec.in_channels * math.prod(spec.kernel)
    bias, shape = (BIAS_COLUMN, (spec.out_channels,)) if spec.has_bias else (BIAS_NONE, ())
    return GemmSpec(m=spec.batch, n=spec.out_channels, k=k, trans_b=True, bias=bias, bias_shape=shape)


def gemm_config(config: gemm.GemmConfig) -> gemm.GemmConfig:
    """The Gemm family's configuration of a dense Conv configuration (the same fields)."""
    return dataclasses.replace(config, family=config.family.removeprefix(PREFIX))


def gemm_epilogue(epilogue: Epilogue) -> GemmEpilogue:
    return GemmEpilogue(epilogue.activation)


def dense_family(spec: ConvSpec, epilogue: Epilogue = NONE) -> str:
    """The dense family the Gemm heuristic gives this Conv's layer (batch 1-16: gemv), but gemv
    where that family's grid is short of a block per SM: tiled and rowwarp walk all of K in each
    block, while gemv spreads it over warps. Graphed on an H200 at batch 32, the SE squeeze
    1152->48 ran 40 µs on tiled (2 blocks) and 2.7 on gemv, 480->20 9.7 on rowwarp and 1.9 on
    gemv; where tiled had 36 blocks and K = 48 (the excite 48->1152) it ran 3.4 and gemv 3.8."""
    layer = gemm_spec(spec)
    config = gemm.heuristic_config(layer, gemm_epilogue(epilogue), tensor_cores=False)
    if math.prod(config.grid(layer, layer.m)) < gemm.SMS:
        config = gemm.gemv_default(layer)
    return PREFIX + config.family


class DenseGemm(Family):
    """One Gemm family run as a Conv family (see the module's docstring)."""

    fuses = True  # the activation, on the Gemm epilogue; `reason` turns a residual Add or a pool away

    def __init__(self, family: str, summary: str):
        self.gemm_family = family
        self.name = PREFIX + family
        self.summary = f"a Conv whose filter covers its whole input map, as a dense layer on Gemm's {family}: {summary}"
        self.config_type = gemm.CONFIGS[family]

    def _named(self, config: gemm.GemmConfig) -> gemm.GemmConfig:
        return dataclasses.replace(config, family=self.name)

    def configs(self, spec, epilogue=NONE):
        if not is_dense(spec):
            return []
        layer = gemm_spec(spec)
        default = gemm.DEFAULTS[self.gemm_family](layer)
        if isinstance(default, gemm.GemvConfig):
            others = [dataclasses.replace(default, splits=s) for s in GEMV_SPLITS]
        elif isinstance(default, gemm.RowwarpConfig):
            others = [dataclasses.replace(default, rows=r) for r in ROWWARP_ROWS]
        else:
            others = list(gemm.TILES)
        return [self._named(c) for c in dict.fromkeys([default, *others])]

    def unconfigured_reason(self, spec, epilogue):
        return self._shape_reason(spec) or super().unconfigured_reason(spec, epilogue)

    @staticmethod
    def _shape_reason(spec: ConvSpec) -> str | None:
        if not is_dense(spec):
            return f"the filter {spec.kernel} (pads {list(spec.pads)}) does not cover the whole {spec.in_size} input map: not a dense layer"
        if spec.group != 1:
            return f"a grouped Conv (group={spec.group}) is a block-diagonal layer, not one dense layer"
        return None

    def reason(self, spec, config, epilogue):
        shape = self._shape_reason(spec)
        if shape:
            return shape
        if epilogue.residual or epilogue.pool:
            return f"{self.name} fuses the bias and an activation (the Gemm epilogue), not {epilogue.suffix.lstrip('+')}"
        if config.family != self.name:
            return f"{config} is no {self.name} configuration"
        return gemm.unsupported_reason(gemm_spec(spec), gemm_config(config), gemm_epilogue(epilogue))

    def compile_units(self, spec, config, epilogue=NONE):
        defines = gemm.defines(gemm_spec(spec), gemm_config(config), gemm_epilogue(epilogue))
        return [CompileUnit(config.source, f"gemm_{self.gemm_family}", defines)]

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return DenseConvKernel(spec, config, function, weights, epilogue)


class DenseConvKernel(ConvKernel):
    """The Gemm kernel on the Conv's X (N x K) into its Y (N x M): with constant weights, W's
    padded rows are made once, at build; weights given at run time are padded on each call."""

    def __init__(self, spec: ConvSpec, config: gemm.GemmConfig, function: Any, weights, epilogue: Epilogue = NONE):
        import cupy

        # 16-byte rows of X let the kernels load float4s (kernels/gemm_epilogue.cuh, load_a4)
        super().__init__(spec, config, [function], epilogue, alignment=16)
        self._function = function
        self._layer = gemm_spec(spec)
        self._gemm = gemm_config(config)
        self.reads_weights = weights is None
        if weights is not None:
            w, b = weights
            self._constant_args = (self._padded(cupy, cupy.asarray(w, dtype=cupy.float32)),
                                   np.uint64(0) if b is None else cupy.asarray(b, dtype=cupy.float32))
        self._block = (self._gemm.threads, 1, 1)
        self._grids: dict[int, tuple[int, int, int]] = {}

    def _padded(self, cupy: Any, w: Any) -> Any:
        return padded_weights(cupy, w.reshape(self._layer.n, self._layer.k), self._layer, self._gemm)

    def _launch(self, x, weights, y, batch):
        import cupy

        w, b = (self._padded(cupy, weights[0]), weights[1]) if self.reads_weights else self._constant_args
        step = self._gemm.max_batch()  # a grid's y extent is limited: large batches go in slices
        for start in range(0, batch, step):
            rows = min(step, batch - start)
            grid = self._grids.get(rows) or self._grids.setdefault(rows, self._gemm.grid(self._layer, rows))
            self._function(grid, self._block, (x[start:start + rows], w, b, y[start:start + rows], np.int32(rows)))


# the FP32-FMA families: a dense Conv is a CNN's small last layers, where the tensor cores' tiles
# would leave most SMs idle
FAMILIES: list[Family] = [DenseGemm(name, gemm.FAMILIES[name]) for name in gemm.SIMT_FAMILIES]
