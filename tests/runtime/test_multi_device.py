"""One batch split over several runners (runtime/multi_device.py, `--devices`), on the CPU:
several "cpu" runners stand for the devices. The outputs come back in input order, bit
for bit those of one runner on the whole batch; a failing device is named and nothing is
written; the report has a row per device."""
import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_builders import save, tiny_cnn
from opplugin.cli import workload
from opplugin.gpu import cuda
from opplugin.cli import main
from opplugin.inputs.feeds import make_inputs
from opplugin.errors import DeviceError, InputError
from opplugin.graph.model import load_model
from opplugin.core.row_ranges import split_even
from opplugin.runtime import Runner
from opplugin.runtime.feeding import MIN_PROBE_SHARE, PROBE_WARMUP, Feeding, fed_count
from opplugin.runtime.multi_device import DeviceFailure, DeviceRunners, DeviceSlot, cuda_slots

CPU = DeviceSlot()


def _on_cpus(model, batch: int, count: int, **options) -> DeviceRunners:
    return DeviceRunners(model, [CPU] * count, lambda slot, share: Runner(model, share, slot.device(), **options), batch)


def _random(model, batch: int, seed: int = 3) -> dict[str, np.ndarray]:
    return make_inputs(model, batch, "random", seed, pinned=False).feeds


def _two_outputs(tmp_path) -> str:
    """The tiny CNN with its first pooled maps as a second graph output."""
    proto = tiny_cnn(seed=2)
    proto.graph.output.append(helper.make_tensor_value_info("p1", TensorProto.FLOAT, ["N", 4, 6, 6]))
    return save(proto, tmp_path / "two_outputs.onnx")


def test_even_split_keeps_order_and_sizes_within_one():
    assert split_even(10, 4) == [slice(0, 3), slice(3, 6), slice(6, 8), slice(8, 10)]
    assert split_even(8, 2) == [slice(0, 4), slice(4, 8)]
    assert split_even(2, 3) == [slice(0, 1), slice(1, 2)]  # fewer rows than parts: fewer ranges


def test_lenet86_split_over_three_runners_equals_one_runner_bit_for_bit():
    model = load_model("lenet86")
    feeds = _random(model, 101)  # 34 + 34 + 33: not divisible
    whole = Runner(model, 101, "cpu").run(feeds)
    devices = _on_cpus(model, 101, 3)
    seen = []
    split = devices.run(feeds, progress=lambda label, done, total: seen.append((done, total)))
    assert [rows for rows in split.rows] == [slice(0, 34), slice(34, 68), slice(68, 101)]
    assert [runner.batch for runner in devices.runners] == [34, 34, 34]  # each built for its share
    for name, expected in whole.outputs.items():
        assert split.outputs[name].shape == expected.shape
        assert np.array_equal(split.outputs[name], expected)
    assert seen[-1] == (101, 101) and all(total == 101 for _, total in seen)
    # every runner wrote its rows into the one array handed back: its own outputs are views of it
    assert all(np.shares_memory(result.outputs["probabilities"], split.outputs["probabilities"]) for result in split.results)
    assert all(0 <= began <= ended <= split.total_ms for began, ended in split.spans_ms)


def test_two_outputs_and_kept_tensors_come_back_in_input_order(tmp_path):
    model = load_model(_two_outputs(tmp_path))
    feeds = _random(model, 7)
    keep = ("x", "r2")  # the graph input, and the tensor conv2's step hands on
    whole = Runner(model, 7, "cpu").run(feeds, keep)
    split = _on_cpus(model, 7, 3).run(feeds, keep)  # 3 + 2 + 2
    assert set(split.outputs) == {"y", "p1"}
    for name in ("y", "p1"):
        assert np.array_equal(split.outputs[name], whole.outputs[name])
    for name in keep:
        assert np.array_equal(split.kept[name], whole.kept[name])
    assert np.array_equal(split.kept["x"], feeds["x"])


def test_a_batch_smaller_than_the_devices_leaves_some_idle(tiny_model_path):
    model = load_model(tiny_model_path)
    feeds = _random(model, 2)
    devices = _on_cpus(model, 2, 3)
    profile = devices.profile(feeds, warmup=0, repeat=2)
    assert profile.images == [1, 1, 0] and profile.profiles[2] is None and len(profile.total_ms) == 2
    assert np.array_equal(profile.last.outputs["y"], Runner(model, 2, "cpu").run(feeds).outputs["y"])
    rows = profile.rows()
    assert [row["device"] for row in rows] == ["cpu #1", "cpu #2", "cpu #3"]
    assert rows[2] == {"device": "cpu #3", "images": 0, "time_ms": 0.0, "images_per_s": None}
    assert rows[0]["images_per_s"] > 0


# --- the feed probe: how many of the runners a run uses -------------------------------------


def _used(images: list[int]) -> int:
    """The runners that got rows: the first ones, the rest idle."""
    used = sum(1 for count in images if count)
    assert all(images[:used]) and not any(images[used:])
    return used


def test_the_probe_times_each_count_on_the_shares_of_a_split_over_all(tiny_model_path):
    model = load_model(tiny_model_path)
    batch = 3 * MIN_PROBE_SHARE + 1  # shares of 257, 256 and 256 rows
    devices = _on_cpus(model, batch, 3)
    feeding = devices.probe_feeding(_random(model, batch))
    assert feeding.given == 3 and feeding.skipped is None
    assert feeding.images == (257, 513, batch)  # the first 1, 2, 3 shares
    assert len(feeding.times_ms) == 3 and all(ms > 0 for ms in feeding.times_ms)
    assert feeding.used == fed_count(feeding.rates)
    assert devices.used == 3  # measuring changes nothing: profile (or use) applies the choice


def test_a_probed_profile_runs_on_the_count_chosen_and_gives_one_runners_outputs(tiny_model_path):
    model = load_model(tiny_model_path)
    batch = 2 * MIN_PROBE_SHARE + 5
    feeds = _random(model, batch)
    seen = []
    measured = _on_cpus(model, batch, 2).profile(feeds, warmup=0, repeat=2, keep=("r2",),
                                                  progress=lambda label, done, total: seen.append((label, done, total)))
    feeding = measured.feeding
    assert feeding.skipped is None and len(feeding.images) == 2 and 1 <= feeding.used <= 2
    used = _used(measured.images)
    assert used == feeding.used and measured.images[:used] == [r.stop - r.start for r in split_even(batch, used)]
    assert [profile is None for profile in measured.profiles] == [index >= used for index in range(2)]
    whole = Runner(model, batch, "cpu").run(feeds, ("r2",))
    assert np.array_equal(measured.last.outputs["y"], whole.outputs["y"])
    assert np.array_equal(measured.last.kept["r2"], whole.kept["r2"])
    # the probe's own warm-up (PROBE_WARMUP passes) though --warmup is 0, then the probe, then the timed passes
    labels = list(dict.fromkeys(label for label, _, _ in seen))
    assert labels == ["warm-up", "feed probe", "timed run"]
    assert seen[-1][1] == seen[-1][2] == (PROBE_WARMUP + 2) * batch + sum(feeding.images)
    assert all(later[1] >= earlier[1] for earlier, later in zip(seen, seen[1:]))


def test_use_splits_later_runs_over_the_first_runners(tiny_model_path):
    model = load_model(tiny_model_path)
    feeds = _random(model, 10)
    devices = _on_cpus(model, 10, 3)
    devices.use(2)
    split = devices.run(feeds)
    assert split.rows == [slice(0, 5), slice(5, 10), None] and split.results[2] is None
    assert np.array_equal(split.outputs["y"], Runner(model, 10, "cpu").run(feeds).outputs["y"])
    with pytest.raises(InputError, match=r"^use 4 of 3 runners: give 1 to 3$"):
        devices.use(4)


@pytest.mark.parametrize("batch, asked, why", [(2 * MIN_PROBE_SHARE, False, "asked to use every device given"),
                                                (2 * MIN_PROBE_SHARE - 1, True, f"the batch gives each device under {MIN_PROBE_SHARE} images")])
def test_an_unprobed_profile_uses_every_runner_and_says_why(tiny_model_path, batch, asked, why):
    model = load_model(tiny_model_path)
    measured = _on_cpus(model, batch, 2).profile(_random(model, batch), warmup=0, repeat=1, feed_probe=asked)
    assert measured.feeding == Feeding(2, 2, skipped=why)
    assert _used(measured.images) == 2


def test_the_probe_needs_a_row_for_each_runner(tiny_model_path):
    model = load_model(tiny_model_path)
    with pytest.raises(InputError, match=r"^the feed probe needs a row for each of the 3 runners; the batch has 2$"):
        _on_cpus(model, 2, 3).probe_feeding(_random(model, 2))


class _Broken(Runner):
    def __init__(self, error: BaseException, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.error = error

    def run(self, feeds, keep=(), progress=None, **options):
        raise self.error


def _second_of_three_fails(model, error):
    built = []

    def make(slot, share):
        built.append(slot)
        return (_Broken(error, model, share, "cpu") if len(built) == 2 else Runner(model, share, "cpu"))

    return DeviceRunners(model, [CPU] * 3, make, 9)


def test_a_failing_runner_fails_the_run_naming_its_device(tiny_model_path):
    model = load_model(tiny_model_path)
    with pytest.raises(DeviceFailure) as caught:
        _second_of_three_fails(model, DeviceError("lost the device")).run(_random(model, 9))
    assert str(caught.value) == "on cpu #2 (runner 2 of 3): lost the device"


def test_an_error_that_is_not_opplugins_keeps_its_type_and_names_the_device(tiny_model_path):
    """A bug stays a bug (the CLI's internal error, with its traceback), as on one device."""
    model = load_model(tiny_model_path)
    with pytest.raises(RuntimeError, match="illegal address") as caught:
        _second_of_three_fails(model, RuntimeError("CUDA error: illegal address")).run(_random(model, 9))
    assert caught.value.__notes__ == ["opplugin: on cpu #2 (runner 2 of 3)"]


def test_a_model_that_cannot_be_cut_into_rows_is_refused(tmp_path):
    proto = tiny_cnn()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4  # a fixed batch
    model = load_model(save(proto, tmp_path / "fixed.onnx"))
    with pytest.raises(InputError, match="^--devices cuts the batch into rows, one share per device, and this model cannot be "
                                         "cut: input 'x' has a fixed batch of 4$"):
        _on_cpus(model, 4, 2)


# --- the command line --------------------------------------------------------------------


@pytest.fixture
def two_cpus(monkeypatch):
    """--devices on this machine gives two CPU runners, as two GPUs would give two CUDA ones."""
    monkeypatch.setattr(workload, "device_slots", lambda runner: [CPU, CPU] if runner.devices else None)


def test_run_with_devices_reports_a_row_per_device_and_saves_outputs_in_order(two_cpus, tmp_path, capsys):
    files = {name: str(tmp_path / name) for name in ("split.json", "split.npz", "whole.npz")}
    assert main(["run", "lenet86", "--batch", "9", "--device", "auto", "--devices", "0,1", "--json", files["split.json"],
                 "--save-outputs", files["split.npz"], "--keep", "pool1_out"]) == 0
    out = capsys.readouterr().out
    assert "Steps total:" in out and "on cpu #1 for its 5 images" in out
    assert "cpu #1" in out and "cpu #2" in out and "All 2 devices: 9 images in" in out
    report = json.loads(open(files["split.json"]).read())
    assert report["batch"] == 9 and report["images_per_s"] > 0
    assert [(row["device"], row["images"]) for row in report["devices"]] == [("cpu #1", 5), ("cpu #2", 4)]
    assert set(report["devices"][0]) == {"device", "images", "time_ms", "images_per_s"}
    assert report["steps_device"] == {"device": "cpu #1", "images": 5}
    assert report["feeding"]["why_not_probed"] == f"the batch gives each device under {MIN_PROBE_SHARE} images"
    assert report["feeding"]["used"] == ["cpu #1", "cpu #2"] and report["feeding"]["probe"] == []
    assert main(["run", "lenet86", "--batch", "9", "--device", "cpu", "--save-outputs", files["whole.npz"],
                 "--keep", "pool1_out"]) == 0
    split, whole = np.load(files["split.npz"]), np.load(files["whole.npz"])
    assert sorted(split.files) == sorted(whole.files) == ["pool1_out", "probabilities"]
    for name in whole.files:
        assert np.array_equal(split[name], whole[name])


def test_run_with_devices_says_how_many_the_host_fed_and_gives_one_runners_outputs(two_cpus, tiny_model_path, tmp_path, capsys):
    """A batch large enough to probe: a pass on one "cpu" runner, then on both, and the timed passes on
    the count that measured fastest (whichever it is here: the figures are this machine's)."""
    batch = 2 * MIN_PROBE_SHARE + 3
    common = ["run", str(tiny_model_path), "--batch", str(batch), "--data", "random"]
    assert main([*common, "--devices", "0,1", "--json", str(tmp_path / "r.json"), "--save-outputs", str(tmp_path / "split.npz")]) == 0
    out = capsys.readouterr().out
    feeding = json.loads((tmp_path / "r.json").read_text())["feeding"]
    assert feeding["probed"] is True and feeding["why_not_probed"] is None and feeding["given"] == ["cpu #1", "cpu #2"]
    assert [(row["devices"], row["images"]) for row in feeding["probe"]] == [(1, MIN_PROBE_SHARE + 2), (2, batch)]
    assert all(row["images_per_s"] > 0 for row in feeding["probe"])
    used = fed_count([row["images_per_s"] for row in feeding["probe"]])
    assert feeding["used"] == ["cpu #1", "cpu #2"][:used] and feeding["idle"] == ["cpu #1", "cpu #2"][used:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert [row["images"] for row in report["devices"]] == ([batch, 0] if used == 1 else [MIN_PROBE_SHARE + 2, MIN_PROBE_SHARE + 1])
    line = next(line for line in out.splitlines() if line.startswith("Feed probe: the host fed "))
    assert ("1 of the 2 devices" in line and line.endswith("; cpu #2 left idle")) if used == 1 else "all 2 devices" in line
    assert main([*common, "--device", "cpu", "--save-outputs", str(tmp_path / "whole.npz")]) == 0
    assert np.array_equal(np.load(tmp_path / "split.npz")["y"], np.load(tmp_path / "whole.npz")["y"])


def test_no_feed_probe_uses_every_device_named(two_cpus, tiny_model_path, tmp_path, capsys):
    batch = 2 * MIN_PROBE_SHARE
    assert main(["run", str(tiny_model_path), "--batch", str(batch), "--data", "random", "--devices", "0,1", "--no-feed-probe",
                 "--json", str(tmp_path / "r.json")]) == 0
    assert "Feed probe: none (asked to use every device given); all 2 devices used" in capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["feeding"]["probed"] is False and report["feeding"]["idle"] == []
    assert [row["images"] for row in report["devices"]] == [MIN_PROBE_SHARE, MIN_PROBE_SHARE]


def test_without_devices_the_report_has_no_device_rows(tmp_path, capsys):
    assert main(["run", "lenet86", "--batch", "4", "--device", "cpu", "--json", str(tmp_path / "r.json")]) == 0
    assert "Host to host:" in capsys.readouterr().out
    assert "devices" not in json.loads((tmp_path / "r.json").read_text())


def test_check_with_devices_compares_every_piece_and_reports_the_devices(two_cpus, tmp_path, capsys):
    path = tmp_path / "c.json"
    assert main(["check", "lenet86", "--batch", "11", "--devices", "all", "--check-chunk", "5", "--json", str(path),
                 "--save-outputs", str(tmp_path / "c.npz")]) == 0
    out = capsys.readouterr().out
    assert "split over cpu #1, cpu #2" in out and "PASS" in out and "All 2 devices: 11 images" in out
    report = json.loads(path.read_text())
    assert report["passed"] is True and report["images_per_s"] > 0
    # three passes of 5, 5 and 1 images, each split over the two runners: 3 + 3 + 1 and 2 + 2
    assert [(row["device"], row["images"]) for row in report["devices"]] == [("cpu #1", 7), ("cpu #2", 4)]
    whole = Runner(load_model("lenet86"), 11, "cpu").run(make_inputs(load_model("lenet86"), 11, "auto", 0, pinned=False).feeds)
    assert np.array_equal(np.load(tmp_path / "c.npz")["probabilities"], whole.outputs["probabilities"])


@pytest.mark.parametrize("extra", [["run", "--json", "r.json", "--csv", "r.csv", "--save-outputs", "o.npz"],
                                   ["check", "--json", "r.json", "--save-outputs", "o.npz"]])
def test_a_failing_device_exits_2_naming_it_and_writes_nothing(two_cpus, monkeypatch, tmp_path, capsys, extra):
    plain_run = Runner.run

    def second_fails(self, feeds, keep=(), progress=None, **options):
        if next(iter(feeds.values())).shape[0] == 3:  # batch 7: the second runner's 3 rows
            raise DeviceError("CUDA error: an illegal memory access was encountered")
        return plain_run(self, feeds, keep, progress, **options)

    monkeypatch.setattr(Runner, "run", second_fails)
    monkeypatch.chdir(tmp_path)
    assert main([extra[0], "lenet86", "--batch", "7", "--devices", "0,1", *extra[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "opplugin: error: on cpu #2 (runner 2 of 2): CUDA error: an illegal memory access was encountered"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_devices_without_a_cuda_device_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cuda, "device_count", lambda: 0)
    assert main(["run", "lenet86", "--batch", "2", "--devices", "all"]) == 2
    assert capsys.readouterr().err.strip() == ("opplugin: error: --devices needs a CUDA device; "
                                               "here plugin steps run the numpy reference on the CPU")


@pytest.fixture
def one_gpu(monkeypatch):
    """CuPy seeing one CUDA device (the ids are checked before any of it is used)."""
    monkeypatch.setattr(cuda, "device_count", lambda: 1)


def test_device_ids_are_read_and_checked(one_gpu):
    assert cuda_slots("all") == [DeviceSlot(0)]
    assert cuda_slots("0,0") == [DeviceSlot(0), DeviceSlot(0)]
    assert [slot.label for slot in cuda_slots("0, 0")] == ["cuda:0", "cuda:0"]


@pytest.mark.parametrize("argv, message", [
    (["run", "--devices", "0,3"], "--devices 0,3: no CUDA device 3; this machine has 1 (ids 0 to 0)"),
    (["check", "--devices", "zero"], "--devices zero: give all, or device ids such as 0,1"),
    (["run", "--devices", "0,-1"], "--devices 0,-1: give all, or device ids such as 0,1"),
    (["run", "--devices", "0", "--device", "cpu"], "--devices splits the batch over CUDA devices; leave out --device cpu"),
    (["run", "--devices", "0", "--trace", "t.json"], "--trace follows a single device; leave out --devices"),
    (["run", "--no-feed-probe"], "--no-feed-probe applies to --devices; give --devices too, or leave it out"),
])
def test_bad_device_requests_are_one_line_errors(one_gpu, argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"opplugin: error: {message}"
    assert list(tmp_path.iterdir()) == []
