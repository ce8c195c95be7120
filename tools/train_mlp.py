#!/usr/bin/env python3
"""Train the shipped one-hidden-layer network, mlp_onehidden, in numpy and export it to ONNX.

    python tools/train_mlp.py [--epochs E] [--out models/] [--data /usr/share/datasets/fashion-mnist]

784 -> 128 (sigmoid) -> 10 (softmax): the network of the one-hidden-layer seed report,
shaped for Fashion-MNIST. A network this small trains in numpy in a minute or two, so
unlike tools/train_models.py this script needs no torch. The preprocessing is
opplugin.inputs.feeds's (pixel / 255), the one the runner uses at inference time; the model
takes the same [N, 1, 28, 28] input as ece408_high and flattens it itself.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from opplugin.inputs import feeds  # noqa: E402

DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
OPSET = 17
IR_VERSION = 8
HIDDEN = 128
CLASSES = 10
EPOCHS = 20
LEARNING_RATE = 2e-3
BATCH = 128
SEED = 410


def load_split(data_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images = feeds.load_idx(data_dir / f"{split}-images-idx3-ubyte.gz")
    labels = feeds.load_idx(data_dir / f"{split}-labels-idx1-ubyte.gz")
    x = feeds.to_model_input(images, (1, 28, 28)).reshape(len(images), -1)
    return x, labels.astype(np.int64)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


class Mlp:
    """The parameters (torch.nn.Linear's layout and initialisation: W is [out, in],
    uniform in +-1/sqrt(in)) and their Adam moments."""

    def __init__(self, rng: np.random.Generator):
        def linear(fan_in: int, fan_out: int) -> list[np.ndarray]:
            bound = 1.0 / math.sqrt(fan_in)
            return [rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                    rng.uniform(-bound, bound, fan_out).astype(np.float32)]

        self.params = linear(784, HIDDEN) + linear(HIDDEN, CLASSES)
        self.m = [np.zeros_like(p) for p in self.params]
        self.v = [np.zeros_like(p) for p in self.params]
        self.steps = 0

    def logits(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w1, b1, w2, b2 = self.params
        hidden = sigmoid(x @ w1.T + b1)
        return hidden, hidden @ w2.T + b2

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One Adam step (default betas, eps 1e-8) on the mean cross-entropy of the batch."""
        w1, b1, w2, b2 = self.params
        hidden, z = self.logits(x)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        dz = p
        dz[np.arange(len(y)), y] -= 1.0
        dz /= len(y)
        dhidden = (dz @ w2) * hidden * (1.0 - hidden)
        grads = [dhidden.T @ x, dhidden.sum(axis=0), dz.T @ hidden, dz.sum(axis=0)]
        self.steps += 1
        beta1, beta2 = 0.9, 0.999
        correction = math.sqrt(1 - beta2**self.steps) / (1 - beta1**self.steps)
        for param, grad, m, v in zip(self.params, grads, self.m, self.v):
            m *= beta1
            m += (1 - beta1) * grad
            v *= beta2
            v += (1 - beta2) * grad * grad
            param -= (lr * correction * m / (np.sqrt(v) + 1e-8)).astype(np.float32)
        return loss

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float((self.logits(x)[1].argmax(axis=1) == y).mean())


def train(epochs: int, train_set, test_set) -> Mlp:
    rng = np.random.default_rng(SEED)
    net = Mlp(rng)
    x, y = train_set
    total = epochs * math.ceil(len(x) / BATCH)
    print(f"[mlp_onehidden] 784-{HIDDEN}-{CLASSES}, {epochs} epochs, Adam lr={LEARNING_RATE} cosine, batch {BATCH}, seed {SEED}",
          flush=True)
    for epoch in range(1, epochs + 1):
        start, losses = time.perf_counter(), []
        order = rng.permutation(len(x))
        for i in range(0, len(order), BATCH):
            lr = LEARNING_RATE * 0.5 * (1.0 + math.cos(math.pi * net.steps / total))  # cosine decay to 0 per step
            idx = order[i:i + BATCH]
            losses.append(net.step(x[idx], y[idx], lr))
        print(f"[mlp_onehidden] epoch {epoch}/{epochs}: loss {np.mean(losses):.4f}, "
              f"test accuracy {net.accuracy(*test_set):.4f}, {time.perf_counter() - start:.1f} s", flush=True)
    return net


def export(net: Mlp, path: Path) -> onnx.ModelProto:
    """The ONNX graph Flatten > Gemm > Sigmoid > Gemm > Softmax, named like the other shipped models."""
    w1, b1, w2, b2 = net.params
    nodes = [
        helper.make_node("Flatten", ["input"], ["flatten_out"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flatten_out", "fc1.weight", "fc1.bias"], ["fc1_out"], name="fc1", transB=1),
        helper.make_node("Sigmoid", ["fc1_out"], ["sigmoid1_out"], name="sigmoid1"),
        helper.make_node("Gemm", ["sigmoid1_out", "fc2.weight", "fc2.bias"], ["fc2_out"], name="fc2", transB=1),
        helper.make_node("Softmax", ["fc2_out"], ["probabilities"], name="softmax", axis=1),
    ]
    weights = {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2}
    graph = helper.make_graph(
        nodes, "mlp_onehidden",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", CLASSES])],
        initializer=[numpy_helper.from_array(np.ascontiguousarray(v, np.float32), name) for name, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="opplugin tools/train_mlp.py",
                              doc_string="mlp_onehidden: Fashion-MNIST classifier, outputs softmax probabilities")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return model


def check_export(net: Mlp, path: Path, x: np.ndarray) -> float:
    """Largest difference between onnxruntime's probabilities and numpy's on `x`."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    [ours] = session.run(None, {"input": x.reshape(len(x), 1, 28, 28)})
    z = net.logits(x)[1]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return float(np.abs(ours - p / p.sum(axis=1, keepdims=True)).max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--out", type=Path, default=REPO / "models")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="folder of the Fashion-MNIST IDX files")
    args = parser.parse_args()
    train_set, test_set = load_split(args.data, "train"), load_split(args.data, "t10k")
    start = time.perf_counter()
    net = train(args.epochs, train_set, test_set)
    path = args.out / "mlp_onehidden.onnx"
    export(net, path)
    print(f"[mlp_onehidden] {time.perf_counter() - start:.0f} s; wrote {path}; "
          f"onnxruntime vs numpy max difference {check_export(net, path, test_set[0][:256]):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
