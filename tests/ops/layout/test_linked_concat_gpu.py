"""A Concat on channel-last 16-bit tensors on the GPU (ops/layout/linked_concat.py): its output bit for bit the plain
Concat's FP32 output rounded to the format, at each width of copy, into a poisoned output; and Runners in fp16 and
bf16 of an Inception block in small (its Concats linked) and a DenseNet block in small (its Concats kept FP32)
against onnxruntime, within the format's rule."""
from __future__ import annotations

import numpy as np
import pytest
from concat_cases import dense_block, inception_block
from family_gpu_checks import assert_within_the_formats_rule
from onnx_builders import save

from opplugin.core.number_formats import half_bits
from opplugin.errors import PluginError
from opplugin.ops.layout.kernels import ConcatKernel
from opplugin.ops.layout.linked_concat import LinkedConcatKernel
from opplugin.ops.layout.spec import ConcatSpec

pytestmark = pytest.mark.gpu
FORMATS = ["fp16", "bf16"]
SIZE = (7, 9)


def _kernels(widths, fmt):
    spec = ConcatSpec(1, tuple(widths))
    per_image = 4 * 2 * sum(widths) * SIZE[0] * SIZE[1]
    return ConcatKernel("concat.cuda", per_image, spec), LinkedConcatKernel(f"concat.cuda_{fmt}_h3", per_image, spec, SIZE, f"cuda_{fmt}_h3")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("widths", [(64, 64, 96, 32), (12, 4, 8), (3, 5, 1), (8,)])
def test_a_linked_concat_writes_the_plain_concats_output_rounded_bit_for_bit(fmt, widths):
    import cupy

    seed = int(np.random.default_rng().integers(2**31))
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((5, w, *SIZE)).astype(np.float32) for w in widths]
    plain, linked = _kernels(widths, fmt)
    [fp32] = plain([cupy.asarray(x) for x in xs])
    want = half_bits(cupy.asnumpy(fp32), fmt).transpose(0, 2, 3, 1)
    inputs = [cupy.asarray(half_bits(x, fmt).transpose(0, 2, 3, 1).copy()) for x in xs]
    poisoned = cupy.full(want.shape, 0xFFFF, cupy.uint16)
    [got] = linked(inputs, None, out=poisoned)
    assert got is poisoned and np.array_equal(cupy.asnumpy(got), want), f"{widths} {fmt} (seed {seed})"
    [fresh] = linked(inputs[:], None)
    assert np.array_equal(cupy.asnumpy(fresh), want)
    # an input 8 bytes past 16-byte alignment: the copy narrows, the bits stay
    shifted = cupy.empty(inputs[0].size + 4, cupy.uint16)[4:].reshape(inputs[0].shape)
    shifted[...] = inputs[0]
    [again] = linked([shifted, *inputs[1:]], None)
    assert np.array_equal(cupy.asnumpy(again), want)


def test_a_linked_concat_refuses_an_fp32_tensor_where_it_expects_the_formats_bits():
    import cupy

    _, linked = _kernels((8, 8), "fp16")
    x = cupy.zeros((2, 8, *SIZE), cupy.float32)
    with pytest.raises(PluginError, match=r"input 0 is linked channel-last in 16 bits: expected a uint16 array of shape \(2, 7, 9, 8\)"):
        linked([x, x], None)


def _run_against_onnxruntime(model, precision, tmp_path, batch=16):
    """A Runner of `model` in `precision` (and one eager) against onnxruntime CPU on fresh inputs; the plan's record."""
    import onnxruntime

    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    loaded = load_model(save(model, tmp_path / "m.onnx"))
    runner = Runner(loaded, batch, "cuda", precision=precision)
    session = onnxruntime.InferenceSession(loaded.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng().standard_normal((batch, 3, *[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[2:]]))
    feeds = {"x": x.astype(np.float32)}
    got = runner.run(feeds).outputs["y"]
    [expected] = session.run(None, feeds)
    assert_within_the_formats_rule(got, expected, precision)
    eager = Runner(loaded, batch, "cuda", precision=precision, cuda_graphs=False)
    assert np.array_equal(eager.run(feeds).outputs["y"], got)
    return {s.name: s for s in runner.plan_record().steps}, runner


def _needs_wgmma():
    from opplugin.ops.conv import families

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")


@pytest.mark.parametrize("precision", FORMATS)
def test_a_runner_links_an_inception_blocks_concats_within_the_formats_rule(precision, tmp_path):
    _needs_wgmma()
    steps, runner = _run_against_onnxruntime(inception_block(), precision, tmp_path)
    for cat in ("cat", "cat2"):
        assert steps[cat].implementation == f"concat.cuda_{precision}_h3.axis1x3" and steps[cat].precision == precision
    assert steps["p2"].implementation.startswith(f"averagepool.cuda_{precision}_h3.")
    assert runner.buffers.slots == {}  # no linked tensor is written in place


@pytest.mark.parametrize("precision", FORMATS)
def test_a_runner_keeps_a_dense_blocks_concats_fp32_in_place_within_the_formats_rule(precision, tmp_path):
    _needs_wgmma()
    steps, _ = _run_against_onnxruntime(dense_block(), precision, tmp_path)
    assert all(s.precision == "fp32" and not s.channel_last for name, s in steps.items() if name.startswith("cat"))
    assert not any(s.channel_last for s in steps.values() if s.name.startswith("f"))  # each layer writes FP32 NCHW
