"""Where the CUDA toolkit's command-line tools are (compute-sanitizer, ncu): on PATH, under
CUDA_HOME or /usr/local/cuda, or in an install of their own (Nsight Compute's under /opt/nvidia)."""
from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path


def find_tool(name: str, *installs: str) -> str | None:
    """The tool's path, or None. `installs`: glob patterns of stand-alone installs, the newest (last in
    name order) taken."""
    found = shutil.which(name)
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        candidate = Path(home or "/nonexistent") / "bin" / name
        if candidate.is_file():
            return str(candidate)
    for pattern in installs:
        matches = sorted(glob.glob(pattern))
        if matches:
            return matches[-1]
    return None
