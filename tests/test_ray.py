"""opplugin.ray on a local Ray cluster (CPU, the reference backend): two actors score
.npy shards of the bundled test set, and their outputs equal a single-process
`opplugin run --save-outputs` bit for bit, row for row. Then the Predictor's own
errors, and the one line a missing Ray install gives."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opplugin.inputs import feeds
from opplugin.errors import InputError
from repository import ROOT


IMAGES = 300
SHARDS = 4  # .npy files, read as blocks of different sizes
MODEL = "lenet86"
# Ray Data waits, rather than fails, for resources it cannot get (as when its actors hold every CPU): past
# this the test fails instead of holding up the suite
PIPELINE_TIMEOUT_S = 180


def _images() -> np.ndarray:
    from opplugin.graph.model import load_model

    model = load_model(MODEL)
    return feeds.to_model_input(feeds.load_test_set()[0][:IMAGES], model.sample_shape())


def _single_process(images: np.ndarray, folder: Path) -> dict[str, np.ndarray]:
    """`opplugin run --load-inputs --save-outputs` on the CPU, in this process."""
    from opplugin.cli import main

    np.save(folder / "inputs.npy", images)
    saved = folder / "outputs.npz"
    status = main(["run", MODEL, "--device", "cpu", "--load-inputs", str(folder / "inputs.npy"), "--save-outputs", str(saved),
                   "--no-compare", "--warmup", "0", "--repeat", "1"])
    assert status == 0
    with np.load(saved) as outputs:
        return {name: outputs[name] for name in outputs.files}


def _within(seconds: float, work):
    """work(), or a test failure once it has run `seconds` (the cluster is then shut down, which ends it)."""
    from concurrent.futures import ThreadPoolExecutor, TimeoutError as Late

    import ray

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(work).result(timeout=seconds)
    except Late:
        ray.shutdown()
        pytest.fail(f"the Ray Data pipeline did not finish within {seconds} s")
    finally:
        pool.shutdown(wait=False)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'opplugin[ray]')")
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'opplugin[ray]')")
    # the workers import opplugin from this checkout, as this process does
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def test_two_actors_give_the_single_process_outputs_bit_for_bit(ray_cluster, tmp_path):
    import ray.data

    from opplugin.ray import Predictor

    images = _images()
    expected = _single_process(images, tmp_path)

    shards = tmp_path / "shards"
    shards.mkdir()
    for number, part in enumerate(np.array_split(images, [50, 120, 230])):  # uneven shards: 50, 70, 110, 70
        np.save(shards / f"part{number:02d}.npy", part)
    assert len(list(shards.iterdir())) == SHARDS

    options = ray.data.DataContext.get_current().execution_options
    ordered, options.preserve_order = options.preserve_order, True  # rows come back in input order
    try:
        dataset = ray.data.read_numpy(str(shards))  # one column, Ray's "data": the model's one input takes it
        # half a CPU each: the two actors leave the cluster's other CPU to the task reading the shards
        scored = dataset.map_batches(Predictor, fn_constructor_kwargs={"model": MODEL, "device": "cpu", "batch": 64},
                                     concurrency=2, num_cpus=0.5, batch_size=64, batch_format="numpy")
        batches = _within(PIPELINE_TIMEOUT_S, lambda: list(scored.iter_batches(batch_size=None, batch_format="numpy")))
    finally:
        options.preserve_order = ordered
    assert len(batches) >= IMAGES // 64  # the actors saw several batches, not the data set in one piece
    got = {name: np.concatenate([batch[name] for batch in batches]) for name in expected}

    assert set(batches[0]) == set(expected) == {"probabilities"}
    for name, want in expected.items():
        assert got[name].shape == want.shape == (IMAGES, 10)
        assert got[name].dtype == want.dtype
        assert np.array_equal(got[name], want), f"{name}: {np.count_nonzero(got[name] != want)} values differ"
    # the outputs are the model's, not a copy of the inputs: they classify the images
    labels = feeds.load_test_set()[1][:IMAGES]
    assert (got["probabilities"].argmax(axis=1) == labels).mean() > 0.8


# --- the Predictor's errors, in this process (no cluster needed, but Ray must be importable) ------------


@pytest.fixture(scope="module")
def predictor():
    pytest.importorskip("ray.data", reason="Ray is not installed (pip install 'opplugin[ray]')")
    from opplugin.ray import Predictor

    return Predictor(MODEL, device="cpu", batch=8, pass_through=["id"])


def test_a_batch_returns_the_outputs_and_the_pass_through_columns(predictor):
    images = _images()[:5]
    out = predictor({"input": images, "id": np.arange(5)})
    assert set(out) == {"probabilities", "id"}
    assert out["probabilities"].shape == (5, 10) and np.array_equal(out["id"], np.arange(5))
    empty = predictor({"input": images[:0], "id": np.arange(0)})
    assert empty["probabilities"].shape == (0, 10) and empty["probabilities"].dtype == np.float32
    # Ray's own column name, as read_numpy and from_numpy give it: the lone column feeds the one input
    lone = predictor({"data": images, "id": np.arange(5)})
    assert np.array_equal(lone["probabilities"], out["probabilities"]) and set(lone) == {"probabilities", "id"}


@pytest.mark.parametrize("batch, message", [
    ({"data": np.zeros((2, 1, 86, 86), np.float32), "extra": np.zeros((2, 1, 86, 86), np.float32), "id": np.arange(2)},
     "the batch has no column 'input' (lenet86's one input), and more than one other column could take its place: 'data', 'extra'"),
    ({"data": np.ones((2, 1, 86, 86), np.float64), "id": np.arange(2)}, "column 'data' (input 'input') is float64"),
    ({"input": np.ones((2, 1, 86, 86), np.float64), "id": np.arange(2)}, "column 'input' is float64; lenet86 takes float32"),
    ({"input": np.ones((2, 1, 28, 28), np.float32), "id": np.arange(2)}, "column 'input' has shape [2, 1, 28, 28]; lenet86 takes [N, 1, 86, 86]"),
    ({"input": np.ones((2, 1, 86, 86), np.float32)}, "the batch has no column 'id' (a pass_through column"),
    ({"input": np.ones((2, 1, 86, 86), np.float32), "id": np.arange(3)}, "column 'id' has 3 rows"),
])
def test_a_bad_batch_is_one_input_error(predictor, batch, message):
    with pytest.raises(InputError) as caught:
        predictor(batch)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_unknown_options_and_clashing_columns_are_refused():
    pytest.importorskip("ray.data", reason="Ray is not installed (pip install 'opplugin[ray]')")
    from opplugin.ray import Predictor

    with pytest.raises(InputError, match="does not take colour"):
        Predictor(MODEL, device="cpu", colour="red")
    with pytest.raises(InputError, match="pass_through names 'probabilities'"):
        Predictor(MODEL, device="cpu", pass_through=["probabilities"])


def test_the_module_imports_the_real_ray_not_itself():
    pytest.importorskip("ray.data", reason="Ray is not installed (pip install 'opplugin[ray]')")
    import opplugin.ray

    assert opplugin.ray.ray.__name__ == "ray" and opplugin.ray.ray is not opplugin.ray
    assert hasattr(opplugin.ray.ray, "init") and hasattr(opplugin.ray.ray.data, "Dataset")


def test_without_ray_the_import_says_how_to_install_it():
    """Runs whether Ray is installed or not: the child process hides it."""
    code = "import sys; sys.modules['ray'] = None\nimport opplugin.ray"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == "opplugin.ray.RayNotInstalled: opplugin.ray needs Ray Data, which is not installed: pip install 'opplugin[ray]'"
    assert "ModuleNotFoundError" not in done.stderr


def test_the_predictors_runner_takes_a_precision():
    pytest.importorskip("ray.data", reason="Ray is not installed (pip install 'opplugin[ray]')")
    from opplugin.ray import Predictor

    half = Predictor(MODEL, device="cpu", batch=8, precision="fp16")
    fc1 = next(step for step in half.runner.plan_record().steps if step.name == "fc1")
    assert half.runner.precision == "fp16" and (fc1.implementation, fc1.precision) == ("gemm.reference.fp16+relu", "fp16")
    out = half({"input": _images()[:3]})
    assert out["probabilities"].shape == (3, 10) and out["probabilities"].dtype == np.float32
