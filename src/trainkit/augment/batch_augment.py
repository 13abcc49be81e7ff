"""augmentation=strong: colour jitter, affine warps and random erasing, batched on the device with every random choice
drawn per sample (airbench style) from torch's global RNG on the batch's device (train.py seeds it with seed + rank),
and no Python loop over samples.

An augmentation section that names this module in `_checks_` has its keys checked here, and the core's
BatchTransform asks it for `on_device_augment`: the module that augments the [0, 1] training images after the resize
and the core's shift and flip (crop_padding, horizontal_flip), before normalizing. A missing or null key means "off";
conf/augmentation/strong.yaml sets each (color_jitter, affine, random_order, random_erasing) and says what it draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor, nn

from trainkit.config.schema import Check, flag, interval, number, section, unknown_keys

COLOR_JITTER_KEYS = ("brightness", "contrast", "saturation")
AFFINE_KEYS = ("degrees", "translate", "scale", "shear")
LUMA = (0.299, 0.587, 0.114)  # ITU-R 601 luma weights, as torchvision's rgb_to_grayscale
# The ops that change each pixel where it is: the others move the image alone, which a task with a target per pixel (a
# mask) refuses (trainkit.config.validation).
PIXEL_WISE_OPS = ("color_jitter", "random_erasing")


def on_device_augment(augmentation: Mapping, size: int, mean: Tensor) -> BatchAugment | None:
    """The module that augments [0, 1] training batches of `size`-pixel images as `augmentation` says, or None where it
    switches none of these ops on. Random erasing fills with `mean` ([1, C, 1, 1]), which normalizing makes 0."""
    ops = augmentation_ops(augmentation)
    return BatchAugment(ops, mean, bool(augmentation.get("random_order"))) if ops else None


class BatchAugment(nn.Module):
    """The ops `augmentation_ops` found, on [0, 1] images [B, C, H, W]: colour jitter and affine (in that order, or in
    a random order per sample), then random erasing. Every op is out of place."""

    mean: Tensor  # a buffer, registered in __init__

    def __init__(self, ops: Mapping[str, Any], mean: Tensor, random_order: bool):
        super().__init__()
        self.color_jitter = ops.get("color_jitter", {})
        self.affine = ops.get("affine", {})
        self.random_order = random_order
        self.random_erasing = ops.get("random_erasing", 0.0)
        self.register_buffer("mean", mean, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.color_jitter or self.affine:
            x = self.jitter_and_affine(x)
        if self.random_erasing:
            x = random_erasing(x, self.random_erasing, fill=self.mean.to(x.device))
        return x

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
            f"color_jitter={self.color_jitter or None}, affine={self.affine or None}, "
            f"random_order={self.random_order}, random_erasing={self.random_erasing}"
        )


# ---- the ops: each takes [B, C, H, W] images in [0, 1] -------------------------------------


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
    x: Tensor, degrees: float = 0.0, translate: float = 0.0, scale: Sequence[float] = (1.0, 1.0), shear: float = 0.0
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
    x: Tensor,
    probability: float,
    fill: Tensor | float = 0.0,
    scale: tuple[float, float] = (0.02, 0.33),
    ratio: tuple[float, float] = (0.3, 3.3),
) -> Tensor:
    """torchvision's RandomErasing, batched: each sample, with `probability`, gets one rectangle of U(scale) of its area
    and log-uniform aspect ratio `ratio` set to `fill` (the mean: exactly 0 once normalized), at a random position.
    torchvision retries a rectangle that does not fit; here its sides are clipped to the image instead, one draw for
    every sample."""
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
    return torch.where(mask, fill, x)


def augmentation_ops(augmentation: Mapping | None) -> dict[str, Any]:
    """The ops of this module that an augmentation section switches on, as plain values: {op: its options}. A key that
    is missing, null, false or zero is off, and so is an affine whose only setting is a [1, 1] scale."""
    options = dict(augmentation or {})
    ops: dict[str, Any] = {}
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


# ---- the checks of the augmentation section's keys -------------------------------------------


def ignored_settings(cfg: DictConfig) -> list[str]:
    ops = augmentation_ops(cfg.augmentation)
    if cfg.augmentation.get("random_order") and not ("color_jitter" in ops and "affine" in ops):
        return [
            "augmentation.random_order=true is ignored: it orders color_jitter and affine, and they are not both on"
        ]
    return []


CONFIG_RULES: dict[str, Check] = {
    "augmentation.color_jitter": section(COLOR_JITTER_KEYS),
    **{f"augmentation.color_jitter.{key}": number(0, null=True) for key in COLOR_JITTER_KEYS},
    "augmentation.affine": section(AFFINE_KEYS),
    "augmentation.affine.degrees": number(0, below=90, null=True),
    "augmentation.affine.translate": number(0, 1, null=True),
    "augmentation.affine.scale": interval(above=0, null=True),
    "augmentation.affine.shear": number(0, below=90, null=True),
    "augmentation.random_order": flag(null=True),
    "augmentation.random_erasing": number(0, 1, null=True),
}
CONFIG_RELATIONS = (
    unknown_keys("augmentation.color_jitter", COLOR_JITTER_KEYS),
    unknown_keys("augmentation.affine", AFFINE_KEYS),
)
