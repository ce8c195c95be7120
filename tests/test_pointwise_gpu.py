"""The elementwise plugin's CuPy kernels against the float64 numpy reference (GPU tests, marker `gpu`).

Fresh random operands with NaN, +inf and -inf at a few places, outputs poisoned with NaN first;
every activation of the shared table alone, and every binary op and operand form with a fused activation."""
from __future__ import annotations

import numpy as np
import pytest

from elementwise_cases import ACTIVATIONS, OPERANDS, binary_model, feeds, unary_model
from onnx_builders import save
from opplugin.device import select_device
from opplugin.model import load_model
from opplugin.ops import activation
from opplugin.ops.elementwise import ElementwiseSpec
from opplugin.plan import make_plan

pytestmark = pytest.mark.gpu


def check(model, tmp_path, batch=4):
    import cupy

    device = select_device("cuda")
    plan = make_plan(load_model(save(model, tmp_path / "model.onnx")), batch, device)
    [step] = plan.steps
    kernel = step.build(device)
    inputs = feeds(model, batch, seed=batch, poison=True)
    operands = [inputs[n] if n in inputs else plan.model.initializers[n] for n in step.inputs]
    out = cupy.full((batch, 6, 5, 7), np.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(x) for x in operands], None, out=out)
    assert y is out
    got = cupy.asnumpy(y)
    spec = ElementwiseSpec.from_node(step.node)
    if step.fused:
        spec = spec.fused(activation.from_node(step.fused[0]))
    with np.errstate(all="ignore"):
        exact = spec.apply([np.asarray(x, np.float64) for x in operands])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(exact.astype(np.float32)))
    finite = np.isfinite(got)
    np.testing.assert_allclose(got[finite], exact[finite], rtol=2e-6, atol=1e-7)
    return step


@pytest.mark.parametrize("case", ACTIVATIONS, ids=lambda a: a[0] + "".join(map(str, a[2])))
def test_each_activation_matches_the_reference(case, tmp_path):
    check(unary_model(*case), tmp_path)


@pytest.mark.parametrize("operand", list(OPERANDS))
@pytest.mark.parametrize("op", ["Add", "Sum", "Mul"])
@pytest.mark.parametrize("then", [None, ACTIVATIONS[0], ACTIVATIONS[6]], ids=["alone", "relu", "hardsigmoid"])
def test_binary_ops_with_a_fused_activation_match_the_reference(op, operand, then, tmp_path):
    step = check(binary_model(op, operand, then, constant_first=operand == "scalar"), tmp_path)
    assert step.ops == [op, *([then[0]] if then else [])]
