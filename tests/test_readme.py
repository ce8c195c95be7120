"""Every Python block of the README runs as written, each in a fresh interpreter
(one registers a plugin, which must not leak into the others or into this process),
from a directory that is not the checkout."""
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
    # one after another: side by side, their BLAS threads spin against each other (30 s instead of 6)
    for number, block in enumerate(python_blocks(), start=1):
        run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"README Python block {number} failed:\n{block}\n{run.stderr[-2000:]}"
