"""The default model: a small, fast CNN that trains on the digits in seconds on a laptop CPU.
A model option is a class or function like this one, named by `_target_` in conf/model/<name>.yaml."""

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from trainkit.config.schema import Check, numbers


class SmallCNN(nn.Module):
    """Conv3x3-BN-ReLU blocks (one per width), a 2x2 max-pool after the second, global average
    pooling, dropout, linear. Any input of at least 1x1 works: 8x8 digits, 28x28, 32x32."""

    # What an argument may hold: the config check (trainkit.config.validation) reads it before anything is built.
    config_rules: ClassVar[dict[str, Check]] = {"widths": numbers(1, whole=True)}

    def __init__(self, in_channels: int, num_classes: int, widths: Iterable[int] = (32, 64, 128), dropout: float = 0.0):
        super().__init__()
        layers, channels = [], in_channels
        for index, width in enumerate(widths):
            conv = nn.Conv2d(channels, width, 3, padding=1, bias=False)
            layers += [conv, nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            if index == 1:
                # ceil_mode keeps a 1x1 map at 1x1 (and 7x7 -> 4x4), so no size check per step.
                layers.append(nn.MaxPool2d(2, ceil_mode=True))
            channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(channels, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
