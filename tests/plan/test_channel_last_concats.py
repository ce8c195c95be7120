"""Concats in the half-precision links (plan/channel_last.py, ops/layout/channel_last.py), as a Hopper plan sees
them: a Concat along the channels takes the format of its producers and links every input and its output, or none
and stays FP32, saying why (an input from an FP32 step, an output handed back, an input another Concat reads too:
DenseNet's pattern); and the buffer assignment (runtime/buffers.py) places no linked tensor in a Concat's slot,
nor any tensor in a linked Concat's output."""
from __future__ import annotations

import numpy as np
import pytest
from concat_cases import dense_block, inception_block
from onnx_builders import save

from opplugin.errors import PluginError
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.ops.layout.channel_last import LinkedConcat
from opplugin.ops.layout.kernels import ConcatKernel
from opplugin.ops.layout.linked_concat import LinkedConcatKernel
from opplugin.plan.channel_last import linked_tensors
from opplugin.plan.partition import make_plan
from opplugin.plan.precision import step_precisions
from opplugin.registry import Kernel
from opplugin.report.plan import format_plan
from opplugin.runtime.buffers import assign_buffers
from opplugin.runtime.plan_record import record_plan_alone

GPU = Device("cuda", "test GPU")
PRECISIONS = ["fp16", "bf16"]
BRANCHES = ("b1", "b2", "b3")


def plan_of(model, tmp_path, name="m", **kwargs):
    return make_plan(load_model(save(model, tmp_path / f"{name}.onnx")), 8, GPU, **kwargs)


def linked_of(plan, precision="fp16") -> set[str]:
    return linked_tensors(plan, {name: p.variant for name, p in step_precisions(plan, precision).items()})


@pytest.mark.parametrize("precision", PRECISIONS)
def test_an_inception_block_links_its_convs_pool_and_concats_end_to_end(precision, tmp_path):
    plan = plan_of(inception_block(), tmp_path)
    chosen = step_precisions(plan, precision)
    # every tensor between steps but the graph output y, through both blocks' Concats
    assert linked_of(plan, precision) == {"r0", "b2a", "p", *BRANCHES, "cat", "b12", "b2a2", "p2", "b22", "b32", "cat2"}
    for cat, inputs in (("cat", BRANCHES), ("cat2", ("b12", "b22", "b32"))):
        assert chosen[cat].variant == f"cuda_{precision}_h3" == LinkedConcat(f"cuda_{precision}", 3).name()
        # a Concat has no kernel in the format alone: linked, it runs in its tensors' format, and says so
        assert (chosen[cat].precision, chosen[cat].reason, chosen[cat].channel_last) == (precision, None, (*inputs, cat))
    # the Convs and the pool after the Concat read it channel-last; the pool keeps its format (any: its producer's)
    assert chosen["p2"].variant == f"cuda_{precision}_h3" and chosen["b12"].channel_last == ("cat", "b12")
    assert chosen["y"].channel_last == ("cat2",)


def test_the_plan_lists_a_linked_concat_with_its_kernel(tmp_path):
    record = record_plan_alone(plan_of(inception_block(), tmp_path), None, "bf16")
    steps = {s.name: s for s in record.steps}
    assert steps["cat"].implementation == "concat.cuda_bf16_h3.axis1x3" and steps["cat"].precision == "bf16"
    assert "channel-last in bf16: b1, b2, b3, cat" in format_plan(record)


def test_a_concat_handed_back_stays_fp32_with_the_reason_and_its_producers_write_fp32(tmp_path):
    for plan in (plan_of(inception_block(output_concat=True), tmp_path, "out"), plan_of(inception_block(), tmp_path, keep=["cat"])):
        chosen = step_precisions(plan, "fp16")
        assert (chosen["cat"].variant, chosen["cat"].precision) == (None, "fp32")
        assert chosen["cat"].reason == "not linked channel-last: cat is handed back by the run (a graph output or kept), in FP32 NCHW"
        assert not {*BRANCHES, "cat"} & linked_of(plan)
        assert chosen["b1"].channel_last == ("r0",)  # it reads r0 channel-last and writes b1 in FP32 NCHW for the Concat
        assert chosen["cat2"].variant == "cuda_fp16_h3"  # the next block's Concat links as before


def test_a_concat_with_an_input_from_no_16_bit_step_stays_fp32_and_so_do_its_readers(tmp_path):
    plan = plan_of(inception_block(fp32_branch=True), tmp_path)
    chosen = step_precisions(plan, "fp16")
    assert chosen["cat"].reason == "not linked channel-last: its input z comes in FP32 NCHW from the graph's inputs"
    assert not {*BRANCHES, "cat"} & linked_of(plan)
    # the pool that reads the FP32 Concat has no format to take: FP32 too, and its neighbours read and write FP32
    assert (chosen["p2"].variant, chosen["p2"].precision) == (None, "fp32") and chosen["b32"].channel_last == ("b32",)


def test_a_concat_whose_reader_takes_fp32_alone_stays_fp32_as_a_whole(tmp_path):
    """cat is read by b12 and p2, and the budget keeps p2 in FP32: cat cannot be linked, so none of b1, b2, b3 is."""
    plan = plan_of(inception_block(), tmp_path)
    kept = {"p2": "kept for the test"}
    chosen = step_precisions(plan, "mixed", keep_fp32=kept)
    assert chosen["cat"].reason == "not linked channel-last: p2 reads cat in FP32 NCHW"
    linked = linked_tensors(plan, {name: p.variant for name, p in chosen.items()}, frozenset(kept))
    assert not {*BRANCHES, "cat"} & linked and {"r0", "p", "b2a"} <= linked


def test_densenets_concats_stay_fp32_rather_than_copy_each_layer_once_per_later_layer(tmp_path):
    plan = plan_of(dense_block(), tmp_path)
    chosen = step_precisions(plan, "fp16")
    concats = [step.name for step in plan.plugin_steps if step.node.op_type == "Concat"]
    assert len(concats) == 4 and linked_of(plan) == set()  # cat1 of f0 alone is an identity, gone at load
    for name in concats:
        assert chosen[name].precision == "fp32" and "is an input of" in chosen[name].reason and "DenseNet" in chosen[name].reason
    assert all(chosen[f"f{i}"].channel_last == () for i in range(5))  # each writes FP32 once, into the shared buffer


def test_channels_no_multiple_of_8_are_declined_by_the_convs_and_so_the_concat_says_why(tmp_path):
    """Branches of 12 maps: no 16-bit Conv writes them channel-last (a group's maps are whole 16-byte runs), so the
    Concat's inputs come in FP32, and the Concat keeps FP32 tensors too, however it could copy them."""
    plan = plan_of(inception_block(branch=12), tmp_path)
    chosen = step_precisions(plan, "fp16")
    assert chosen["cat"].precision == "fp32"
    assert chosen["cat"].reason == "not linked channel-last: its input b1 comes in FP32 NCHW from step b1, which keeps FP32 tensors"
    assert not {*BRANCHES, "cat", "cat2"} & linked_of(plan)


def test_nothing_about_a_concat_is_linked_in_fp32_nor_on_the_cpu(tmp_path):
    plan = plan_of(inception_block(), tmp_path)
    assert not any(p.channel_last for p in step_precisions(plan, "fp32").values())
    cpu = make_plan(load_model(save(inception_block(), tmp_path / "cpu.onnx")), 8, Device("cpu"))
    assert not any(p.channel_last for p in step_precisions(cpu, "fp16").values())


def test_a_concat_links_all_of_its_tensors_or_none(tmp_path):
    cat = next(s for s in plan_of(inception_block(), tmp_path).plugin_steps if s.name == "cat")
    plugin, node = cat.plugin, cat.node
    offer = plugin.channel_last(node, GPU, None)
    assert (offer.format, offer.inputs, offer.output, offer.all_or_none) == (None, frozenset({0, 1, 2}), True, True)
    assert plugin.channel_last(node, GPU, "cuda_bf16_h3").format == "bf16"  # a linked variant's own
    assert plugin.linked_variant(node, GPU, None, frozenset({0, 1, 2}), True, "fp16") == "cuda_fp16_h3"
    with pytest.raises(PluginError, match="links all of its inputs and its output or none"):
        plugin.linked_variant(node, GPU, None, frozenset({0, 1}), True, "fp16")
    with pytest.raises(PluginError, match="keeps no such tensor channel-last in fp16"):
        plugin.linked_variant(node, GPU, "cuda_bf16_h3", frozenset({0, 1, 2}), True, "fp16")
    with pytest.raises(PluginError, match=r"links all of its inputs and its output \(h3\) or none"):
        plugin.build(node, GPU, "cuda_fp16_h1")
    with pytest.raises(PluginError, match="needs a CUDA device"):
        plugin.build(node, Device("cpu"), "cuda_fp16_h3")
    assert plugin.kernel_name(node, GPU, "cuda_fp16_h3") == "concat.cuda_fp16_h3.axis1x3"
    assert isinstance(plugin.build(node, GPU, "cuda_fp16_h3"), LinkedConcatKernel)  # compiled at its first call
    assert plugin.precision_variant(node, GPU, "fp16").variant is None  # it runs in a format only linked


class _Strided(Kernel):
    """A stand-in kernel that writes into any view (out_view "strided") and reads views (in_views), so that every
    Concat input it makes qualifies for its slot, and every Concat it reads for a view, but for what links forbid."""

    out_view = "strided"
    in_views = True


def _assigned(plan, precision):
    """The buffer assignment of `plan` under `precision`: the Concats' own kernels (which compile at their first call),
    stand-ins for the rest; and the linked tensors."""
    chosen = step_precisions(plan, precision)
    kernels = {step.name: step.build(GPU, chosen[step.name].variant) if step.node.op_type == "Concat" else _Strided()
               for step in plan.plugin_steps}
    linked = frozenset(name for p in chosen.values() for name in p.channel_last)
    return assign_buffers(plan, kernels, linked), linked, kernels


def test_the_buffer_assignment_places_no_linked_tensor_nor_any_in_a_linked_concat(tmp_path):
    assignment, linked, kernels = _assigned(plan_of(inception_block(), tmp_path), "fp16")
    assert {"cat", "cat2"} <= linked and isinstance(kernels["cat"], LinkedConcatKernel)
    assert assignment.slots == {} and assignment.concats == {}
    # cat FP32 (handed back) beside cat2 linked: b1, b2, b3 are written into cat's slices, nothing into cat2's
    assignment, linked, kernels = _assigned(plan_of(inception_block(output_concat=True), tmp_path, "out"), "fp16")
    assert isinstance(kernels["cat"], ConcatKernel) and isinstance(kernels["cat2"], LinkedConcatKernel)
    assert set(assignment.slots) == set(BRANCHES) and {slot.buffer for slot in assignment.slots.values()} == {"cat"}
    assert not linked & {*assignment.slots, *(slot.buffer for slot in assignment.slots.values())}


def test_the_buffer_assignment_leaves_a_plain_concat_alone_where_the_plan_links_its_tensors(tmp_path):
    """However a Concat's kernel reads (a plain one here), a Concat whose tensors are linked is no Concat to buffers.py."""
    plan = plan_of(inception_block(output_concat=True), tmp_path)
    kernels = {step.name: step.build(GPU) if step.node.op_type == "Concat" else _Strided() for step in plan.plugin_steps}
    assert set(assign_buffers(plan, kernels).slots) == {*BRANCHES, "b12", "b22", "b32"}
    assert set(assign_buffers(plan, kernels, frozenset({"b22"})).slots) == set(BRANCHES)


def test_densenets_fp32_concats_keep_their_prefix_views_under_fp16(tmp_path):
    plan = plan_of(dense_block(), tmp_path)
    assignment, linked, _ = _assigned(plan, "fp16")
    assert linked == frozenset()
    # each layer's Concat is a view of the next, the last one's buffer holds them all; every layer but f0 (which f1 reads
    # as it is: cat1 of f0 alone is gone) writes in place, so the first Concat copies f0 alone and the others nothing
    assert {name: slot.buffer for name, slot in assignment.slots.items()} == {
        "cat2": "cat3", "cat3": "cat4", "cat4": "cat", **{f"f{i}": "cat2" if i == 1 else f"cat{i + 1}" if i < 4 else "cat" for i in range(1, 5)}}
    assert assignment.removed(plan) == ["cat3", "cat4", "cat"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_checks_emulation_runs_a_concat_as_the_linked_kernel_does_a_copy_of_rounded_values(precision, tmp_path):
    """check --precision emulates every tensor rounded to the format (verify/precision_cost.py): a Concat of rounded
    inputs is then its exact output rounded to the format, what the linked kernel writes; and the plan says the
    linked Concat runs in the format, in agreement."""
    from precision_cases import feeds_for

    from opplugin.core.number_formats import round_to
    from opplugin.verify.precision_cost import Emulation

    model = inception_block()
    emulation = Emulation(model, feeds_for(model, batch=2))
    alone = emulation.own(precision)
    concats = [(index, node.output[0]) for index, node in enumerate(emulation.body) if node.op_type == "Concat"]
    assert [name for _, name in concats] == ["cat", "cat2"]
    for index, name in concats:
        assert np.array_equal(alone[index][name], round_to(np.asarray(emulation.exact[name], np.float32), precision))
    chosen = step_precisions(plan_of(model, tmp_path), precision)
    assert [chosen[name].precision for _, name in concats] == [precision, precision]
