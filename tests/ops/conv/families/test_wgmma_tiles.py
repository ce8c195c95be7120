"""conv_wgmma's blocks take the output tiles in turn (unsplit, a block an SM: persistent), and its channel-last
rewrite tiles narrow images (a stem's 3 channels, padded to 8) with fewer channels a block. CPU: the rewrite's
tile. GPU: a grid of three blocks, each taking many tiles, writes bit for bit what a grid of a block a tile
writes, for every wg family, a linked Y (the staged stores), a stem and a narrow map tile; and that output is the Conv."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from family_gpu_checks import draw
from onnx_builders import conv_spec as conv

from opplugin.ops.conv import families, reference
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import pipelined, wgmma
from opplugin.ops.conv.families.channel_last import OUTPUT

ADD_RELU = Epilogue("Relu", residual=True)
WIDE = conv(4, 64, 128, (20, 20), (1, 1))  # 1,600 pixels: 13 to 25 pixel tiles, one or two map tiles
STEM = conv(3, 3, 64, (60, 60), (7, 7), pads=(3, 3, 3, 3), strides=(2, 2))  # 2,700 pixels: 22 tiles
NARROW = conv(4, 64, 64, (20, 20), (3, 3), pads=(1, 1, 1, 1), group=4)  # 16 maps a group: a 16-map tile, 52 or 100 tiles
SHAPES = {"WIDE": WIDE, "STEM": STEM, "NARROW": NARROW}
CASES = [("wg_3xtf32", "WIDE", 0), ("wg_fp16", "WIDE", 0), ("wg_bf16", "WIDE", OUTPUT), ("wg_fp16", "STEM", OUTPUT),
         ("wg_fp16", "NARROW", OUTPUT), ("wg_bf16", "NARROW", 0)]
# the relative L2 error against float64 each family stays within on these layers (a half format's roundoff)
BOUND = {"wg_3xtf32": 1e-5, "wg_fp16": 1e-2, "wg_bf16": 5e-2}


def test_the_rewrite_tiles_an_image_with_the_fewest_channels_that_hold_it():
    assert [wgmma.split_channels(c) for c in (3, 8, 9, 16, 17, 32, 64, 2048)] == [8, 8, 16, 16, 32, 32, 32, 32]
    [gemm, rewrite] = families.compile_units(STEM, "wg_fp16_b64x128x64_s4", NONE)
    assert rewrite.function == "conv_split_channel_last" and rewrite.defines["SPLIT_CHANNELS"] == 8 and rewrite.defines["CP"] == 8


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "spec_name", "links"), CASES)
def test_a_few_blocks_taking_the_tiles_in_turn_write_what_a_block_a_tile_writes(monkeypatch, name, spec_name, links):
    import cupy

    if not families.FAMILIES[name].runs_here():
        pytest.skip("wgmma needs an sm_90 GPU")
    spec = SHAPES[spec_name]
    config = pipelined.with_split(families.configure(spec, name, ADD_RELU), 1)
    config = dataclasses.replace(config, links=links) if links else config
    seed, x, w, b, r = draw(spec, residual=True)

    def run(blocks: int) -> np.ndarray:
        monkeypatch.setattr(wgmma, "multiprocessors", lambda: blocks)
        kernel = families.build_kernel(spec, config.name(), (w, b), ADD_RELU)
        shape, dtype, poison = kernel.output_shape(spec.batch), cupy.float32, cupy.nan
        if links:
            shape, dtype, poison = (shape[0], *shape[2:], shape[1]), cupy.uint16, 0xFFFF  # NaN in both formats
        [y] = kernel([cupy.asarray(x), None, None, cupy.asarray(r)], None, out=cupy.full(shape, poison, dtype))
        return cupy.asnumpy(y)

    tiles = pipelined.grid_blocks(spec, config)
    assert tiles > 3 * 4, "each of the few blocks takes several tiles"
    whole, few = run(tiles), run(3)
    assert np.array_equal(whole.view(np.uint32 if whole.dtype == np.float32 else np.uint16),
                          few.view(np.uint32 if few.dtype == np.float32 else np.uint16)), f"{config.name()} (seed {seed})"
    if not links:
        exact = reference.expected(spec, ADD_RELU, x, w, b, r)
        error = np.linalg.norm(few - exact) / np.linalg.norm(exact)
        assert error < BOUND[name], f"{config.name()} (seed {seed}): relative L2 {error:.2e}"
