"""On the GPU: `--devices 0,0` (two runners on one GPU, each with its own streams) gives
lenet86's outputs bit for bit as one runner does, in input order, from pinned inputs;
the report has a row per runner; check passes split the same way."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opplugin.gpu import cuda
from opplugin.cli import main
from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.runtime import Runner
from opplugin.runtime.multi_device import DeviceRunners, DeviceSlot, cuda_slots

pytestmark = pytest.mark.gpu

# Both sides run chunks of this many images, so they choose the same kernels and the
# comparison can be exact: any difference is a row put back in the wrong place.
CHUNK = 1000


def test_two_runners_on_one_gpu_equal_one_runner_bit_for_bit():
    model = load_model("lenet86")
    batch = 10_001  # not divisible: 5,001 and 5,000 rows
    feeds = make_inputs(model, batch, "random", 5, pinned=True).feeds
    assert cuda.is_pinned(feeds["input"][5001:])  # a share is a view of pinned memory: copied by DMA
    whole = Runner(model, batch, "cuda", chunk=CHUNK).run(feeds)
    devices = DeviceRunners(model, cuda_slots("0,0"), lambda slot, share: Runner(model, share, slot.device(), chunk=CHUNK), batch)
    assert devices.labels == ["cuda:0 #1", "cuda:0 #2"]
    assert devices.runners[0].scheduler.lanes is not devices.runners[1].scheduler.lanes  # each its own streams
    for _ in range(2):  # the second pass replays the CUDA graphs the first captured
        split = devices.run(feeds, keep=("pool1_out",))
        assert np.array_equal(split.outputs["probabilities"], whole.outputs["probabilities"])
        assert split.kept["pool1_out"].shape[0] == batch
        assert all(result.input_pinned for result in split.results)


def test_run_devices_0_0_saves_what_a_single_device_run_saves(tmp_path, capsys):
    single, split, report = tmp_path / "single.npz", tmp_path / "split.npz", tmp_path / "r.json"
    common = ["run", "lenet86", "--data", "random", "--batch", "6000", "--chunk", str(CHUNK), "--no-compare"]
    assert main([*common, "--save-outputs", str(single)]) == 0
    # --no-feed-probe: the split as named, two runners on one GPU (a probe would likely keep one)
    assert main([*common, "--devices", "0,0", "--no-feed-probe", "--save-outputs", str(split), "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "cuda:0 #1" in out and "cuda:0 #2" in out and "All 2 devices: 6,000 images" in out
    assert np.array_equal(np.load(split)["probabilities"], np.load(single)["probabilities"])
    data = json.loads(report.read_text())
    assert [(row["device"], row["images"]) for row in data["devices"]] == [("cuda:0 #1", 3000), ("cuda:0 #2", 3000)]
    assert all(row["images_per_s"] > 0 for row in data["devices"]) and data["images_per_s"] > 0


def test_run_devices_0_0_probes_how_many_runners_the_gpu_feeds_and_saves_one_runners_outputs(tmp_path, capsys):
    single, split, report = tmp_path / "single.npz", tmp_path / "split.npz", tmp_path / "r.json"
    common = ["run", "lenet86", "--data", "random", "--batch", "6000", "--chunk", str(CHUNK), "--no-compare"]
    assert main([*common, "--save-outputs", str(single)]) == 0
    assert main([*common, "--devices", "0,0", "--save-outputs", str(split), "--json", str(report)]) == 0
    assert "Feed probe: the host fed " in capsys.readouterr().out
    feeding = json.loads(report.read_text())["feeding"]
    assert feeding["probed"] is True and [(row["devices"], row["images"]) for row in feeding["probe"]] == [(1, 3000), (2, 6000)]
    assert len(feeding["used"]) + len(feeding["idle"]) == 2
    assert np.array_equal(np.load(split)["probabilities"], np.load(single)["probabilities"])


def test_a_users_inputs_go_to_pinned_memory_and_come_back_in_order(tmp_path, capsys):
    """--load-inputs with --devices: the file's rows are copied into pinned memory once, and
    each runner's share (a view of it) goes up by DMA; the outputs are the file's order."""
    rng = np.random.default_rng(7)
    inputs, single, split, report = tmp_path / "in.npy", tmp_path / "single.npz", tmp_path / "split.npz", tmp_path / "r.json"
    np.save(inputs, rng.random((3001, 1, 86, 86), dtype=np.float32))
    common = ["run", "lenet86", "--load-inputs", str(inputs), "--chunk", str(CHUNK), "--no-compare", "--repeat", "1", "--warmup", "0"]
    assert main([*common, "--save-outputs", str(single)]) == 0
    assert main([*common, "--devices", "0,0", "--save-outputs", str(split), "--json", str(report)]) == 0
    assert "input in pinned memory" in capsys.readouterr().out
    assert json.loads(report.read_text())["input_pinned"] is True
    assert np.array_equal(np.load(split)["probabilities"], np.load(single)["probabilities"])


def test_check_devices_0_0_passes(capsys):
    assert main(["check", "lenet86", "--batch", "2000", "--devices", "0,0"]) == 0
    out = capsys.readouterr().out
    assert "split over cuda:0 #1, cuda:0 #2" in out and "PASS" in out


def test_an_unknown_device_id_is_one_line(capsys):
    count = cuda.device_count()
    assert main(["run", "lenet86", "--batch", "2", "--devices", f"0,{count}"]) == 2
    assert capsys.readouterr().err.strip() == (f"opplugin: error: --devices 0,{count}: no CUDA device {count}; "
                                               f"this machine has {count} (ids 0 to {count - 1})")


def test_all_names_every_device():
    assert cuda_slots("all") == [DeviceSlot(index) for index in range(cuda.device_count())]


@pytest.mark.skipif(cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpus_equal_one_gpu_bit_for_bit_and_each_runs_on_its_own_device():
    model = load_model("lenet86")
    batch = 20_003
    feeds = make_inputs(model, batch, "random", 6, pinned=True).feeds
    whole = Runner(model, batch, "cuda", chunk=CHUNK).run(feeds)
    devices = DeviceRunners(model, cuda_slots("0,1"), lambda slot, share: Runner(model, share, slot.device(), chunk=CHUNK), batch)
    assert devices.labels == ["cuda:0", "cuda:1"]
    # each runner's weights were uploaded inside its own device's context
    assert [{array.device.id for array in runner.constants.values()} for runner in devices.runners] == [{0}, {1}]
    split = devices.run(feeds)
    assert np.array_equal(split.outputs["probabilities"], whole.outputs["probabilities"])
