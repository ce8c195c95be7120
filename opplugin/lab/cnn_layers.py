"""The layer set of `opplugin bench --suite cnn`: Conv layers of real CNNs (VGG,
ResNet, MobileNetV2; the grouped 3x3 of ResNeXt and RegNet, the wide depthwise 5x5 and
7x7 of EfficientNet and ConvNeXt) and one just past constant memory, with seeded random
weights. The two VGG layers are the ones the CS259 report times against cuDNN.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops.conv.spec import ConvSpec

SUITE_BATCHES = (1, 32)
WEIGHT_SEED = 259


@dataclass(frozen=True)
class Layer:
    name: str
    in_channels: int
    out_channels: int
    size: int  # square input
    kernel: int
    stride: int = 1
    pad: int = 0
    group: int = 1

    def spec(self, batch: int = 1) -> ConvSpec:
        return ConvSpec(
            batch=batch,
            in_channels=self.in_channels,
            out_channels=self.out_channels,
            in_size=(self.size, self.size),
            kernel=(self.kernel, self.kernel),
            strides=(self.stride, self.stride),
            dilations=(1, 1),
            pads=(self.pad,) * 4,
            group=self.group,
            has_bias=True,
        )


LAYERS = (
    Layer("vgg 64->64 3x3 224", 64, 64, 224, 3, pad=1),
    Layer("vgg 512->512 3x3 14", 512, 512, 14, 3, pad=1),
    Layer("resnet stem 3->64 7x7 s2 224", 3, 64, 224, 7, stride=2, pad=3),
    Layer("resnet 64->64 3x3 56", 64, 64, 56, 3, pad=1),
    Layer("resnet 128->128 3x3 28", 128, 128, 28, 3, pad=1),
    Layer("resnet 256->256 3x3 14", 256, 256, 14, 3, pad=1),
    Layer("resnet 512->512 3x3 7", 512, 512, 7, 3, pad=1),
    Layer("resnet 1x1 256->64 56", 256, 64, 56, 1),
    Layer("resnet 1x1 64->256 56", 64, 256, 56, 1),
    Layer("resnet 1x1 s2 256->512 56", 256, 512, 56, 1, stride=2),
    Layer("mobilenetv2 dw 3x3 32ch 112", 32, 32, 112, 3, pad=1, group=32),
    Layer("mobilenetv2 dw 3x3 s2 144ch 56", 144, 144, 56, 3, stride=2, pad=1, group=144),
    Layer("mobilenetv2 1x1 96->24 56", 96, 24, 56, 1),
    Layer("mnist 32->64 3x3 14", 32, 64, 14, 3, pad=1),
    Layer("resnext50 g32 3x3 128ch 56", 128, 128, 56, 3, pad=1, group=32),
    Layer("resnext50 g32 3x3 512ch 14", 512, 512, 14, 3, pad=1, group=32),
    Layer("regnety800mf gw16 3x3 144ch 28", 144, 144, 28, 3, pad=1, group=9),
    Layer("regnety800mf gw16 3x3 320ch 14", 320, 320, 14, 3, pad=1, group=20),
    Layer("efficientnetb0 dw 5x5 672ch 14", 672, 672, 14, 5, pad=2, group=672),
    Layer("efficientnetb0 dw 5x5 1152ch 7", 1152, 1152, 7, 5, pad=2, group=1152),
    Layer("convnext-t dw 7x7 96ch 56", 96, 96, 56, 7, pad=3, group=96),
    Layer("convnext-t dw 7x7 768ch 7", 768, 768, 7, 7, pad=3, group=768),
    Layer("efficientnetb0 dw 5x5 s2 144ch 56", 144, 144, 56, 5, stride=2, pad=2, group=144),
    Layer("efficientnetb0 dw 5x5 s2 672ch 14", 672, 672, 14, 5, stride=2, pad=2, group=672),
)


def layer_weights(layer: Layer) -> tuple[np.ndarray, np.ndarray]:
    """He-scaled normal filters and a small bias, the same on every run."""
    rng = np.random.default_rng([WEIGHT_SEED, LAYERS.index(layer)])
    spec = layer.spec()
    fan_in = (spec.in_channels // spec.group) * layer.kernel**2
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    b = rng.standard_normal(spec.out_channels, dtype=np.float32) * np.float32(0.1)
    return w, b
