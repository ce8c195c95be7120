#!/usr/bin/env python3
"""Train the two shipped Fashion-MNIST CNNs and export them to ONNX.

    python tools/train_models.py [--epochs E] [--out models/] [--only lenet86]

Needs torch (CPU is enough). The training images come from the Fashion-MNIST
IDX files (Debian's dataset-fashion-mnist package by default). Preprocessing goes
through opplugin.inputs.feeds, the module the runner uses at inference time, so both
sides see identical pixels. Seeds are fixed; rerunning gives the same models up to
floating-point nondeterminism in torch's CPU kernels.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

import onnx  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from opplugin.inputs import feeds  # noqa: E402

DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
OPSET = 17
IR_VERSION = 8  # what opset 17 was released with; onnxruntime >= 1.20 loads it


class LeNet86(nn.Module):
    """Modified LeNet-5 of the ECE408 project: 1x86x86 -> 10 logits."""

    input_shape = (1, 86, 86)

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=7)      # -> 4x80x80
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2, stride=2)           # -> 4x40x40
        self.conv2 = nn.Conv2d(4, 16, kernel_size=7)     # -> 16x34x34
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(4, stride=4)           # -> 16x8x8
        self.flatten = nn.Flatten()                      # -> 1024
        self.fc1 = nn.Linear(1024, 32)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.fc2(self.relu3(self.fc1(self.flatten(x))))


class Ece408High(nn.Module):
    """One wide 5x5 conv with tanh, as in the 'high' network: 1x28x28 -> 10 logits."""

    input_shape = (1, 28, 28)

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 50, kernel_size=5)     # -> 50x24x24
        self.tanh1 = nn.Tanh()
        self.pool1 = nn.MaxPool2d(2, stride=2)           # -> 50x12x12
        self.flatten = nn.Flatten()                      # -> 7200
        self.fc1 = nn.Linear(7200, 128)
        self.tanh2 = nn.Tanh()
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(self.pool1(self.tanh1(self.conv1(x))))
        return self.fc2(self.tanh2(self.fc1(x)))


class WithSoftmax(nn.Module):
    """Export wrapper: training uses logits, the shipped model outputs probabilities."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.net(x))


# name -> (network class, default epochs, learning rate, seed)
RECIPES = {
    "lenet86": (LeNet86, 10, 2e-3, 408),
    "ece408_high": (Ece408High, 8, 1e-3, 409),
}
BATCH = 128


def load_split(data_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images = feeds.load_idx(data_dir / f"{split}-images-idx3-ubyte.gz")
    labels = feeds.load_idx(data_dir / f"{split}-labels-idx1-ubyte.gz")
    return images, labels.astype(np.int64)


def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> float:
    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += int((net(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    return correct / len(x)


def train(name: str, epochs: int, train_set, test_set) -> nn.Module:
    cls, _, lr, seed = RECIPES[name]
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    net = cls()
    x_train = torch.from_numpy(feeds.to_model_input(train_set[0], cls.input_shape))
    y_train = torch.from_numpy(train_set[1])
    x_test = torch.from_numpy(feeds.to_model_input(test_set[0], cls.input_shape))
    y_test = torch.from_numpy(test_set[1])

    steps_per_epoch = math.ceil(len(x_train) / BATCH)
    total_steps = epochs * steps_per_epoch
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    # Cosine decay to zero over the run: a few epochs of Adam then settle the weights.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
    )
    loss_fn = nn.CrossEntropyLoss()
    print(f"[{name}] {sum(p.numel() for p in net.parameters())} parameters, "
          f"input {cls.input_shape}, {epochs} epochs, Adam lr={lr}, batch {BATCH}, seed {seed}",
          flush=True)
    for epoch in range(1, epochs + 1):
        net.train()
        start = time.perf_counter()
        order = torch.from_numpy(rng.permutation(len(x_train)))
        total_loss = 0.0
        for i in range(0, len(order), BATCH):
            idx = order[i:i + BATCH]
            loss = loss_fn(net(x_train[idx]), y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total_loss += loss.item() * len(idx)
        test_acc = accuracy(net, x_test, y_test)
        print(f"[{name}] epoch {epoch}/{epochs}: loss {total_loss / len(x_train):.4f}, "
              f"test accuracy {test_acc:.4f}, {time.perf_counter() - start:.1f} s", flush=True)
    net.eval()
    return net


def _readable_names(model: onnx.ModelProto) -> None:
    """Name nodes after their torch module ('/net/conv1/Conv' -> 'conv1'), their
    outputs '<node>_out' and the weights 'conv1.weight' rather than 'net.conv1.weight'."""
    graph = model.graph
    renames = {init.name: init.name.removeprefix("net.") for init in graph.initializer}
    used: set[str] = set()
    keep = {v.name for v in graph.input} | {v.name for v in graph.output}
    for node in graph.node:
        parts = [p for p in node.name.split("/") if p and p != "net"]
        name = parts[0] if len(parts) > 1 else node.op_type.lower()
        if name in used:  # keep names unique should a module emit several nodes
            name = f"{name}_{node.op_type.lower()}"
        used.add(name)
        node.name = name
        for i, out in enumerate(node.output):
            if out not in keep:
                renames[out] = f"{name}_out" if i == 0 else f"{name}_out{i}"
    for init in graph.initializer:
        init.name = renames[init.name]
    for node in graph.node:
        node.input[:] = [renames.get(t, t) for t in node.input]
        node.output[:] = [renames.get(t, t) for t in node.output]
    del graph.value_info[:]  # recomputed by shape inference below


def export(name: str, net: nn.Module, path: Path) -> None:
    wrapper = WithSoftmax(net).eval()
    dummy = torch.zeros(1, *net.input_shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # the legacy exporter warns that it is legacy
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            wrapper, (dummy,), str(path),
            input_names=["input"], output_names=["probabilities"],
            dynamic_axes={"input": {0: "N"}, "probabilities": {0: "N"}},
            opset_version=OPSET, do_constant_folding=True, dynamo=False,
        )
    model = onnx.load(str(path))
    _readable_names(model)
    model.ir_version = IR_VERSION
    model.producer_name = "opplugin tools/train_models.py"
    model.doc_string = f"{name}: Fashion-MNIST classifier, outputs softmax probabilities"
    if any(n.op_type == "Constant" for n in model.graph.node):
        raise RuntimeError(f"{name}: export left Constant nodes; weights must be initializers")
    onnx.checker.check_model(model, full_check=True)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.save(model, str(path))  # small models: one file, no external data
    print(f"[{name}] wrote {path} ({path.stat().st_size} bytes): "
          + ", ".join(f"{n.name}:{n.op_type}" for n in model.graph.node), flush=True)


def check_export(net: nn.Module, path: Path, images: np.ndarray) -> None:
    """The ONNX file must agree with the torch network it came from."""
    import onnxruntime as ort

    x = feeds.to_model_input(images, net.input_shape)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(["probabilities"], {"input": x})[0]
    with torch.no_grad():
        want = torch.softmax(net(torch.from_numpy(x)), dim=1).numpy()
    err = float(np.abs(got - want).max())
    if err > 1e-4:
        raise RuntimeError(f"{path}: onnxruntime and torch disagree (max abs diff {err:.2e})")
    print(f"[{path.stem}] onnxruntime matches torch on {len(x)} images (max abs diff {err:.1e})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs for every model (default: each model's recipe)")
    parser.add_argument("--out", type=Path, default=REPO / "models",
                        help="where to write <name>.onnx (default: the checkout's models/)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="folder with the Fashion-MNIST {train,t10k}-*-ubyte.gz files")
    parser.add_argument("--only", choices=sorted(RECIPES), action="append",
                        help="train just this model (repeatable)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    train_set = load_split(args.data_dir, "train")
    test_set = load_split(args.data_dir, "t10k")
    for name in args.only or list(RECIPES):
        start = time.perf_counter()
        epochs = args.epochs or RECIPES[name][1]
        net = train(name, epochs, train_set, test_set)
        path = args.out / f"{name}.onnx"
        export(name, net, path)
        check_export(net, path, test_set[0][:256])
        print(f"[{name}] done in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
