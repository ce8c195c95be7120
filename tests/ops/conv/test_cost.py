"""The cost model for the default pick (ops/conv/cost.py), on the CPU: a K split's second
launch and scratch buffer cost the host only when no CUDA graph replays the kernels, and
variants rank by predicted time."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnx_builders import conv_spec as conv
from opplugin.ops.conv import cost, families
from opplugin.ops.conv.choice import heuristic_config
from opplugin.ops.conv.epilogue import NONE
from opplugin.ops.conv.families import pipelined

SMS = pipelined.DEFAULT_SMS
VGG_512_B1 = conv(1, 512, 512, (14, 14), (3, 3), pads=(1, 1, 1, 1))  # 16 tiles of 128x64: the family splits K


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32)


def split_pick():
    config = families.configure(VGG_512_B1, "tc_3xtf32")
    assert config.splits > 1
    return config


def test_a_k_split_is_two_launches_and_a_scratch_buffer_which_cost_the_host_only_eagerly():
    split = split_pick()
    unsplit = dataclasses.replace(split, splits=1)
    assert (cost.launches(split), cost.allocations(split)) == (2, 1)
    assert (cost.launches(unsplit), cost.allocations(unsplit)) == (1, 0)
    assert cost.host_us(split, graphed=True) == cost.host_us(unsplit, graphed=True) == 0.0
    assert cost.host_us(split, graphed=False) == 2 * cost.LAUNCH_HOST_US + cost.ALLOCATION_HOST_US
    assert cost.host_us(unsplit, graphed=False) == cost.LAUNCH_HOST_US


def test_the_device_term_rewards_a_split_that_fills_the_gpu_and_charges_its_second_launch():
    split = split_pick()
    unsplit = dataclasses.replace(split, splits=1)
    # 16 blocks on 132 SMs walk all of K alone; split, they share it
    assert cost.device_us(VGG_512_B1, split, SMS) < cost.device_us(VGG_512_B1, unsplit, SMS)
    big = conv(64, 512, 512, (14, 14), (3, 3), pads=(1, 1, 1, 1))  # enough tiles: a split only adds its launch
    many = dataclasses.replace(split, splits=2)
    assert cost.device_us(big, many, SMS) > cost.device_us(big, unsplit, SMS)


def test_ranking_by_predicted_time_keeps_the_split_under_graphs_and_drops_it_eagerly_where_the_host_dominates():
    split = split_pick()
    candidates = cost.split_alternatives(split)
    assert candidates[0] == split and candidates[-1].splits == 1
    graphed = cost.cheapest(VGG_512_B1, candidates, SMS, graphed=True)
    assert graphed == min(candidates, key=lambda c: cost.device_us(VGG_512_B1, c, SMS))
    small = conv(1, 32, 64, (7, 7), (3, 3), pads=(1, 1, 1, 1))  # a few µs of work: launches decide
    tiny = families.parse("tc_3xtf32_b32x64x32_w32x16_s3_k2")[1]  # its smallest tile, K in two
    eager = [cost.predict(small, c, SMS, graphed=False).total_us for c in (tiny, dataclasses.replace(tiny, splits=1))]
    assert eager[1] < eager[0]
    assert cost.cheapest(small, [tiny, dataclasses.replace(tiny, splits=1)], SMS, graphed=False).splits == 1


def test_predict_counts_the_host_only_for_eager_launches():
    split = split_pick()
    assert cost.predict(VGG_512_B1, split, SMS, graphed=True).host_us == 0.0
    assert cost.predict(VGG_512_B1, split, SMS, graphed=False).host_us > 0


def test_the_heuristic_picks_for_graphs_unless_told_otherwise():
    """`graphed` is an argument of the choice, its default the runner's (graphs on): nothing else changes the pick."""
    small = conv(1, 32, 64, (7, 7), (3, 3), pads=(1, 1, 1, 1))
    for spec in (VGG_512_B1, small):
        assert heuristic_config(spec, ones(spec), NONE) == heuristic_config(spec, ones(spec), NONE, graphed=True)


@pytest.mark.parametrize("graphed", [True, False])
def test_the_heuristic_returns_a_candidate_the_node_can_run(graphed):
    config = heuristic_config(VGG_512_B1, ones(VGG_512_B1), NONE, graphed)
    assert families.unsupported_reason(VGG_512_B1, config, ones(VGG_512_B1)) is None
    # the family's pick with another split or, its grid being short of a wave, another of its tiles
    offered = [c for pick in families.FAMILIES[config.family].configs(VGG_512_B1) for c in cost.split_alternatives(pick)]
    assert config in offered
    plain = conv(1, 1, 4, (28, 28), (5, 5))  # no K split anywhere: the heuristic's pick as before
    pick = heuristic_config(plain, ones(plain), NONE, graphed)
    assert pick == families.configure(plain, pick.family)


def test_a_pick_short_of_one_wave_may_take_a_smaller_tile_of_its_family():
    """At batch 1 the family's tile order (measured on grids of several waves) gives too few blocks:
    graphed, DenseNet's 1x1 96->128 at 56x56 ran 6.3 µs on 32x64 tiles and 8.7 on the 128x64 pick."""
    spec = conv(1, 96, 128, (56, 56), (1, 1))
    config = heuristic_config(spec, ones(spec), NONE, graphed=True)
    pick = families.configure(spec, config.family)
    assert cost.under_one_wave(spec, pick, SMS) and config.bm * config.bn < pick.bm * pick.bn
    big = dataclasses.replace(spec, batch=32)  # a grid of several waves keeps the family's order
    config = heuristic_config(big, ones(big), NONE, graphed=True)
    assert config == families.configure(big, config.family)
