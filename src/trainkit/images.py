"""Pictures of batches: a grid of images as a uint8 array, and a PNG writer.

train.py shows the augmented training samples the model really sees: the batch comes out of
`BatchTransform` normalized, so `image_grid` undoes the normalization before tiling. NumPy and
Pillow only: importing torchvision for `make_grid` would cost seconds at every start.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor


def image_grid(images: Tensor, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
               columns: int = 8, border: int = 1, border_value: int = 128) -> np.ndarray:
    """Normalized float images [B, C, H, W] (C = 1 or 3, any device) -> uint8 RGB grid [H', W', 3].

    Each image is un-normalized (`x * std + mean`, one value per channel or one for all),
    clamped to [0, 1], and tiled `columns` to a row with a `border`-pixel gray frame around and
    between tiles; grayscale images are repeated to RGB.
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected images [B, 1 or 3, H, W], got shape {tuple(images.shape)}")
    images = images.detach().to("cpu", torch.float32)
    channels = images.shape[1]
    if std is not None:
        images = images * torch.as_tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    if mean is not None:
        images = images + torch.as_tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()  # B, H, W, C
    if channels == 1:
        pixels = np.repeat(pixels, 3, axis=3)
    count, height, width = pixels.shape[:3]
    columns = max(1, min(columns, count))
    rows = max(1, math.ceil(count / columns))
    grid = np.full((rows * (height + border) + border, columns * (width + border) + border, 3),
                   border_value, dtype=np.uint8)
    for index, image in enumerate(pixels):
        top = border + (index // columns) * (height + border)
        left = border + (index % columns) * (width + border)
        grid[top:top + height, left:left + width] = image
    return grid


def save_png(array: np.ndarray, path: str | Path) -> Path:
    """Write a uint8 array [H, W, 3] (or [H, W]) as a PNG, creating its folder; returns the path."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(array, dtype=np.uint8)).save(path)
    return path


def augmented_samples(loader, transform, mean, std, device: torch.device, count: int = 32,
                      min_side: int = 32) -> np.ndarray:
    """A grid of the first training batch exactly as the model sees it after augmentation.

    The random draws happen in a forked RNG, so showing the samples does not change training.
    Tiles smaller than `min_side` pixels (8x8 digits) are enlarged by whole pixels, so they can be seen.
    """
    images = next(iter(loader))[0][:count].to(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        augmented = transform(images).float()
    scale = math.ceil(min_side / min(augmented.shape[-2:]))
    if scale > 1:
        augmented = torch.nn.functional.interpolate(augmented, scale_factor=scale, mode="nearest")
    return image_grid(augmented, mean, std)
