"""bench's flags read into BenchOptions, and the lab's options made from them."""
import pytest

from opplugin.cli.bench import BenchOptions, conv_options, read
from opplugin.cli.commands import build_parser
from opplugin.errors import InputError
from opplugin.graph.model import SHIPPED_MODELS


def bench_options(*argv: str) -> BenchOptions:
    return read(build_parser(["bench"]).parse_args(["bench", *argv]))


def test_bench_options_from_the_command_line():
    options = conv_options(bench_options("--batches", "100,1000", "10000", "--warmup", "1", "--repeat", "5", "--all-configs",
                                         "--models", "lenet86", "--json", "x.json"))
    assert list(options.batches) == [100, 1000, 10000] and options.warmup == 1 and options.repeat == 5
    assert options.all_configs and list(options.models) == ["lenet86"]
    defaults = conv_options(bench_options())
    assert list(defaults.batches) == [100, 1000, 10000] and defaults.warmup == 3 and defaults.repeat == 20
    assert list(defaults.models) == ["lenet86", "ece408_high"] and not defaults.all_configs
    assert defaults.cuda_graphs and not conv_options(bench_options("--no-cuda-graphs")).cuda_graphs


@pytest.mark.parametrize("argv, benchmark, batches", [
    ([], "models", (100, 1000, 10000)),
    (["--suite", "cnn"], "cnn", (1, 32)),
    (["--suite", "gemm"], "gemm", (1, 16, 10000)),
    (["--e2e", "m.onnx"], "e2e", (1, 32)),
    (["--suite", "cnn", "--e2e", "m.onnx"], "e2e", (1, 32)),  # --e2e is a benchmark of its own
    (["--scaling"], "scaling", (200_000,)),
    (["--scaling", "--batches", "9"], "scaling", (9,)),
])
def test_each_benchmark_has_its_default_batches(argv, benchmark, batches):
    options = bench_options(*argv)
    assert options.benchmark == benchmark and options.batches == batches


def test_scaling_names_its_model_and_the_e2e_peers_default_to_all():
    assert bench_options("--scaling").scaling == "lenet86" and bench_options("--scaling", "m.onnx").scaling == "m.onnx"
    assert bench_options("--e2e", "m.onnx").peers == ("pytorch_eager", "pytorch_graph", "torch_compile_graph", "onnxruntime_cuda",
                                                      "onnxruntime_cuda_graph")
    assert bench_options("--e2e", "m.onnx", "--peers", "pytorch_eager").peers == ("pytorch_eager",)


def test_e2e_runs_in_fp32_unless_precision_says_otherwise():
    assert bench_options("--e2e", "m.onnx").precision == "fp32" == bench_options().precision
    assert bench_options("--e2e", "m.onnx", "--precision", "bf16").precision == "bf16"


@pytest.mark.parametrize("argv, precision", [
    (["--suite", "cnn", "--precision", "fp16"], "fp16"),
    (["--suite", "cnn", "--precision", "bf16", "--all-configs"], "bf16"),
    (["--precision", "fp16", "--models", "lenet86"], "fp16"),  # --suite models shares the path
    (["--suite", "cnn", "--precision", "fp32"], "fp32"),
    (["--suite", "cnn"], "fp32"),
])
def test_the_conv_suites_take_fp16_and_bf16(argv, precision):
    options = bench_options(*argv)
    assert options.precision == precision and conv_options(options).precision == precision


@pytest.mark.parametrize("argv, message", [
    (["--batches", "1k"], "--batches must be positive integers, got 1k"),
    (["--repeat", "0", "--warmup", "-1"], "--repeat must be a positive integer, got 0"),
    (["--suite", "gemm", "--cuda-graphs"], "--cuda-graphs / --no-cuda-graphs applies to the Conv suites"),
    (["--plot", "s.png"], "--plot applies to bench --scaling"),
    (["--scaling", "--e2e", "m.onnx"], "--scaling and --e2e are two benchmarks; give one"),
    (["--kernel", "Conv=a.cu", "--kernel", "nonsense"], "--kernel takes OP=FILE.cu"),
    (["--suite", "gemm", "--precision", "fp32"], "^--precision applies to bench --e2e and the Conv suites "),
    (["--suite", "attention", "--precision", "fp16"], "^--precision applies to bench --e2e and the Conv suites "),
    (["--scaling", "--precision", "tf32"], "^--precision applies to bench --e2e and the Conv suites "),
    (["--suite", "cnn", "--precision", "tf32"], "^--precision tf32: the Conv suites time TF32 in every run "),
    (["--suite", "cnn", "--precision", "fp16", "--families", "tc_3xtf32"],
     "^--families does not apply with --precision fp16: the Conv suites then time only the family --precision runs each Conv in, "
     "gw_fp16, wg_fp16 or dw_fp16, beside cuDNN in FP16$"),
    (["--precision", "bf16", "--kernel", "Conv=a.cu"],
     "^--kernel does not apply with --precision bf16: the Conv suites then time only the family --precision runs each Conv in, gw_bf16, wg_bf16 or dw_bf16, "),
    (["--e2e", "m.onnx", "--precision", "fp8"], "^--precision 'fp8': one of fp32, tf32, fp16, bf16 "),
])
def test_bad_bench_flags_are_refused_as_they_are_read(argv, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        bench_options(*argv)


@pytest.mark.parametrize("argv", [["--suite", "cnn", "--precision", "tf32"], ["--suite", "gemm", "--precision", "fp16"],
                                  ["--suite", "cnn", "--precision", "bf16", "--families", "const"]])
def test_a_precision_the_benchmark_cannot_take_is_one_line_and_exit_status_2(argv, capsys):
    from opplugin.cli import main

    assert main(["bench", *argv]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("opplugin: error: --")


def test_the_conv_suites_compare_several_kernel_files():
    options = bench_options("--kernel", "Conv=a.cu", "--kernel", "conv=b.cu")
    assert options.kernels == ("a.cu", "b.cu") and list(conv_options(options).kernels) == ["a.cu", "b.cu"]


def test_the_files_bench_reads_and_writes():
    files = bench_options("--json", "b.json").files()
    assert files.outputs == (("--json", "b.json"),) and files.models == tuple(SHIPPED_MODELS)
    files = bench_options("--scaling", "m.onnx", "--plot", "s.png", "--models", "lenet86").files()
    assert files.outputs == (("--plot", "s.png"),) and files.models == ("m.onnx", "lenet86")


def test_the_report_page_is_an_output_of_bench_like_its_json():
    files = bench_options("--suite", "gemm", "--json", "b.json", "--report", "b.html").files()
    assert files.outputs == (("--json", "b.json"), ("--report", "b.html"))
    assert bench_options("--e2e", "m.onnx", "--report", "e.html").html == "e.html" and bench_options().html is None


def test_bench_report_writes_the_benchmarks_page(tmp_path, monkeypatch, capsys):
    from bench_payloads import gemm_payload
    from html_pages import ReadPage

    from opplugin.cli import main
    from opplugin.lab import gemm_bench

    monkeypatch.setattr(gemm_bench, "run_gemm_bench", lambda *args, **kwargs: gemm_payload())  # the GPU's part, made up
    page, data = tmp_path / "gemm.html", tmp_path / "gemm.json"
    # one made-up candidate is wrong (exit status 1); its page is written all the same
    assert main(["bench", "--suite", "gemm", "--report", str(page), "--json", str(data)]) == 1
    read = ReadPage(page.read_text())
    assert read.count("rect", "bar") == 4 and "Gemm layers against cuBLAS" in page.read_text() and data.is_file()
    assert "gemm.rowwarp (heuristic)" in capsys.readouterr().out  # the text table as before


def test_bench_report_and_json_cannot_be_one_file(tmp_path, capsys):
    from opplugin.cli import main

    path = str(tmp_path / "same")
    assert main(["bench", "--suite", "gemm", "--json", path, "--report", path]) == 2
    assert f"--report {path} is the same file as --json" in capsys.readouterr().err
