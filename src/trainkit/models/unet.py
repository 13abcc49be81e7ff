"""A small U-Net: images [B, C, H, W] -> per-pixel class logits [B, num_classes, H, W].

    model = UNet(in_channels=3, num_classes=4, widths=(16, 32, 64), dropout=0.0)

`widths[i]` is the channel count at the i-th resolution, full resolution first; each level below the first halves the
height and width, so H and W must be divisible by 2 ** (len(widths) - 1). Other sizes raise a ValueError that names the
sizes that would work, rather than being padded and cropped behind the caller's back: resize the data, or pick fewer
levels.

The layout is Ronneberger et al.'s, shrunk: at every level two 3x3 conv-BatchNorm-ReLU blocks; 2x2 max pooling on the
way down; on the way up a 2x2 transposed convolution that doubles the resolution and halves the channels, its output
concatenated with the encoder's features of that level (the skip connection) and fed to two more conv blocks; a 1x1
convolution makes the logits. Convolutions are padded, so the output has the input's size. A transposed convolution
rather than bilinear upsampling: it learns the upsampling and, by halving the channels first, makes the conv after the
concatenation cheaper, which matters for the CPU runs this model is sized for. `dropout` (Dropout2d, whole channels)
acts on the deepest features only, where there are the most channels and the least spatial detail to lose.
"""

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from trainkit.config.schema import Check, numbers


class UNet(nn.Module):
    """See the module docstring. Returns logits: apply softmax/argmax over dim 1."""

    spatial_outputs: ClassVar[bool] = True  # one class per pixel: the config check refuses it with task=classification
    suits: ClassVar[tuple[str, ...]] = ("task=segmentation", "experiment=shapes_segmentation")  # for its hint
    config_rules: ClassVar[dict[str, Check]] = {"widths": numbers(1, whole=True)}  # what the config check holds it to

    @staticmethod
    def input_size_multiple(widths: Sequence[int] = (16, 32, 64)) -> int:
        """What H and W must be divisible by, from the constructor's arguments: the config check asks
        it (trainkit.config.validation) before any directory or model exists."""
        return 2 ** (len(widths) - 1)

    def __init__(
        self, in_channels: int, num_classes: int, widths: Sequence[int] = (16, 32, 64), dropout: float = 0.0
    ) -> None:
        super().__init__()
        widths = [int(width) for width in widths]
        if not widths or min(widths) < 1:
            raise ValueError(f"widths must be one or more positive channel counts, got {widths}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.size_multiple = self.input_size_multiple(widths)
        self.down = nn.ModuleList()
        channels = in_channels
        for width in widths:
            self.down.append(double_conv(channels, width))
            channels = width
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout2d(dropout)
        self.upsample = nn.ModuleList()
        self.up = nn.ModuleList()
        for width in reversed(widths[:-1]):
            self.upsample.append(nn.ConvTranspose2d(channels, width, kernel_size=2, stride=2))
            self.up.append(double_conv(2 * width, width))  # the upsampled features + the skip
            channels = width
        self.head = nn.Conv2d(channels, num_classes, kernel_size=1)

    def forward(self, images: Tensor) -> Tensor:
        height, width = images.shape[-2:]
        if height % self.size_multiple or width % self.size_multiple:
            raise ValueError(
                f"UNet with {len(self.down)} levels needs height and width divisible by {self.size_multiple}, "
                f"got {height}x{width}: resize to a multiple of {self.size_multiple} or use fewer widths"
            )
        skips = []
        x = images
        for level, block in enumerate(self.down):
            if level:
                x = self.pool(x)
            x = block(x)
            skips.append(x)
        x = self.dropout(skips.pop())
        for upsample, block in zip(self.upsample, self.up):
            x = block(torch.cat([upsample(x), skips.pop()], dim=1))
        return self.head(x)


def double_conv(in_channels: int, out_channels: int) -> nn.Sequential:
    """Two 3x3 conv-BatchNorm-ReLU blocks; no conv bias, as the BatchNorm after it has its own."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
        nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )
