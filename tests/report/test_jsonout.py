"""What every JSON report shares: the same first keys, a device object, nulls for
missing values, strict JSON."""
import json
import math

import numpy as np
import pytest

from opplugin import __version__
from opplugin.report import jsonout
from opplugin.cli import main
from opplugin.gpu.device import CPU, Device

HEADER_KEYS = ["schema", "opplugin_version", "device", "model", "batch"]
DEVICE_KEYS = ["kind", "name", "compute_capability", "memory_bytes"]


def assert_header(payload, schema, model, batch, kind="cpu"):
    assert list(payload)[:5] == HEADER_KEYS
    assert payload["schema"] == schema and payload["opplugin_version"] == __version__
    assert list(payload["device"]) == DEVICE_KEYS and payload["device"]["kind"] == kind
    assert payload["model"] == model and payload["batch"] == batch


def test_the_header_of_a_gpu_report_names_what_is_known():
    gpu = Device("cuda", "NVIDIA H200", "9.0", 150_000_000_000)
    head = jsonout.header("opplugin-x/1", gpu, "lenet86", 100)
    assert_header(head, "opplugin-x/1", "lenet86", 100, kind="cuda")
    assert head["device"] == {"kind": "cuda", "name": "NVIDIA H200", "compute_capability": "9.0", "memory_bytes": 150_000_000_000}


def test_the_cpu_has_no_compute_capability_and_the_host_memory():
    record = jsonout.device_record(CPU)
    assert record["name"] == "cpu" and record["compute_capability"] is None
    assert record["memory_bytes"] is None or record["memory_bytes"] > 1 << 20


def test_unknown_gpu_memory_is_null_not_absent():
    assert jsonout.device_record(Device("cuda", "GPU", "8.0"))["memory_bytes"] is None


def test_dumps_writes_strict_json_with_non_finite_floats_as_null():
    text = jsonout.dumps({"a": math.nan, "b": [np.float32(1.5), math.inf], "c": (1, 2), "d": None})
    assert text.endswith("\n")
    assert json.loads(text) == {"a": None, "b": [1.5, None], "c": [1, 2], "d": None}


def test_run_json_has_the_header_and_nulls_for_what_it_did_not_measure(tiny_model_path, tmp_path):
    path = tmp_path / "r.json"
    assert main(["run", tiny_model_path, "--batch", "3", "--data", "random", "--device", "cpu", "--repeat", "1",
                 "--no-compare", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert_header(data, "opplugin-run/8", "tiny", 3)
    # no labels (random data) and no comparison: present, and null
    assert "accuracy" in data and data["accuracy"] is None
    assert "agreement" in data and data["agreement"] is None
    assert "budget" in data and data["budget"] is None  # --precision mixed's alone
    assert data["data"].startswith("random")


def test_check_json_has_the_header_and_every_record_key(tiny_model_path, tmp_path):
    from opplugin.verify.check import CHECK_RECORD_KEYS

    path = tmp_path / "c.json"
    assert main(["check", tiny_model_path, "--batch", "3", "--data", "random", "--device", "cpu", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert_header(data, "opplugin-check/1", "tiny", 3)
    assert data["passed"] is True and data["atol"] == pytest.approx(1e-4)
    assert data["records"] and all(list(r)[:len(CHECK_RECORD_KEYS)] == list(CHECK_RECORD_KEYS) for r in data["records"])
    assert all(r["error"] is None for r in data["records"])
    # random inputs: no labels, so no accuracy, but the key is there
    assert data["accuracy"] is None and data["reference_accuracy"] is None and "top1_agreement" in data


def test_a_record_that_could_not_be_compared_has_null_figures():
    from opplugin.verify.check import CheckResult, build_check_report
    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    plan = Runner(load_model("lenet86"), 2, "cpu").plan_record(2)
    result = CheckResult(records=[{"tensor": "t", "step": "s", "implementation": "i", "passed": False, "error": "shape differs"}])
    record = build_check_report(result, plan, 1e-4, 1e-3)["records"][0]
    assert record["error"] == "shape differs" and record["max_abs_error"] is None and record["elements"] is None
