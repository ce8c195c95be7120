"""Export torchvision or timm CNNs to ONNX for end-to-end runs: random weights (seeded), eval
mode, a dynamic batch axis, opset 17. Made on demand, never committed (VGG-16 alone is half a GB).

    python3 tools/export_models.py --out /tmp/cnn                   # all of MODELS
    python3 tools/export_models.py --out /tmp/cnn resnet18 vgg16
    python3 tools/export_models.py --out /tmp/cnn timm:ghostnet_100  # any timm architecture
    python3 tools/export_models.py --out /tmp/vit --transformers     # all of TRANSFORMERS
    python3 tools/export_models.py --out /tmp/vit swin_t --exporter torchscript

Each MODEL.onnx gets a MODEL.pt beside it: where the architecture comes from (torchvision
or timm), its name, the arguments it was built with and the same weights, which `opplugin
bench --e2e` loads for its PyTorch peers (eager, in a CUDA graph, torch.compile in a CUDA
graph). Besides the random convolution and linear weights, each BatchNormalization gets
random running statistics and affine parameters, so folding it into the Conv is exercised
on numbers that are not 0 and 1, and a linear layer made all zeros (ViT-B/16's head) random
weights, so that the output depends on the image. Inception-v3 takes 299x299 images, a timm model the size
its default configuration names, the others 224x224. Needs torch, torchvision (or timm) and
onnx (and onnxscript for torch's dynamo exporter, which is tried first; the TorchScript
exporter is the fallback).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "vgg16",
          "efficientnet_b0", "mobilenet_v3_large", "regnet_y_800mf", "densenet121", "inception_v3", "convnext_tiny",
          "resnext50_32x4d")
# the vision transformers the transformer work is measured on (issue "Vision transformers and hybrids")
TRANSFORMERS = ("vit_b_16", "swin_t", "timm:vit_small_patch16_224", "timm:deit_small_patch16_224")
EXPORTERS = ("dynamo", "torchscript")
OPSET = 17
IMAGE = (3, 224, 224)
# the image an architecture is made for, where not IMAGE
IMAGES = {"inception_v3": (3, 299, 299)}
# constructor arguments beside weights=None: Inception-v3's auxiliary classifier only trains,
# and its own initialisation (truncated normal through scipy) is slow and changes nothing here
ARCH_KWARGS: dict[str, dict] = {"inception_v3": {"aux_logits": False, "init_weights": False}}


TIMM = "timm:"  # the prefix of a timm architecture's name on the command line


def build(name: str, seed: int):
    """(source, architecture, module) with seeded random weights; `name` is a torchvision
    architecture, or TIMM + a timm one."""
    import torch

    torch.manual_seed(seed)
    if name.startswith(TIMM):
        import timm

        source, arch = "timm", name.removeprefix(TIMM)
        model = timm.create_model(arch, pretrained=False)
    else:
        import torchvision

        source, arch = "torchvision", name
        model = getattr(torchvision.models, name)(weights=None, **ARCH_KWARGS.get(name, {}))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.1, 0.1)
            elif isinstance(module, torch.nn.Linear) and not module.weight.any():
                # torchvision starts ViT's head at zero: every image would get the same output (its bias),
                # and the end-to-end check would compare constants
                module.weight.normal_(0.0, 0.02)
    return source, arch, model.eval()


def image_size(source: str, arch: str, model) -> tuple[int, ...]:
    if source == "timm":
        return tuple(model.pretrained_cfg["input_size"])
    return IMAGES.get(arch, IMAGE)


def export(model, path: Path, image: tuple[int, ...], exporter: str = "dynamo") -> str:
    """Writes the ONNX file; returns which exporter did it (the TorchScript one where asked, or where
    the dynamo one fails)."""
    import torch

    example = torch.randn(2, *image)
    names = {"input_names": ["input"], "output_names": ["logits"]}
    if exporter == "dynamo":
        try:
            torch.onnx.export(model, (example,), str(path), dynamo=True, opset_version=OPSET, external_data=False,
                              dynamic_shapes={"x": {0: torch.export.Dim("batch")}}, **names)
            return "dynamo"
        except Exception as err:  # the TorchScript exporter handles what the dynamo one cannot
            print(f"  dynamo exporter failed ({type(err).__name__}: {str(err).splitlines()[0][:200]}); using the TorchScript one",
                  file=sys.stderr)
    torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=OPSET, do_constant_folding=True,
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, **names)
    return "torchscript"


def drop_foreign_attributes(graph) -> None:
    """onnx's converter from opset 18 leaves ReduceMean's noop_with_empty_axes (0, its default) in
    place, which opset 17 does not have; an attribute unknown to the node's opset-17 schema goes
    when it holds 0, the value that changes nothing; any other is an error."""
    from onnx import defs, helper

    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        known = defs.get_schema(node.op_type, OPSET).attributes
        for attribute in [a for a in node.attribute if a.name not in known]:
            if helper.get_attribute_value(attribute) != 0:
                raise ValueError(f"{node.op_type} {node.name}: attribute {attribute.name} has no opset-{OPSET} meaning")
            node.attribute.remove(attribute)


def settle(path: Path) -> str:
    """Opset 17 where onnx can convert to it, and a free batch axis, whatever the exporter wrote;
    one line describing the file."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset != OPSET:
        try:
            converted = version_converter.convert_version(model, OPSET)
            drop_foreign_attributes(converted.graph)
            model, opset = converted, OPSET
        except (RuntimeError, ValueError) as err:  # onnx has no down-converter for some ops (Split from 18)
            print(f"  kept opset {opset}: {str(err).splitlines()[0][:160]}", file=sys.stderr)
    for value in [*model.graph.input, *model.graph.output]:
        dim = value.type.tensor_type.shape.dim[0]
        if dim.HasField("dim_value"):
            dim.Clear()
            dim.dim_param = "batch"
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return f"opset {opset}, {len(model.graph.node)} nodes: " + ", ".join(f"{n} {op}" for op, n in sorted(ops.items()))


def _known(name: str) -> bool:
    if not name.startswith(TIMM):
        import torchvision

        return name in torchvision.models.list_models()
    try:
        import timm
    except ImportError:
        return False
    return timm.is_model(name.removeprefix(TIMM))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help=f"torchvision architectures or {TIMM}NAME for timm ones (default: {', '.join(MODELS)})")
    parser.add_argument("--out", type=Path, required=True, help="folder for MODEL.onnx and MODEL.pt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transformers", action="store_true", help=f"export {', '.join(TRANSFORMERS)} (with any MODEL named)")
    parser.add_argument("--exporter", choices=EXPORTERS, default="dynamo",
                        help="torch's dynamo exporter (the default; TorchScript's where it fails) or the TorchScript one")
    args = parser.parse_args(argv)
    try:
        import torch
        import torchvision  # noqa: F401 (a timm model needs it too)
    except ImportError:
        print("export_models: error: needs torch and torchvision (the GPU machine has them)", file=sys.stderr)
        return 2
    unknown = [name for name in args.models if not _known(name)]
    if unknown:
        parser.error(f"{', '.join(unknown)}: not a torchvision architecture, nor {TIMM}NAME of an installed timm's")
    args.out.mkdir(parents=True, exist_ok=True)
    names = [*args.models, *(TRANSFORMERS if args.transformers else ())] or MODELS
    for name in dict.fromkeys(names):
        source, arch, model = build(name, args.seed)
        path = args.out / f"{arch}.onnx"
        how = export(model, path, image_size(source, arch, model), args.exporter)
        state = {"source": source, "arch": arch, "kwargs": ARCH_KWARGS.get(name, {}), "state_dict": model.state_dict()}
        torch.save(state, path.with_suffix(".pt"))
        print(f"{path}: {how} exporter, {settle(path)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
