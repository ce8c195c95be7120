"""tools/plan_census.py: what a GPU would run for each model, counted on the CPU, and a row saying why
for a model that cannot be planned."""
from __future__ import annotations

import json
import sys
from repository import ROOT

TOOLS = ROOT / "tools"
sys.path.insert(0, str(TOOLS))

import plan_census  # noqa: E402  (a script of tools/, imported from its folder)

from opplugin.graph.model import resolve_model_path  # noqa: E402
from repository import ROOT


def test_family_names_drop_the_configuration_fields():
    assert plan_census._family("conv.tc_3xtf32_b128x64x32_w64x32_s3_k4+relu") == "conv.tc_3xtf32"
    assert plan_census._family("conv.scale*simt_gemm_b64x64x16_t8x4_s4_o4") == "conv.simt_gemm"
    assert plan_census._family("conv.dense_gemv_w1x1_k4") == "conv.dense_gemv"
    assert plan_census._family("pointwise.cuda.sigmoid_mul") == "pointwise.cuda.sigmoid_mul"


def test_a_shipped_model_and_a_broken_file_each_get_a_row(tmp_path, capsys):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    out = tmp_path / "census.json"
    assert plan_census.main([str(resolve_model_path("lenet86")), str(broken), "--batches", "1", "32", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    lenet = [r for r in rows if r["model"] == "lenet86"]
    assert [r["batch"] for r in lenet] == [1, 32]
    for row in lenet:
        assert row["onnxruntime_steps"] == 0 and row["conv_baseline"] == 0 and row["steps"] == row["plugin_steps"] > 0
        assert sum(v for k, v in row["families"].items() if k.startswith("conv.")) == 2  # its two Convs, on a family each
    [failed] = [r for r in rows if r["model"] == "broken"][:1]
    assert "error" in failed
    assert "broken" in capsys.readouterr().out
