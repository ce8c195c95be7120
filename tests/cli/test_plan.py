"""opplugin plan: the steps a model splits into, the fusions --keep gives up, and only the flags that change a plan."""
import pytest

from opplugin.cli import main


def test_plan_command(tiny_model_path, capsys):
    assert main(["plan", tiny_model_path, "--device", "cpu"]) == 0
    assert "conv1" in capsys.readouterr().out


# Bad flags and output paths: each is refused before the model is even loaded.


def test_unnamed_nodes_show_as_op_type_and_index(tmp_path, capsys):
    from onnx_builders import save, tiny_cnn

    proto = tiny_cnn()
    for node in proto.graph.node:
        node.name = ""
    assert main(["plan", save(proto, tmp_path / "tiny.onnx"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Conv_0" in out and "Conv_3" in out


def test_plan_with_keep_lists_the_fusion_it_gives_up_in_text_and_json(tmp_path, capsys):
    import json

    assert main(["plan", "lenet86", "--device", "cpu", "--keep", "relu1_out", "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    why = "Conv > Relu > MaxPool not fused: relu1_out is kept, and the fused kernel would not write it"
    assert f"Fusions given up:\n  conv1: {why}" in out
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["fusions_given_up"] == {"conv1": why}
    assert [step["ops"] for step in data["steps"][:2]] == [["Conv", "Relu"], ["MaxPool"]]
    assert data["steps"][0]["outputs"][0]["name"] == "relu1_out"


def test_plan_refuses_a_keep_it_cannot_plan_in_one_line(tmp_path, capsys):
    assert main(["plan", "lenet86", "--device", "cpu", "--keep", "relu1", "--json", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "opplugin: error: --keep relu1: lenet86 has no tensor of that name (did you mean relu1_out?)"
    assert not (tmp_path / "p.json").exists()


def test_plan_takes_the_sizes_of_the_users_inputs(tmp_path, capsys):
    import numpy as np
    from onnx_builders import conv_model, save

    w = np.ones((2, 3, 3, 3), np.float32)
    path = save(conv_model(("N", 3, "H", "W"), w, None, {}), tmp_path / "free.onnx")
    np.save(tmp_path / "x.npy", np.ones((5, 3, 9, 7), np.float32))
    assert main(["plan", path, "--device", "cpu", "--load-inputs", str(tmp_path / "x.npy")]) == 0
    out = capsys.readouterr().out
    assert "batch 5" in out.splitlines()[0] and "x [5, 3, 9, 7]" in out


@pytest.mark.parametrize("flag", [["--data", "random"], ["--seed", "1"], ["--chunk", "4"], ["--streams", "2"], ["--cuda-graphs"],
                                  ["--no-cuda-graphs"], ["--devices", "all"], ["--mean", "0.5"], ["--save-outputs", "o.npz"],
                                  ["--atol", "0"]])
def test_plan_refuses_the_flags_that_do_not_change_a_plan(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "lenet86", "--device", "cpu", *flag])
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {' '.join(flag)}" in capsys.readouterr().err


def test_plan_with_precision_shows_each_steps_precision_and_why_one_stays_fp32(tmp_path, capsys):
    import json

    from onnx_builders import save
    from precision_cases import conv_mlp_model

    path = save(conv_mlp_model(), tmp_path / "conv_mlp.onnx")
    assert main(["plan", path, "--device", "cpu", "--precision", "fp16", "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "precision fp16 (where a step has a kernel in it; the rest fp32)" in out.splitlines()[0]
    assert "runs: matmul.reference.fp16+relu" in out and "precision: fp16" in out
    conv_why = "wg_fp16 takes fewer than 32 maps a group only in whole 8-map blocks (a tile of exactly its maps); this Conv has 4 a group"
    assert f"precision: fp32: {conv_why}" in out
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["schema"] == "opplugin-plan/7" and data["precision"] == "fp16"
    assert [(s["name"], s["precision"], s["precision_reason"]) for s in data["steps"]] == [
        ("conv", "fp32", conv_why), ("fc1", "fp16", None),
        ("fc2", "fp32", "wg_fp16 does not fuse a row Softmax (rowwarp does, for N <= 32)")]
    # --variant wins for its op type
    assert main(["plan", path, "--device", "cpu", "--precision", "fp16", "--variant", "MatMul=reference", "--json", str(tmp_path / "v.json")]) == 0
    fc1 = json.loads((tmp_path / "v.json").read_text())["steps"][1]
    assert (fc1["implementation"], fc1["precision"], fc1["precision_reason"]) == ("matmul.reference+relu", "fp32", "--variant MatMul=reference")


def test_an_fp32_plan_reads_as_it_did(tiny_model_path, capsys):
    assert main(["plan", tiny_model_path, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "precision" not in out


def test_plan_refuses_a_precision_it_does_not_take_in_one_line(capsys):
    assert main(["plan", "lenet86", "--device", "cpu", "--precision", "fp64"]) == 2
    assert capsys.readouterr().err == "opplugin: error: --precision 'fp64': one of fp32, tf32, fp16, bf16, mixed (a step without a kernel in it stays fp32)\n"
