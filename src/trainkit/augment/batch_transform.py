"""Batched image transforms that run on the device, one random draw per sample (airbench style).

`BatchTransform` turns a batch of raw images (uint8 0..255 or float 0..1, any device) into the normalized float32 batch
the model eats: scale to [0, 1] -> resize -> augment (training only) -> normalize. Every random choice is drawn per
sample from torch's global RNG on the batch's device (train.py seeds it with seed + rank), with no Python loop over
samples, so augmenting a batch costs a few tensor ops instead of a DataLoader worker per image.

The augmentation config (conf/augmentation/*.yaml) is checked by trainkit.config.validation before anything is built,
and read here by `active_ops`; a missing or null key means "off":

    name: strong                # none | shift | basic | strong (a label; `none` means no ops)
    crop_padding: 0.125         # pad by this fraction of the size, crop back at a random offset
    horizontal_flip: true       # mirror a random half of the samples
    color_jitter: {brightness: 0.4, contrast: 0.4, saturation: 0.4}
    affine: {degrees: 15, translate: 0.1, scale: [0.9, 1.1], shear: 10}
    random_order: true          # colour jitter and affine in a random order, per sample
    random_erasing: 0.25        # erase a random rectangle of this fraction of the samples (after normalizing)

The same section may hold keys of a feature that runs elsewhere (after this transform, or in the DataLoader workers); it
names the module that checks and reads them (`_checks_`: docs/features.md), and `active_ops` leaves them to it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainkit.errors import ConfigError

# ITU-R 601 luma weights, as torchvision's rgb_to_grayscale.
LUMA = (0.299, 0.587, 0.114)


class BatchTransform(nn.Module):
    """uint8 or [0, 1] float images [B, C, H, W] -> normalized float32 [B, C, size, size].

    `augmentation` is the augmentation config (a DictConfig or dict, checked beforehand by
    trainkit.config.validation.validate; None: no augmentation); `mean` and `std` hold one value per channel, or one for
    all. It only runs in training mode: `train=False` builds the module in eval mode, and `.train()` / `.eval()` switch
    it like any module. `channels_last=True` returns NHWC batches for a model converted to channels_last. A dict batch
    (image + text, two views) is transformed in the `entries` that hold its images (the data option's `image_entries`);
    its other entries pass as they are.
    """

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

        ops = active_ops(augmentation)
        self.padding = max(1, round(ops["crop_padding"] * size)) if "crop_padding" in ops else 0
        self.horizontal_flip = ops.get("horizontal_flip", False)
        self.color_jitter = ops.get("color_jitter", {})
        self.affine = ops.get("affine", {})
        self.random_order = bool((augmentation or {}).get("random_order"))
        self.random_erasing = ops.get("random_erasing", 0.0)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.train(train)

    def forward(self, batch: Tensor | Mapping[str, Any]) -> Any:
        if isinstance(batch, Mapping):
            return {key: self.images(value) if key in self.entries else value for key, value in self.named(batch)}
        return self.images(batch)

    def named(self, batch: Mapping[str, Any]) -> Any:
        """A dict batch's items, once its entries of images are known to be there: a dict with none named, or
        without one named, is one line (the data option's class names them in image_entries)."""
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
            x = F.interpolate(
                x, size=(self.size, self.size), mode="bilinear", align_corners=False, antialias=downscaling
            )
        if self.training:
            x = self.augment(x)
        x = (x - self.mean.to(x.device)) / self.std.to(x.device)
        if self.training and self.random_erasing:
            x = random_erasing(x, self.random_erasing)
        return x.contiguous(memory_format=self.memory_format)  # NHWC when the model is channels_last

    def augment(self, x: Tensor) -> Tensor:
        """The random part, on [0, 1] images. Every op is out of place: `x` may be the caller's tensor."""
        if self.padding:
            x = random_translate(x, self.padding)
        if self.horizontal_flip:
            flip = torch.rand(x.shape[0], device=x.device) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        return self.jitter_and_affine(x) if self.color_jitter or self.affine else x

    def jitter_and_affine(self, x: Tensor) -> Tensor:
        """Color jitter and the affine warp, in that order or (random_order) in either, chosen per sample."""
        # Draw the parameters once, so that both orders below apply the same per-sample choices.
        jitter = draw_color_jitter(x, **self.color_jitter) if self.color_jitter else None
        affine = draw_affine(x, **self.affine) if self.affine else None
        jitter_first = apply_affine(apply_color_jitter(x, jitter), affine)
        if not (self.random_order and self.color_jitter and self.affine):
            return jitter_first
        # Computing both orders and choosing per sample costs one more pass of each op; it is
        # simpler than splitting the batch and keeps every sample's own parameters.
        affine_first = apply_color_jitter(apply_affine(x, affine), jitter)
        use_jitter_first = torch.rand(x.shape[0], device=x.device) < 0.5
        return torch.where(use_jitter_first.view(-1, 1, 1, 1), jitter_first, affine_first)

    def extra_repr(self) -> str:
        return (
            f"size={self.size}, mode={'train' if self.training else 'eval'}, crop_padding={self.padding}px, "
            f"horizontal_flip={self.horizontal_flip}, color_jitter={self.color_jitter or None}, "
            f"affine={self.affine or None}, random_order={self.random_order}, random_erasing={self.random_erasing}"
        )


# ---- the ops: each takes [B, C, H, W] images in [0, 1] -------------------------------------


def random_translate(x: Tensor, padding: int) -> Tensor:
    """Pad by `padding` pixels, then crop back at a random offset per sample: an exact integer shift of up to `padding`
    pixels per axis, no interpolation.

    The padding is zeros (black, in [0, 1] space): the background of digits and MNIST, and the same fill as the affine
    op's, so every geometric op agrees on what enters from outside. Reflect padding (airbench's choice for CIFAR-10)
    would mirror a digit's strokes into the border; change `F.pad`'s mode here if you prefer it for natural images.
    """
    batch, channels, height, width = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    offsets = torch.randint(0, 2 * padding + 1, (batch, 2), device=x.device)
    rows = offsets[:, :1] + torch.arange(height, device=x.device)  # [B, H]: padded row for each output row
    cols = offsets[:, 1:] + torch.arange(width, device=x.device)  # [B, W]
    x = padded.gather(2, rows.view(batch, 1, height, 1).expand(-1, channels, -1, padded.shape[-1]))
    return x.gather(3, cols.view(batch, 1, 1, width).expand(-1, channels, height, -1))


def draw_color_jitter(x: Tensor, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0) -> Tensor:
    """Per-sample factors [B, 3] (brightness, contrast, saturation), each from [1 - s, 1 + s]."""
    strengths = torch.tensor([brightness, contrast, saturation], device=x.device)
    low, high = (1 - strengths).clamp(min=0), 1 + strengths
    return low + (high - low) * torch.rand(x.shape[0], 3, device=x.device)


def apply_color_jitter(x: Tensor, factors: Tensor | None) -> Tensor:
    """Brightness (scale), contrast (blend with the image's mean grey), saturation (blend with
    the greyscale image; a no-op for one channel), clamping to [0, 1] after each, as torchvision."""
    if factors is None:
        return x
    brightness, contrast, saturation = (factors[:, i].view(-1, 1, 1, 1) for i in range(3))
    x = (x * brightness).clamp(0, 1)
    mean_grey = grey(x).mean(dim=(1, 2, 3), keepdim=True)
    x = (contrast * x + (1 - contrast) * mean_grey).clamp(0, 1)
    if x.shape[1] == 3:
        x = (saturation * x + (1 - saturation) * grey(x)).clamp(0, 1)
    return x


def grey(x: Tensor) -> Tensor:
    """[B, 1, H, W] luma of RGB images; other channel counts are averaged."""
    if x.shape[1] != 3:
        return x.mean(dim=1, keepdim=True)
    weights = torch.tensor(LUMA, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(dim=1, keepdim=True)


def draw_affine(
    x: Tensor,
    degrees: float = 0.0,
    translate: float = 0.0,
    scale: Sequence[float] = (1.0, 1.0),
    shear: float = 0.0,
) -> Tensor:
    """Per-sample sampling matrices [B, 2, 3] for F.affine_grid.

    The drawn transform maps input to output points: rotate by U(-degrees, degrees), shear
    along x by U(-shear, shear) degrees, scale by U(scale), shift by U(-translate, translate)
    of the image size per axis. affine_grid wants the inverse (output -> input), taken here.
    """
    batch, device = x.shape[0], x.device

    def uniform(low: float, high: float) -> Tensor:
        return low + (high - low) * torch.rand(batch, device=device)

    angle = uniform(-degrees, degrees) * (math.pi / 180)
    shear_tan = torch.tan(uniform(-shear, shear) * (math.pi / 180))
    zoom = uniform(scale[0], scale[1]).view(-1, 1, 1)
    shift = 2 * torch.stack([uniform(-translate, translate), uniform(-translate, translate)], dim=1)
    # Normalized coordinates span 2 per image side, hence the 2 above: a shift of t sizes is 2t.
    # Forward map: p -> zoom * rotation @ shear @ p + shift; inverse: p -> shear^-1 @ rotation^T @ (p - shift) / zoom.
    cos, sin, zero, one = angle.cos(), angle.sin(), torch.zeros_like(angle), torch.ones_like(angle)
    rotation_t = torch.stack([cos, sin, -sin, cos], dim=1).view(-1, 2, 2)
    shear_inverse = torch.stack([one, -shear_tan, zero, one], dim=1).view(-1, 2, 2)
    inverse = shear_inverse @ rotation_t / zoom
    return torch.cat([inverse, -inverse @ shift.unsqueeze(-1)], dim=2)


def apply_affine(x: Tensor, theta: Tensor | None) -> Tensor:
    """Resample with per-sample matrices from `draw_affine`: bilinear, zeros outside."""
    if theta is None:
        return x
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def random_erasing(
    x: Tensor, probability: float, scale: tuple[float, float] = (0.02, 0.33), ratio: tuple[float, float] = (0.3, 3.3)
) -> Tensor:
    """torchvision's RandomErasing, batched: each sample, with `probability`, gets one rectangle
    of U(scale) of its area and log-uniform aspect ratio `ratio` set to 0 (the mean, as the batch
    is normalized by then), at a random position. torchvision retries a rectangle that does not
    fit; here its sides are clipped to the image instead, one draw for every sample."""
    batch, _, height, width = x.shape
    device = x.device
    area = height * width * (scale[0] + (scale[1] - scale[0]) * torch.rand(batch, device=device))
    log_ratio = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * torch.rand(batch, device=device)
    aspect = log_ratio.exp()
    rows = (area * aspect).sqrt().round().clamp(1, height)  # rectangle height, per sample
    cols = (area / aspect).sqrt().round().clamp(1, width)
    top = (torch.rand(batch, device=device) * (height - rows + 1)).floor()
    left = (torch.rand(batch, device=device) * (width - cols + 1)).floor()
    erase = torch.rand(batch, device=device) < probability
    y = torch.arange(height, device=device).view(1, -1)
    xs = torch.arange(width, device=device).view(1, -1)
    inside_rows = (y >= top.view(-1, 1)) & (y < (top + rows).view(-1, 1))  # [B, H]
    inside_cols = (xs >= left.view(-1, 1)) & (xs < (left + cols).view(-1, 1))  # [B, W]
    mask = inside_rows.view(batch, 1, height, 1) & inside_cols.view(batch, 1, 1, width) & erase.view(-1, 1, 1, 1)
    return x.masked_fill(mask, 0.0)


# ---- reading the (already checked) augmentation config ---------------------------------------


def active_ops(augmentation: Mapping | None) -> dict[str, Any]:
    """The ops of this module that an augmentation config switches on, as plain values: {op: its options}.

    A key that is missing, null, false or zero is off, and so is an affine whose only setting is a [1, 1] scale. The
    values are not checked here: trainkit.config.validation checks them before anything is built.
    """
    options = dict(augmentation or {})
    ops: dict[str, Any] = {}
    if options.get("crop_padding"):
        ops["crop_padding"] = float(options["crop_padding"])
    if options.get("horizontal_flip"):
        ops["horizontal_flip"] = True
    jitter = {key: float(value) for key, value in dict(options.get("color_jitter") or {}).items() if value}
    if jitter:
        ops["color_jitter"] = jitter
    affine = {
        key: tuple(float(v) for v in value) if key == "scale" else float(value)
        for key, value in dict(options.get("affine") or {}).items()
        if value
    }
    if affine.get("scale") == (1.0, 1.0):
        del affine["scale"]
    if affine:
        ops["affine"] = affine
    if options.get("random_erasing"):
        ops["random_erasing"] = float(options["random_erasing"])
    return ops
