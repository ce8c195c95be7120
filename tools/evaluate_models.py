#!/usr/bin/env python3
"""Accuracy of the shipped models with plain onnxruntime (CPU provider).

    python tools/evaluate_models.py [models/lenet86.onnx ...]

Prints accuracy on the first 100, 1,000 and 10,000 bundled test images, the
batch sizes the course reports use; these are the figures in models/README.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from opplugin.inputs import feeds  # noqa: E402
from opplugin.core.paths import models_dir  # noqa: E402

SUBSETS = (100, 1000, 10000)


def input_shape(model: onnx.ModelProto) -> tuple[int, int, int]:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return tuple(d.dim_value for d in dims[1:])  # type: ignore[return-value]


def predict(path: Path, images: np.ndarray, batch: int = 1000) -> np.ndarray:
    """Predicted class of each image, by onnxruntime on the CPU."""
    model = onnx.load(str(path))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = feeds.to_model_input(images, input_shape(model))
    name = sess.get_inputs()[0].name
    out = [sess.run(None, {name: x[i:i + batch]})[0] for i in range(0, len(x), batch)]
    return np.concatenate(out).argmax(axis=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path,
                        help="ONNX files (default: every *.onnx in models/)")
    args = parser.parse_args(argv)
    paths = args.models or sorted(models_dir().glob("*.onnx"))
    images, labels = feeds.load_test_set()
    print(f"onnxruntime {ort.__version__}, CPUExecutionProvider")
    print(f"{'model':<16}" + "".join(f"{'first ' + str(n):>14}" for n in SUBSETS))
    for path in paths:
        correct = predict(path, images) == labels
        accs = [correct[:n].mean() for n in SUBSETS]
        print(f"{path.stem:<16}" + "".join(f"{a:>14.4f}" for a in accs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
