#!/usr/bin/env bash
# The GPU verification of a change, in one go: the GPU test suite (SKIP_TESTS=1 leaves
# it out; GPU_TESTS="tests/test_a_gpu.py ..." runs those files alone), `opplugin check` on the three shipped models, `opplugin run` at batch 100, 1000
# and 10000, lenet86 on 100,000 random images, and with BENCH=1 `opplugin bench`
# (bench.json, bench.txt). Run it from anywhere on a machine with a CUDA GPU; logs and
# JSON go to $RESULTS (default: a new folder under $TMPDIR, never the checkout). Exits 2
# without a GPU, before doing anything; else non-zero if any step failed, after running them all.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ! python3 -c 'import cupy, sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)' 2>/dev/null; then
    echo "gpu_verify.sh: needs a CUDA GPU and CuPy (pip install -e \".[cuda13,dev]\"); none here" >&2
    exit 2
fi
out=${RESULTS:-$(mktemp -d "${TMPDIR:-/tmp}/opplugin-gpu-verify.XXXXXX")}
mkdir -p "$out"
echo "== results in $out"
failed=0
step() { local log=$1; shift; echo "== $*"; "$@" 2>&1 | tee "$out/$log" || failed=1; }

python3 -c 'import onnxruntime as o, cupy; print("onnxruntime", o.__version__, o.get_available_providers()); print("cupy", cupy.__version__)'
# The suite is mostly NVRTC compiles, which are CPU-bound: spread it over workers where pytest-xdist is installed.
workers=()
python3 -c 'import xdist' 2>/dev/null && workers=(-n "${GPU_TEST_WORKERS:-14}")
# shellcheck disable=SC2086  # GPU_TESTS is a list of paths
[ -n "${SKIP_TESTS:-}" ] || step gpu-tests.log python3 -m pytest -m gpu -q -p no:cacheprovider --durations=25 "${workers[@]}" ${GPU_TESTS:-}
for model in lenet86 ece408_high mlp_onehidden; do
    step "check-$model.log" python3 -m opplugin check "$model" --batch 10000 --json "$out/check-$model.json"
    for batch in 100 1000 10000; do
        step "run-$model-$batch.log" python3 -m opplugin run "$model" --batch "$batch" --json "$out/run-$model-$batch.json"
    done
done
# issue 4's throughput target: 100,000 images at (close to) the rate of 10,000
step run-lenet86-100000.log python3 -m opplugin run lenet86 --batch 100000 --data random --json "$out/run-lenet86-100000.json"
if [ -n "${BENCH:-}" ]; then
    echo "== opplugin bench"
    python3 -m opplugin bench --json "$out/bench.json" > "$out/bench.txt" 2> "$out/bench.log" || failed=1
    tail -5 "$out/bench.log"
fi
exit $failed
