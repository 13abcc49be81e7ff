"""SpeedrunNet: a small residual CNN for speed runs on small images (model=speedrun).

In the spirit of airbench and the DAWNBench ResNet-9: few, wide layers and early downsampling, so
a GPU spends its time in large convolutions rather than in many small kernels. Every stage is

    conv3x3 -> max-pool 2x2 -> BatchNorm -> GELU -> (+ residual: conv3x3 -> BatchNorm -> GELU)

after a narrow conv3x3 stem; the head is a global max-pool and a linear layer without bias, whose
logits are multiplied by `logit_scale` (airbench's 1/9: a cooler start trains faster at large
learning rates). With the default widths (64, 256, 256) it has about 2.0M parameters and takes any
input of at least 1x1 (pooling uses ceil_mode, so 8x8 digits work too).
"""

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from trainkit.config.schema import Check, integer, number, numbers


def conv_bn_gelu(in_channels: int, out_channels: int, pool: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)]
    if pool:  # pooling before BatchNorm: the normalization and activation run on a quarter of the pixels
        layers.append(nn.MaxPool2d(2, ceil_mode=True))
    return nn.Sequential(*layers, nn.BatchNorm2d(out_channels), nn.GELU())


class Stage(nn.Module):
    """Downsample to `out_channels`, then one residual conv block at that width."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.down = conv_bn_gelu(in_channels, out_channels, pool=True)
        self.residual = conv_bn_gelu(out_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(x)
        return x + self.residual(x)


class SpeedrunNet(nn.Module):
    config_rules: ClassVar[dict[str, Check]] = {  # what each argument may hold (the config check reads it)
        "widths": numbers(1, whole=True),
        "stem_width": integer(1),
        "logit_scale": number(above=0),
    }

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        widths: Iterable[int] = (64, 256, 256),
        stem_width: int = 32,
        dropout: float = 0.0,
        logit_scale: float = 1 / 9,
    ):
        super().__init__()
        stages, channels = [], stem_width
        for width in widths:
            stages.append(Stage(channels, width))
            channels = width
        self.features = nn.Sequential(conv_bn_gelu(in_channels, stem_width), *stages)
        self.head = nn.Sequential(
            nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(channels, num_classes, bias=False)
        )
        self.logit_scale = logit_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)) * self.logit_scale
