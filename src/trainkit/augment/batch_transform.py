"""The batch transform: images as a loader gives them made into the normalized batch the model eats, on the device:
scale to [0, 1] -> resize -> augment (training only) -> normalize. It augments by `crop_padding` (pad, then crop back
at a random offset per sample: augmentation=shift) and `horizontal_flip` (mirror a random half: basic), then by what a
module the augmentation section names in `_checks_` builds with its `on_device_augment(augmentation, size, mean)` (an
nn.Module on [0, 1] images, or None; docs/features.md). Every random choice is drawn per sample from torch's global RNG
on the batch's device (train.py seeds it with seed + rank).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainkit.errors import ConfigError


class BatchTransform(nn.Module):
    """uint8 or [0, 1] float images [B, C, H, W] -> normalized float32 [B, C, size, size], augmented in training mode
    only (`train=False` builds it in eval mode). `augmentation`: the section, checked by the config check (None: no
    augmentation); `mean` and `std`: one value per channel, or one for all; `channels_last=True`: NHWC batches. A dict
    batch (image + text, two views) is transformed in the `entries` that hold images (the data option's
    `image_entries`); its other entries pass as they are."""

    mean: Tensor  # buffers, registered in __init__
    std: Tensor

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        size: int,
        augmentation: Mapping | None = None,
        train: bool = False,
        channels_last: bool = False,
        entries: Sequence[str] = (),
    ):
        super().__init__()
        self.entries = tuple(entries)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        self.size = size
        # Non-persistent: they follow .to(device) but stay out of checkpoints.
        self.register_buffer("mean", torch.tensor([float(m) for m in mean]).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor([float(s) for s in std]).view(1, -1, 1, 1), persistent=False)

        crop_padding = (augmentation or {}).get("crop_padding")
        self.padding = max(1, round(crop_padding * size)) if crop_padding else 0
        self.horizontal_flip = bool((augmentation or {}).get("horizontal_flip"))
        self.feature_ops = augmenting_module(augmentation, size, self.mean)  # a feature's, or None
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.train(train)

    def forward(self, batch: Tensor | Mapping[str, Any]) -> Any:
        if isinstance(batch, Mapping):
            return {key: self.images(value) if key in self.entries else value for key, value in self.named(batch)}
        return self.images(batch)

    def named(self, batch: Mapping[str, Any]) -> Any:
        """A dict batch's items, once the entries named as images (image_entries) are all in it (else one line)."""
        missing = [key for key in self.entries if key not in batch]
        if not self.entries or missing:
            what = f"names {missing[0]!r}, which the batch lacks" if missing else "names none"
            raise ConfigError(
                "data._target_",
                f"makes dict batches (keys {', '.join(map(str, batch))}), and its image transform applies to the "
                f"entries its class's image_entries names, but it {what}; name the entries that hold images "
                f'(image_entries = ("image",))',
            )
        return batch.items()

    def images(self, images: Tensor) -> Tensor:
        x = images.float() / 255 if images.dtype == torch.uint8 else images.float()
        if x.shape[-2:] != (self.size, self.size):
            downscaling = x.shape[-2] > self.size or x.shape[-1] > self.size
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", antialias=downscaling)
        if self.training:
            x = self.augment(x)
        x = (x - self.mean.to(x.device)) / self.std.to(x.device)
        return x.contiguous(memory_format=self.memory_format)  # NHWC when the model is channels_last

    def augment(self, x: Tensor) -> Tensor:
        """The random part, on [0, 1] images. Every op is out of place: `x` may be the caller's tensor."""
        if self.padding:
            x = random_translate(x, self.padding)
        if self.horizontal_flip:
            flip = torch.rand(x.shape[0], device=x.device) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        return x if self.feature_ops is None else self.feature_ops(x)

    def extra_repr(self) -> str:
        mode = "train" if self.training else "eval"
        return f"size={self.size}, mode={mode}, crop_padding={self.padding}px, horizontal_flip={self.horizontal_flip}"


def augmenting_module(augmentation: Mapping | None, size: int, mean: Tensor) -> nn.Module | None:
    """What augments the training batches: the module that the first of the section's `_checks_` modules to declare
    `on_device_augment` builds, or None."""
    checks = (augmentation or {}).get("_checks_") or ()
    for name in [checks] if isinstance(checks, str) else list(dict(checks).values()):
        build = getattr(importlib.import_module(str(name)), "on_device_augment", None)
        if build is not None:
            return build(augmentation, size, mean)
    return None


def random_translate(x: Tensor, padding: int) -> Tensor:
    """Pad by `padding` pixels, then crop back at a random offset per sample: an exact integer shift of up to `padding`
    pixels per axis, no interpolation. The padding is zeros (black: the digits' background, the affine op's fill too);
    reflect padding (F.pad's mode="reflect", airbench's for CIFAR-10) would mirror a digit's strokes into the border."""
    batch, channels, height, width = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    offsets = torch.randint(0, 2 * padding + 1, (batch, 2), device=x.device)
    rows = offsets[:, :1] + torch.arange(height, device=x.device)  # [B, H]: padded row for each output row
    cols = offsets[:, 1:] + torch.arange(width, device=x.device)  # [B, W]
    x = padded.gather(2, rows.view(batch, 1, height, 1).expand(-1, channels, -1, padded.shape[-1]))
    return x.gather(3, cols.view(batch, 1, 1, width).expand(-1, channels, height, -1))
