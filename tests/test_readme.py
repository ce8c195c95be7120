"""Every Python block of the README runs as written, each in a fresh interpreter
(one registers a plugin, which must not leak into the others or into this process),
from a directory that is not the checkout; and so does every fenced command, on the
CPU, where the CPU can run it (the GPU's commands must stop there with one line)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repository import ROOT


BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text())


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 3


def _has_ray_data() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.data") is not None


def test_every_python_block_of_the_readme_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # one after another: side by side, their BLAS threads spin against each other (30 s instead of 6)
    for number, block in enumerate(python_blocks(), start=1):
        if "opplugin.ray" in block and not _has_ray_data():
            continue  # the Ray example needs the `ray` extra; tests/test_ray.py says it skipped
        run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"README Python block {number} failed:\n{block}\n{run.stderr[-2000:]}"


# --- every fenced command ---------------------------------------------------------------------

SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Commands that do not run here, each with the reason; the test fails when one of them
# leaves the README, so that this list stays the README's.
NOT_RUN_HERE = {
    "python3 -m pip install": "the set-up commands: tests/test_setup_commands.py and CI run them as written",
    "python3 -m pytest": "the set-up commands: tests/test_setup_commands.py and CI run them as written",
    "opplugin run lenet86 --batch 200000": "a GPU's batch: hours for the CPU reference",
    "opplugin run lenet86 --batch 100000": "a GPU's batch: hours for the CPU reference",
    "opplugin run resnet18.onnx": "resnet18.onnx comes from tools/export_models.py, which needs torch",
}
# Commands that need a GPU: here they must stop at once, with exit status 2 and one line.
NEEDS_GPU = ("opplugin tune", "opplugin bench", "opplugin profile", "tools/gpu_verify.sh")
# The bundled test set on the CPU reference takes about 20 s a command; these run 100 images.
SMALL_BATCH = ["--batch", "100"]


def readme_commands() -> list[str]:
    """Every command of the README's sh blocks and every `$ ` line of its text blocks, in
    order; the synopsis lines (`[MODEL] [--batch N]`) and comments left out."""
    readme = (ROOT / "README.md").read_text()
    commands = []
    for block in SH_BLOCK.findall(readme):
        for line in block.splitlines():
            command = re.split(r"\s+#", line.strip(), maxsplit=1)[0].strip()
            if command and not command.startswith("#") and " [" not in command:
                commands.append(command)
    for block in TEXT_BLOCK.findall(readme):
        commands += [line[2:].strip() for line in block.splitlines() if line.startswith("$ ")]
    return commands


def _fixtures(folder: Path) -> None:
    """The files the README's data commands name: model.onnx (input "input", free sizes,
    conv1 > conv2), inputs.npz and photos/."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnx_builders import finish, save

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w1", (4, 3, 3, 3)), ("w2", (2, 4, 3, 3)))]
    nodes = [helper.make_node("Conv", ["input", "w1"], ["conv1_out"], name="conv1"),
             helper.make_node("Conv", ["conv1_out", "w2"], ["output"], name="conv2")]
    graph = helper.make_graph(nodes, "demo", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 2, "OH", "OW"])],
                              initializer=weights)
    save(finish(graph), folder / "model.onnx")
    np.savez(folder / "inputs.npz", input=rng.random((2, 3, 16, 16), dtype=np.float32))
    (folder / "photos").mkdir()
    from PIL import Image

    for index in range(2):
        Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(folder / "photos" / f"photo{index}.jpg")
    (folder / "tests").symlink_to(ROOT / "tests")
    (folder / "models").symlink_to(ROOT / "models")  # the custom-op example's declaration file


def test_every_fenced_command_of_the_readme_runs_on_the_cpu(tmp_path):
    import shlex

    pytest.importorskip("PIL")
    _fixtures(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OPPLUGIN_CACHE_DIR": str(tmp_path / "cache")}
    skipped, ran = set(), 0
    for command in readme_commands():
        reason = next((prefix for prefix in NOT_RUN_HERE if command.startswith(prefix)), None)
        if reason:
            skipped.add(reason)
            continue
        words = shlex.split(command)
        if "typo.cu" in command and not (tmp_path / "typo.cu").exists():  # the starter with step 2's typo
            starter = (tmp_path / "my_conv.cu").read_text()
            (tmp_path / "typo.cu").write_text(starter.replace("acc += b[m];", "acc += b[m] + oops;"))
        if words[0] == "opplugin":
            if {"lenet86", "lenet86_swish"} & set(words) and "--batch" not in words and words[1] in ("run", "check"):
                words += SMALL_BATCH
            argv = [sys.executable, "-m", "opplugin", *words[1:]]
        else:
            argv = [str(ROOT / words[0]), *words[1:]] if words[0].startswith("tools/") else words
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        ran += 1
        where = f"README command {command!r}:\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"
        assert "Traceback" not in done.stderr, where
        if command.startswith(NEEDS_GPU) or "typo.cu" in command:
            assert done.returncode == 2, where
            first = done.stderr.strip().splitlines()[0]
            assert ("GPU" in first or "CUDA device" in first) if "typo.cu" not in command else 'identifier "oops"' in first, where
        else:
            assert done.returncode == 0, where
    assert skipped == set(NOT_RUN_HERE), "NOT_RUN_HERE names a command the README no longer has"
    assert ran >= 14


def test_the_architecture_section_names_every_module_and_folder():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Architecture"):readme.index("### Configuration names")]
    words = set(re.findall(r"[A-Za-z_0-9]+", section))
    package = ROOT / "opplugin"
    modules = {path.stem for path in package.rglob("*.py") if path.stem not in ("__init__", "__main__")}
    folders = {path.name for path in package.rglob("*") if path.is_dir() and path.name != "__pycache__"}
    assert sorted((modules | folders) - words) == []
