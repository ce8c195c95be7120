"""The argument groups: each reads its flags back with every value checked, and a command
that takes a group only in part still reads it whole."""
import argparse
from functools import partial

import pytest

from opplugin.cli import check, plan, run, tune
from opplugin.cli.commands import build_parser
from opplugin.cli.options import (DataOptions, KernelOptions, ModelOptions, ReportOptions, RunnerOptions, TimingOptions,
                                  ToleranceOptions)
from opplugin.errors import InputError
from opplugin.verify.check import DEFAULT_ATOL, DEFAULT_RTOL


def parsed(argv: list[str], *adds) -> argparse.Namespace:
    """`argv` parsed by a parser of the groups `adds` add."""
    parser = argparse.ArgumentParser()
    for add in adds:
        add(parser)
    return parser.parse_args(argv)


def refused(message: str, read, *argv: str, adds=()) -> None:
    with pytest.raises(InputError, match=message):
        read(parsed(list(argv), *adds))


def test_the_model_group():
    add = partial(ModelOptions.add, batch_help="images")
    assert ModelOptions.from_args(parsed([], add)) == ModelOptions()
    model = ModelOptions.from_args(parsed(["m.onnx", "--batch", "4", "--input-shape", "x:Nx3x8x8"], add))
    assert (model.model, model.batch, model.input_shapes) == ("m.onnx", 4, {"x": [None, 3, 8, 8]})
    refused("--batch must be a positive integer, got 0", ModelOptions.from_args, "--batch", "0", adds=[add])
    refused("--input-shape takes NAME:DIMS", ModelOptions.from_args, "--input-shape", "8x8", adds=[add])
    without = partial(ModelOptions.add, batch_help="images", input_shape=False)
    assert ModelOptions.from_args(parsed([], without)).input_shapes == {}


def test_the_runner_group():
    add = partial(RunnerOptions.add, devices=True)
    runner = RunnerOptions.from_args(parsed(["--variant", "const", "--chunk", "8", "--streams", "2", "--no-cuda-graphs"], add))
    assert runner == RunnerOptions("auto", "const", 8, 2, False, None) and runner.variants == {"Conv": "const"}
    assert RunnerOptions.from_args(parsed([], add)).cuda_graphs is None and RunnerOptions().variants is None
    refused("--chunk must be a positive integer, got 0", RunnerOptions.from_args, "--chunk", "0", adds=[add])
    refused("--streams must be a positive integer, got -1", RunnerOptions.from_args, "--streams", "-1", adds=[add])
    refused("--devices splits the batch over CUDA devices; leave out --device cpu", RunnerOptions.from_args,
            "--devices", "0,1", "--device", "cpu", adds=[add])
    assert RunnerOptions.from_args(parsed([], RunnerOptions.add)).devices is None
    plan = partial(RunnerOptions.add, runs=False)  # plan: nothing of how a run runs
    assert RunnerOptions.from_args(parsed(["--variant", "const"], plan)) == RunnerOptions(variant="const")
    for flag in (["--chunk", "2"], ["--streams", "2"], ["--cuda-graphs"], ["--devices", "all"]):
        with pytest.raises(SystemExit):
            parsed(flag, plan)


@pytest.mark.parametrize("argv, message", [
    (["--load-inputs", "a.npz", "--images", "photos"], "--load-inputs and --images both say where the inputs come from; give one"),
    (["--images", "photos", "--data", "random"], "--images and --data random both say where"),
    (["--resize", "8,8", "--mean", "0.5"], "--resize, --mean apply to --images FOLDER"),
    (["--keep", "conv1_out"], "--keep names tensors for --save-outputs FILE.npz; give that file too"),
    (["--images", "photos", "--resize", "8"], "--resize takes H,W"),
])
def test_the_data_group_refuses_flags_that_cannot_go_together(argv, message):
    refused(message, DataOptions.from_args, *argv, adds=[DataOptions.add])


def test_the_data_group():
    data = DataOptions.from_args(parsed(["--images", "photos", "--resize", "8,8", "--std", "2", "--save-outputs", "o.npz",
                                         "--keep", "a", "--keep", "b"], DataOptions.add))
    assert data.keep == ("a", "b") and data.outputs() == (("--save-outputs", "o.npz"),)
    assert (data.image_options().folder, data.image_options().resize, data.image_options().std) == ("photos", "8,8", "2")
    assert DataOptions.from_args(parsed(["--data", "random", "--seed", "-3"], DataOptions.add)) == DataOptions("random", -3)


def test_the_data_group_on_plan_takes_what_changes_a_plan():
    for_plan = partial(DataOptions.add, runs=False)
    data = DataOptions.from_args(parsed(["--images", "photos", "--resize", "8,8", "--keep", "a"], for_plan), runs=False)
    assert data == DataOptions(images="photos", resize="8,8", keep=("a",))  # --keep needs no --save-outputs there
    for flag in (["--data", "random"], ["--seed", "1"], ["--mean", "0.5"], ["--std", "2"], ["--save-outputs", "o.npz"]):
        with pytest.raises(SystemExit):
            parsed(flag, for_plan)


def test_the_timing_group_checks_repeat_first_and_fills_defaults():
    add = partial(TimingOptions.add, warmup_help="w", repeat_help="r")
    refused("--repeat must be a positive integer, got 0", TimingOptions.from_args, "--repeat", "0", "--warmup", "-1", adds=[add])
    refused("--warmup must be a non-negative integer, got -1", TimingOptions.from_args, "--warmup", "-1", adds=[add])
    assert TimingOptions.from_args(parsed(["--warmup", "0"], add)).or_defaults(2, 5) == (0, 5)


@pytest.mark.parametrize("argv, message", [
    (["--atol", "-1"], "--atol must be a finite number of at least 0, got -1"),
    (["--rtol", "nan"], "--rtol must be a finite number of at least 0, got nan"),
    (["--atol", "inf"], "--atol must be a finite number of at least 0, got inf"),
    (["--check-chunk", "0"], "--check-chunk must be a positive integer, got 0"),
])
def test_the_tolerance_group_refuses_what_cannot_be_a_tolerance(argv, message):
    refused(message, ToleranceOptions.from_args, *argv, adds=[ToleranceOptions.add])


def test_the_tolerance_group_defaults_to_checks():
    assert ToleranceOptions.from_args(parsed([], ToleranceOptions.add)) == ToleranceOptions(DEFAULT_ATOL, DEFAULT_RTOL, None)
    on_run = partial(ToleranceOptions.add, chunks=False)  # run compares its output alone
    assert ToleranceOptions.from_args(parsed(["--atol", "0"], on_run)) == ToleranceOptions(0.0, DEFAULT_RTOL, None)
    with pytest.raises(SystemExit):
        parsed(["--check-chunk", "2"], on_run)


def test_the_report_group_lists_its_outputs_in_order():
    add = partial(ReportOptions.add, json_help="json", wide=True, csv_and_trace=True)
    reports = ReportOptions.from_args(parsed(["--trace", "t.json", "--json", "-", "--wide"], add))
    assert reports.wide and reports.outputs() == (("--json", "-"), ("--trace", "t.json"))
    assert ReportOptions.from_args(parsed([], partial(ReportOptions.add, json_help="json"))) == ReportOptions()


def test_the_kernel_group():
    add = partial(KernelOptions.add, loops=True)
    kernels = KernelOptions.from_args(parsed(["--kernel", "conv=a.cu", "--watch"], add))
    assert kernels.by_op == {"Conv": "a.cu"} and kernels.paths == ("a.cu",) and kernels.watch and not kernels.sanitize
    refused("--kernel names Conv twice", KernelOptions.from_args, "--kernel", "Conv=a.cu", "--kernel", "Conv=b.cu", adds=[add])
    refused("--kernel takes OP=FILE.cu", KernelOptions.from_args, "--kernel", "a.cu", adds=[add])
    several = parsed(["--kernel", "Conv=a.cu", "--kernel", "Conv=b.cu"], KernelOptions.add)
    assert KernelOptions.from_args(several, one_per_op=False).paths == ("a.cu", "b.cu")


def options(*argv: str):
    args = build_parser().parse_args(list(argv))
    return {"run": run, "check": check, "plan": plan, "tune": tune}[args.command].read(args)


@pytest.mark.parametrize("argv, message", [
    (["run", "--devices", "0,1", "--trace", "t.json", "--kernel", "Conv=a.cu", "--sanitize"],
     "--trace and --sanitize follow a single device; leave out --devices"),
    (["check", "--devices", "all", "--kernel", "Conv=a.cu", "--watch"], "--watch follows a single device; leave out --devices"),
    (["run", "--sanitize"], "--sanitize and --watch need --kernel OP=FILE.cu or --ops FILE.py"),
    (["check", "--watch"], "--sanitize and --watch need --kernel OP=FILE.cu or --ops FILE.py"),
])
def test_flags_that_follow_one_device_or_a_users_kernel_are_refused_without_them(argv, message):
    with pytest.raises(InputError, match=message):
        options(*argv)


def test_each_command_says_which_files_it_reads_and_writes():
    run = options("run", "m.onnx", "--json", "r.json", "--csv", "-", "--kernel", "Conv=k.cu", "--load-inputs", "in.npz",
                  "--save-outputs", "out.npz").files()
    assert run.outputs == (("--json", "r.json"), ("--csv", "-"), ("--save-outputs", "out.npz"))
    assert (run.models, run.kernels, run.load_inputs, run.images) == (("m.onnx",), ("k.cu",), "in.npz", None)
    assert options("check", "--images", "photos").files().images == "photos"
    plan = options("plan", "--json", "p.json").files()
    assert plan.outputs == (("--json", "p.json"),) and plan.models == ("lenet86",)
    assert options("tune", "--kernel", "Conv=k.cu").files().kernels == ("k.cu",)


def test_commands_take_their_groups_as_before():
    run = options("run", "--warmup", "1", "--no-compare", "--batch", "3")
    assert run.timing == TimingOptions(1, None) and not run.compare and run.workload.model.batch == 3
    check = options("check", "--atol", "0", "--check-chunk", "7")
    assert check.tolerance == ToleranceOptions(0.0, DEFAULT_RTOL, 7) and check.workload.data == DataOptions()
    plan = options("plan", "--load-inputs", "in.npz", "--keep", "conv1_out", "--variant", "const")
    assert plan.data.keep == ("conv1_out",) and plan.runner.variant == "const" and plan.runner.streams is None
    assert plan.files().load_inputs == "in.npz"
    run = options("run", "--atol", "0", "--rtol", "1e-6")
    assert run.tolerance == ToleranceOptions(0.0, 1e-6, None)
    tune = options("tune", "--device", "cuda")
    assert tune.device == "cuda" and tune.model.input_shapes == {}


def test_variant_takes_a_conv_variant_or_op_pairs_and_refuses_an_op_twice():
    from opplugin.cli.options import parse_variants

    assert parse_variants(["const", "example.ops::Swish=cupy"]) == {"Conv": "const", "example.ops::Swish": "cupy"}
    assert parse_variants(["example.ops::Swish=triton:k:BLOCK=256,w2,s3"]) == {"example.ops::Swish": "triton:k:BLOCK=256,w2,s3"}
    with pytest.raises(InputError, match="names Conv twice"):
        parse_variants(["const", "Conv=tiled"])
    with pytest.raises(InputError, match="give VARIANT"):
        parse_variants(["example.ops::Swish="])


def test_the_report_group_takes_report_only_where_a_command_offers_it():
    add = partial(ReportOptions.add, json_help="json", html_help="html")
    assert ReportOptions.from_args(parsed(["--report", "r.html", "--json", "-"], add)).outputs() == (("--json", "-"), ("--report", "r.html"))
    assert ReportOptions.from_args(parsed([], partial(ReportOptions.add, json_help="json"))).html is None
    assert build_parser().parse_args(["check", "--report", "c.html"]).html == "c.html"
    with pytest.raises(SystemExit):  # plan has no HTML report (yet)
        build_parser().parse_args(["plan", "--report", "p.html"])
