"""The report: rows, text, JSON/CSV with the same keys, atomic writes."""
import csv
import io
import json

import numpy as np
import pytest

from opplugin.report import timing as report
from opplugin.core.files import write_atomic
from opplugin.graph.model import load_model
from opplugin.runtime import Runner


@pytest.fixture
def built(tiny_model_path):
    from opplugin.registry import plugins

    # the Conv plugin alone, so that the Flatten > Gemm > Softmax tail is an onnxruntime row
    runner = Runner(load_model(tiny_model_path), 4, "cpu", registry={"Conv": plugins()["Conv"]})
    feeds = {"x": np.random.default_rng(0).uniform(0, 1, (4, 3, 12, 12)).astype(np.float32)}
    profile = runner.profile(feeds, warmup=1, repeat=3)
    return runner, report.build_report(profile, warmup=1, extra={"accuracy": 0.5})


def test_rows_cover_every_step_with_stable_keys(built):
    runner, result = built
    rows = result["steps"]
    assert [r["step"] for r in rows] == [step.name for step in runner.plan.steps]
    assert all(tuple(r) == report.ROW_KEYS for r in rows)
    conv = rows[0]
    assert conv["kind"] == "plugin" and conv["implementation"].startswith("conv.reference")
    assert conv["input_shapes"] == [[4, 3, 12, 12]]
    assert conv["output_shapes"] == [[4, 4, 6, 6]]
    expected_flops = runner.kernels["conv1"].flops(4)
    assert conv["gflops_per_s"] == pytest.approx(expected_flops / conv["time_ms"] / 1e6)
    ort_row = next(r for r in rows if r["kind"] == "onnxruntime")
    assert ort_row["gflops_per_s"] is None and ort_row["gb_per_s"] > 0
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert set(result["op_times_ms"]) == {s.name for s in runner.plan.plugin_steps}
    assert result["repeat"] == 3


def test_text_has_the_seeds_lines_and_the_table(built):
    _, result = built
    text = report.format_text(result)
    assert text.count("Op Time: ") == 2
    assert "Test Accuracy: 0.5000" in text
    assert "numpy reference" in text
    for column in ("step", "implementation", "GFLOP/s", "GB/s", "share"):
        assert column in text


def test_json_and_csv_carry_the_same_rows(built, tmp_path):
    _, result = built
    write_atomic(tmp_path / "r.json", json.dumps(result))
    loaded = json.loads((tmp_path / "r.json").read_text())
    assert loaded["steps"] == result["steps"]
    rows = list(csv.DictReader(io.StringIO(report.to_csv(result["steps"]))))
    assert [r["step"] for r in rows] == [r["step"] for r in result["steps"]]
    assert tuple(rows[0]) == report.ROW_KEYS
    assert json.loads(rows[0]["input_shapes"]) == [[4, 3, 12, 12]]


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")

    class Unprintable:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.raises(TypeError):
        write_atomic(target, Unprintable())  # not a str: the write fails midway
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_throughput_and_chunking_are_reported(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 10, "cpu", chunk=4)
    feeds = {"x": np.random.default_rng(0).uniform(0, 1, (10, 3, 12, 12)).astype(np.float32)}
    result = report.build_report(runner.profile(feeds, warmup=0, repeat=2), warmup=0)
    assert result["batch"] == 10 and result["chunks"] == 3 and result["chunk_size"] == 4
    assert result["host_to_host_ms"] > 0 and "end_to_end_ms" not in result and result["schema"] == report.SCHEMA
    assert result["images_per_s"] == pytest.approx(10 / (result["host_to_host_ms"] / 1e3))
    assert result["copy_ms"] == result["copy_hidden_ms"] == result["copy_exposed_ms"] == 0.0  # no copies on the CPU
    assert result["input_pinned"] is False
    text = report.format_text(result)
    assert "images/s (in 3 chunks of up to 4)" in text and "Copies:" not in text
    # a chunked run's step times are sums over its chunks, and its shapes are the whole batch's
    assert result["steps"][0]["input_shapes"] == [[10, 3, 12, 12]]


def test_text_table_fits_each_column_to_its_widest_cell():
    from opplugin.core.texttable import text_table

    lines = text_table(["name", "ms"], [["conv.const_tile_t2x2_m8+relu+maxpool4", "1.5"], ["gemm", "12.25"]], right=[1])
    assert lines == [
        "name                                      ms",
        "-------------------------------------  -----",
        "conv.const_tile_t2x2_m8+relu+maxpool4    1.5",
        "gemm                                   12.25",
    ]
    assert text_table(["a", "b"], [["x", "y"]], rule=False, indent="  ") == ["  a  b", "  x  y"]


def test_a_cuda_graph_is_one_row_with_its_steps_work_and_the_text_says_so(tiny_model_path):
    from opplugin.runtime.graphs import graph_name

    runner = Runner(load_model(tiny_model_path), 4, "cpu")
    feeds = {"x": np.random.default_rng(0).uniform(0, 1, (4, 3, 12, 12)).astype(np.float32)}
    profile = runner.profile(feeds, warmup=0, repeat=2)
    # what a GPU run with cuda_graphs records: the plugin steps' spans replaced by one graph span
    members = [step.name for step in runner.plan.plugin_steps]
    name = graph_name(members)
    readings = [profile.step_ms.pop(m) for m in members]
    profile.step_ms = {name: [sum(run) for run in zip(*readings)], **profile.step_ms}
    profile.kinds[name] = "plugin"
    profile.graphs = {name: tuple(members)}
    built = report.build_report(profile, warmup=0)
    row = next(r for r in built["steps"] if r["step"] == name)
    assert row["implementation"] == f"CUDA graph of {len(members)} plugin steps"
    assert row["ops"] == " > ".join(op for step in runner.plan.plugin_steps for op in step.ops)
    total_flops = sum(runner.kernels[m].flops(4) for m in members)
    assert row["gflops_per_s"] == pytest.approx(total_flops / row["time_ms"] / 1e6)
    assert row["input_shapes"] == [[4, 3, 12, 12]] and built["cuda_graphs"] == {name: members}
    assert f"CUDA graphs: 1 graph(s) replayed {len(members)} plugin steps" in report.format_text(built)


def test_the_steps_are_summed_per_op_chain_in_the_json_text_and_page(tmp_path):
    """Two Relu steps and a Conv > Relu: the Relus are one chain of two steps, their times summed, and the
    text, the JSON and the HTML page's bars say so."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx_builders import save
    from opplugin.report.html_sections import op_chain_section

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["r"], ["s"], name="gate"),
             helper.make_node("Concat", ["s", "r"], ["j"], name="join", axis=1),
             helper.make_node("Relu", ["j"], ["a"], name="relu_a"),
             helper.make_node("Transpose", ["a"], ["t"], name="swap", perm=[0, 1, 3, 2]),
             helper.make_node("Relu", ["t"], ["y"], name="relu_b")]
    graph = helper.make_graph(nodes, "chains", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 5, 5])],
                              [numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    runner = Runner(load_model(save(proto, tmp_path / "chains.onnx")), 2, "cpu")
    feeds = {"x": rng.standard_normal((2, 2, 5, 5)).astype(np.float32)}
    result = report.build_report(runner.profile(feeds, warmup=0, repeat=2), warmup=0)
    chains = {c["ops"]: c for c in result["by_op_chain"]}
    steps = {r["step"]: r for r in result["steps"]}
    relus = [r for r in result["steps"] if r["ops"] == "Relu"]
    assert len(relus) == 2 and chains["Relu"]["steps"] == 2
    assert chains["Relu"]["time_ms"] == pytest.approx(sum(r["time_ms"] for r in relus))
    assert sum(c["steps"] for c in chains.values()) == len(steps)
    assert sum(c["share"] for c in chains.values()) == pytest.approx(1.0)
    assert [c["time_ms"] for c in result["by_op_chain"]] == sorted((c["time_ms"] for c in result["by_op_chain"]), reverse=True)
    assert chains["Transpose"]["gflops_per_s"] is None  # a layout step counts no FLOPs
    text = report.format_text(result)
    assert "Time by op chain:" in text and "op chain" in text
    section = op_chain_section(result["by_op_chain"])
    assert section.body.count("<rect") == len(chains) and "2 steps" in section.body


def test_the_devices_section_says_how_many_the_host_fed_and_which_were_left_idle():
    """The issue's four H200s: 1.77x on 2, 1.87x on 3, 1.66x on 4; the run used 3."""
    from opplugin.runtime.feeding import Feeding

    labels = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    ms = [100.0 / speedup * share for speedup, share in zip([1.0, 1.77, 1.87, 1.66], [1, 2, 3, 4])]
    feeding = Feeding.measured([50_000, 100_000, 150_000, 200_000], [ms_one * 0.25 for ms_one in ms])
    rows = [{"device": label, "images": images, "time_ms": 50.0 if images else 0.0, "images_per_s": None}
            for label, images in zip(labels, [66_667, 66_667, 66_666, 0])]
    result = report.add_devices({}, rows, 60.0, feeding.record(labels))
    assert result["feeding"]["used"] == labels[:3] and result["feeding"]["idle"] == ["cuda:3"]
    lines = report.format_devices(result)
    assert lines[-2].startswith("3 of 4 devices: 200,000 images in 60.000 ms host to host")
    assert lines[-1] == ("Feed probe: the host fed 3 of the 4 devices (images/s on 1: 2,000,000, 2: 3,540,000, 3: 3,740,000, "
                         "4: 3,320,000; the fewest within 3% of the most); cuda:3 left idle")


def test_a_run_not_probed_says_why_and_that_every_device_was_used():
    from opplugin.runtime.feeding import Feeding

    rows = [{"device": label, "images": 5, "time_ms": 1.0, "images_per_s": 5000.0} for label in ("cpu #1", "cpu #2")]
    result = report.add_devices({}, rows, 2.0, Feeding.unprobed(2, "one reason").record(["cpu #1", "cpu #2"]))
    assert report.format_devices(result)[-2:] == ["All 2 devices: 10 images in 2.000 ms host to host, 5,000 images/s",
                                                  "Feed probe: none (one reason); all 2 devices used"]
