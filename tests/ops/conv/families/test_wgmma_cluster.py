"""conv_wgmma's K split over up to eight blocks is finished by the thread-block cluster of a tile's blocks (CLUSTER_REDUCE),
with no reduce kernel. GPU: it writes, bit for bit, what the same configuration writes through conv_k_slices_reduce,
for every wg family, a linked Y and a grouped Conv on a narrow map tile; and that output is the Conv."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from family_gpu_checks import draw
from onnx_builders import conv_spec as conv

from opplugin.ops.conv import families, reference
from opplugin.ops.conv.epilogue import Epilogue
from opplugin.ops.conv.families import pipelined, wgmma
from opplugin.ops.conv.families.channel_last import OUTPUT

ADD_RELU = Epilogue("Relu", residual=True)
DEEP = conv(2, 512, 128, (9, 9), (3, 3), pads=(1, 1, 1, 1))  # K 4608: 72 half slices; 162 pixels, a short last tile
GROUPED = conv(2, 256, 128, (9, 9), (3, 3), pads=(1, 1, 1, 1), group=4)  # 32 maps a group: a narrow tile, 9 slices
SHAPES = {"DEEP": DEEP, "GROUPED": GROUPED}
CASES = [("wg_3xtf32", "DEEP", 0), ("wg_fp16", "DEEP", 0), ("wg_fp16", "DEEP", OUTPUT), ("wg_bf16", "DEEP", OUTPUT),
         ("wg_fp16", "GROUPED", OUTPUT), ("wg_bf16", "GROUPED", 0)]
BOUND = {"wg_3xtf32": 1e-5, "wg_fp16": 1e-2, "wg_bf16": 5e-2}  # relative L2 against float64, as test_wgmma_tiles'


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [2, 5, 8])
@pytest.mark.parametrize(("name", "spec_name", "links"), CASES)
def test_a_k_split_finished_in_its_cluster_writes_what_the_reduce_kernel_writes(monkeypatch, name, spec_name, links, splits):
    import cupy

    if not families.FAMILIES[name].runs_here():
        pytest.skip("wgmma needs an sm_90 GPU")
    spec = SHAPES[spec_name]
    config = pipelined.with_split(families.configure(spec, name, ADD_RELU), splits)
    config = dataclasses.replace(config, links=links) if links else config
    seed, x, w, b, r = draw(spec, residual=True)
    assert families.unsupported_reason(spec, config, (w, b), ADD_RELU) is None

    def run(cluster_splits: int) -> np.ndarray:
        monkeypatch.setattr(wgmma, "CLUSTER_SPLITS", cluster_splits)
        kernel = families.build_kernel(spec, config.name(), (w, b), ADD_RELU)
        assert (kernel._reduce is None) is (cluster_splits >= splits)
        shape, dtype, poison = kernel.output_shape(spec.batch), cupy.float32, cupy.nan
        if links:
            shape, dtype, poison = (shape[0], *shape[2:], shape[1]), cupy.uint16, 0xFFFF  # NaN in both formats
        [y] = kernel([cupy.asarray(x), None, None, cupy.asarray(r)], None, out=cupy.full(shape, poison, dtype))
        return cupy.asnumpy(y)

    in_cluster, reduced = run(wgmma.CLUSTER_SPLITS), run(1)
    bits = np.uint32 if in_cluster.dtype == np.float32 else np.uint16
    assert np.array_equal(in_cluster.view(bits), reduced.view(bits)), f"{config.name()} (seed {seed})"
    got = in_cluster if not links else _channel_first(in_cluster, name)
    exact = reference.expected(spec, ADD_RELU, x, w, b, r)
    error = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert error < BOUND[name], f"{config.name()} (seed {seed}): relative L2 {error:.2e}"


def _channel_first(y: np.ndarray, name: str) -> np.ndarray:
    """A linked Y ([N][H][W][C], FP16 or BF16 bits) as FP32 NCHW."""
    values = y.view(np.float16).astype(np.float32) if name == "wg_fp16" else (y.astype(np.uint32) << 16).view(np.float32)
    return values.transpose(0, 3, 1, 2)
