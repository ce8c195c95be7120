"""Which step computes each node of the graph as loaded (plan/kept_nodes.py), where a mixed run keeps nodes in FP32 by
their names in the file: a node that survives simplification by its own step, a node folded into another (a
BatchNormalization into its Conv, GELU's pieces into one Gelu) or dropped (an Identity, a Dropout) by the step that now
computes its values; a name that is no node is one line."""
from __future__ import annotations

import pytest
from onnx_builders import conv_bn_relu, identities_and_constants, save
from precision_cases import mlp_block_model

from opplugin.errors import InputError
from opplugin.gpu.device import CPU
from opplugin.graph.model import load_model
from opplugin.plan.kept_nodes import steps_holding
from opplugin.plan.partition import make_plan


def plan_of(proto, tmp_path, name):
    return make_plan(load_model(save(proto, tmp_path / f"{name}.onnx")), 2, CPU)


def test_a_node_that_survives_is_held_by_its_own_step(tmp_path):
    plan = plan_of(mlp_block_model(), tmp_path, "mlp")
    assert {s.name: s.node_names for s in plan.steps} == {"fc1": ["fc1", "fc1_bias", "gelu_erf"], "fc2": ["fc2", "fc2_bias", "residual"]}
    assert steps_holding(plan, ["residual", "fc1", "fc2"]) == {"fc2": ["residual", "fc2"], "fc1": ["fc1"]}


def test_gelus_pieces_folded_into_one_gelu_are_held_by_the_step_that_runs_it(tmp_path):
    plan = plan_of(mlp_block_model(), tmp_path, "mlp")
    pieces = ["gelu_div", "gelu_add", "gelu_half", "gelu"]  # the Gelu is named after the Erf, which no longer has these names
    assert steps_holding(plan, pieces) == {"fc1": pieces}


def test_a_batchnorm_folded_into_its_conv_is_held_by_the_convs_step(tmp_path):
    plan = plan_of(conv_bn_relu(), tmp_path, "cbr")
    assert plan.model.simplification.batchnorms_folded == 1 and "bn" not in plan.steps[0].node_names
    assert steps_holding(plan, ["bn"]) == {plan.steps[0].name: ["bn"]}


def test_dropped_identities_are_held_by_the_step_that_computes_their_values(tmp_path):
    plan = plan_of(identities_and_constants(), tmp_path, "ids")
    conv = next(s.name for s in plan.steps if "conv" in s.node_names)
    assert steps_holding(plan, ["identity_in", "dropout", "identity_out"]) == {conv: ["identity_in", "dropout", "identity_out"]}


def test_a_name_that_is_no_node_is_one_line(tmp_path):
    plan = plan_of(conv_bn_relu(), tmp_path, "cbr")
    with pytest.raises(InputError) as caught:
        steps_holding(plan, ["conv", "cnov"])
    assert str(caught.value) == "keep_fp32 names 'cnov', which is no node of cbr"
