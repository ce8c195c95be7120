"""Every Python block of the README runs as written, each in a fresh interpreter
(one registers a plugin, which must not leak into the others or into this process)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text())


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 3


def test_every_python_block_of_the_readme_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # the blocks are independent: run them side by side, from a directory that is not the checkout
    runs = [
        subprocess.Popen([sys.executable, "-c", block], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for block in python_blocks()
    ]
    for number, (block, run) in enumerate(zip(python_blocks(), runs), start=1):
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, f"README Python block {number} failed:\n{block}\n{err[-2000:]}"
