"""Batched image transforms that run on the device, one random draw per sample (airbench style).

`BatchTransform` turns a batch of raw images (uint8 0..255 or float 0..1, any device) into the
normalized float32 batch the model eats: scale to [0, 1] -> resize -> augment (training only)
-> normalize. Every random choice is drawn per sample from torch's global RNG on the batch's
device (train.py seeds it with seed + rank), with no Python loop over samples, so augmenting
a batch costs a few tensor ops instead of a DataLoader worker per image.

The augmentation config (conf/augmentation/*.yaml) is read once, here; a missing key means
"off":

    name: strong                # none | shift | basic | strong (a label; `none` means no ops)
    crop_padding: 0.125         # pad by this fraction of the size, crop back at a random offset
    horizontal_flip: true       # mirror a random half of the samples
    color_jitter: {brightness: 0.4, contrast: 0.4, saturation: 0.4}
    affine: {degrees: 15, translate: 0.1, scale: [0.9, 1.1], shear: 10}
    random_order: true          # colour jitter and affine in a random order, per sample
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainkit.errors import ConfigError

# Accepted values of augmentation.name. The name is a label (the keys decide what runs), but a
# closed list catches typos; add yours here when you add a conf/augmentation/<name>.yaml.
NAMES = ("none", "shift", "basic", "strong")
KEYS = ("name", "crop_padding", "horizontal_flip", "color_jitter", "affine", "random_order")
COLOR_JITTER_KEYS = ("brightness", "contrast", "saturation")
AFFINE_KEYS = ("degrees", "translate", "scale", "shear")
# ITU-R 601 luma weights, as torchvision's rgb_to_grayscale.
LUMA = (0.299, 0.587, 0.114)


class BatchTransform(nn.Module):
    """uint8 or [0, 1] float images [B, C, H, W] -> normalized float32 [B, C, size, size].

    `augmentation` is the augmentation config (a DictConfig or dict; None: no augmentation).
    It only runs in training mode: `train=False` builds the module in eval mode, and
    `.train()` / `.eval()` switch it like any module. `channels_last=True` returns NHWC batches
    for a model converted to channels_last.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        size: int,
        augmentation: Mapping | None = None,
        train: bool = False,
        channels_last: bool = False,
    ):
        super().__init__()
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        mean, std = _floats("data.mean", mean), _floats("data.std", std)
        if len(mean) != len(std):
            raise ConfigError("data.std", f"has {len(std)} values but data.mean has {len(mean)}; give one per channel")
        if min(std) <= 0:
            raise ConfigError("data.std", f"must be positive, got {std}")
        self.size = size
        # Non-persistent: they follow .to(device) but stay out of checkpoints.
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

        options = _parse(augmentation)
        self.padding = max(1, round(options["crop_padding"] * size)) if options["crop_padding"] > 0 else 0
        self.horizontal_flip = options["horizontal_flip"]
        self.color_jitter = options["color_jitter"]  # {} when off
        self.affine = options["affine"]  # {} when off
        self.random_order = options["random_order"]
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.train(train)

    def forward(self, images: Tensor) -> Tensor:
        x = images.float() / 255 if images.dtype == torch.uint8 else images.float()
        if x.shape[-2:] != (self.size, self.size):
            downscaling = x.shape[-2] > self.size or x.shape[-1] > self.size
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False, antialias=downscaling)
        if self.training:
            x = self.augment(x)
        if self.mean.shape[1] not in (1, x.shape[1]):
            raise ConfigError("data.mean", f"has {self.mean.shape[1]} values for {x.shape[1]}-channel images; give 1 or {x.shape[1]}")
        x = (x - self.mean.to(x.device)) / self.std.to(x.device)
        return x.contiguous(memory_format=self.memory_format)  # NHWC when the model is channels_last

    def augment(self, x: Tensor) -> Tensor:
        """The random part, on [0, 1] images. Every op is out of place: `x` may be the caller's tensor."""
        if self.padding:
            x = random_translate(x, self.padding)
        if self.horizontal_flip:
            flip = torch.rand(x.shape[0], device=x.device) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
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
            f"affine={self.affine or None}, random_order={self.random_order}"
        )


# ---- the ops: each takes [B, C, H, W] images in [0, 1] -------------------------------------


def random_translate(x: Tensor, padding: int) -> Tensor:
    """Pad by `padding` pixels, then crop back at a random offset per sample: an exact integer
    shift of up to `padding` pixels per axis, no interpolation.

    The padding is zeros (black, in [0, 1] space): the background of digits and MNIST, and the
    same fill as the affine op's, so every geometric op agrees on what enters from outside.
    Reflect padding (airbench's choice for CIFAR-10) would mirror a digit's strokes into the
    border; change `F.pad`'s mode here if you prefer it for natural images.
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
    # Forward map: p -> zoom * rotation @ shear @ p + shift. Its inverse, written out:
    # p -> shear^-1 @ rotation^T @ (p - shift) / zoom.
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


# ---- config checking: all errors name the key and say how to fix it -------------------------


def _parse(augmentation: Mapping | None) -> dict:
    """The augmentation config as plain, checked values, every op present (off = falsy)."""
    if augmentation is None:
        augmentation = {"name": "none"}
    if not isinstance(augmentation, Mapping):  # a DictConfig is a Mapping
        raise ConfigError("augmentation", f"must be a mapping of options, got {type(augmentation).__name__}")
    augmentation = dict(augmentation)
    for key in augmentation:
        if key not in KEYS:
            raise ConfigError(f"augmentation.{key}", f"unknown key; the known keys are {', '.join(KEYS)}")
    name = augmentation.get("name")
    if name not in NAMES:
        raise ConfigError(
            "augmentation.name",
            f"unknown name {name!r}; use one of {', '.join(NAMES)} (or add yours to NAMES in trainkit/augment.py)",
        )
    crop_padding = _number(augmentation, "crop_padding", 0.0)
    if not 0 <= crop_padding <= 0.5:
        raise ConfigError("augmentation.crop_padding", f"must be a fraction of the image size in [0, 0.5], got {crop_padding}")
    options = {
        "crop_padding": crop_padding,
        "horizontal_flip": _bool(augmentation, "horizontal_flip"),
        "color_jitter": _color_jitter(augmentation.get("color_jitter")),
        "affine": _affine(augmentation.get("affine")),
        "random_order": _bool(augmentation, "random_order"),
    }
    active = [key for key, value in options.items() if value and key != "random_order"]
    if name == "none" and active:
        raise ConfigError("augmentation.name", f"is 'none' but {', '.join(active)} is on; pick a name that augments or turn it off")
    return options


def _color_jitter(section) -> dict:
    section = _section("color_jitter", section, COLOR_JITTER_KEYS)
    options = {key: _number(section, key, 0.0, prefix="augmentation.color_jitter") for key in COLOR_JITTER_KEYS}
    for key, value in options.items():
        if value < 0:
            raise ConfigError(f"augmentation.color_jitter.{key}", f"must be >= 0 (factors come from [1 - s, 1 + s]), got {value}")
    return options if any(options.values()) else {}


def _affine(section) -> dict:
    section = _section("affine", section, AFFINE_KEYS)
    prefix = "augmentation.affine"
    options = {key: _number(section, key, 0.0, prefix=prefix) for key in ("degrees", "translate", "shear")}
    for key in ("degrees", "shear"):
        if not 0 <= options[key] < 90:
            raise ConfigError(f"{prefix}.{key}", f"must be in [0, 90) degrees, got {options[key]}")
    if not 0 <= options["translate"] <= 1:
        raise ConfigError(f"{prefix}.translate", f"must be a fraction of the image size in [0, 1], got {options['translate']}")
    scale = section.get("scale") or [1.0, 1.0]
    if not isinstance(scale, Sequence) or isinstance(scale, str) or len(scale) != 2:
        raise ConfigError(f"{prefix}.scale", f"must be a range [low, high], e.g. [0.9, 1.1]; got {scale!r}")
    scale = _floats(f"{prefix}.scale", scale)
    if not 0 < scale[0] <= scale[1]:
        raise ConfigError(f"{prefix}.scale", f"needs 0 < low <= high, got {scale}")
    options["scale"] = tuple(scale)
    off = not any(options[key] for key in ("degrees", "translate", "shear")) and scale == [1.0, 1.0]
    return {} if off else options


def _section(key: str, section, known: Sequence[str]) -> dict:
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"augmentation.{key}", f"must be a mapping with keys {', '.join(known)}, or null for off")
    for subkey in section:
        if subkey not in known:
            raise ConfigError(f"augmentation.{key}.{subkey}", f"unknown key; the known keys are {', '.join(known)}")
    return dict(section)


def _number(section: Mapping, key: str, default: float, prefix: str = "augmentation") -> float:
    value = section.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{prefix}.{key}", f"must be a number, got {value!r}")
    return float(value)


def _bool(section: Mapping, key: str) -> bool:
    value = section.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"augmentation.{key}", f"must be true or false, got {value!r}")
    return value


def _floats(key: str, values) -> list[float]:
    if isinstance(values, (int, float)):
        values = [values]
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        values = [None]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise ConfigError(key, f"must be a number or a list of numbers, e.g. [0.5] or [0.49, 0.48, 0.45]; got {values!r}")
    return [float(v) for v in values]
