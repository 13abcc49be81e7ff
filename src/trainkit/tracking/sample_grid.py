"""`logger.log_images`: a grid of the augmented training samples the model really sees, to every tracker
(`train/samples`) and as train_samples.png, once a run, before it trains (trainkit.tracking.prediction_images, which
holds the key's check, calls `log_train_samples`).

The batch comes out of `BatchTransform` normalized, so `image_grid` undoes the normalization before tiling. The
tiling is torchvision's `make_grid`, imported inside `image_grid`: importing torchvision costs about 2 s on top of
torch, and grids are made only when a tracker logs images, so a run without them never pays it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trainkit.data.image_files import save_png
from trainkit.tasks.task import Task, rows, samples


def image_grid(
    images: Tensor,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    columns: int = 8,
    border: int = 1,
    border_value: int = 128,
) -> np.ndarray:
    """Normalized float images [B, C, H, W] (C = 1 or 3, any device) -> uint8 RGB grid [H', W', 3].

    Each image is un-normalized (`x * std + mean`, one value per channel or one for all), clamped to [0, 1], and tiled
    `columns` to a row with a `border`-pixel gray frame around and between tiles; grayscale images are repeated to RGB.
    """
    from torchvision.utils import make_grid

    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected images [B, 1 or 3, H, W], got shape {tuple(images.shape)}")
    images = images.detach().to("cpu", torch.float32)
    if std is not None:
        images = images * torch.as_tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    if mean is not None:
        images = images + torch.as_tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    pad_value = border_value / 255
    grid = make_grid(images.clamp(0, 1), nrow=columns, padding=border, pad_value=pad_value)  # [3, H', W']
    if len(images) == 1:  # make_grid hands a lone image back without its frame
        grid = torch.nn.functional.pad(grid, (border,) * 4, value=pad_value)
    return (grid * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def augmented_samples(
    loader: Iterable[Any],
    transform: Callable[[Any], Any],
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    device: torch.device,
    count: int = 32,
    min_side: int = 32,
    task: Task | None = None,
) -> np.ndarray | None:
    """A grid of the first training batch's first `count` samples exactly as the model sees them after
    augmentation (`task.transform`), of the images the task shows of a batch (`task.shown_images`; a pair's
    inputs): None where it shows none (a batch without images).

    The random draws happen in a forked RNG, so showing the samples does not change training.
    Tiles smaller than `min_side` pixels (8x8 digits) are enlarged by whole pixels, so they can be seen.
    """
    task = task or Task()
    batch = task.to_device(next(iter(loader)), device)
    batch = rows(batch, torch.arange(min(count, samples(batch)), device=device))
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        images = task.shown_images(task.transform(batch, transform))
    if images is None:
        return None
    augmented = images.float()
    scale = math.ceil(min_side / min(augmented.shape[-2:]))
    if scale > 1:
        augmented = torch.nn.functional.interpolate(augmented, scale_factor=scale, mode="nearest")
    return image_grid(augmented, mean, std)


def log_train_samples(run: Any) -> None:
    """Rank 0, before training and not on a resume: the grid of augmented samples (of `Run`, trainkit/run.py) to the
    loggers and train_samples.png, where `logger.log_images` is on and the data are images that the task shows."""
    if not run.cfg.logger.get("log_images", False) or run.data.kind != "image" or run.cfg.resume:
        return
    data = run.data
    grid = augmented_samples(data.train, run.train_transform, data.mean, data.std, run.device, task=run.task)
    if grid is not None:  # what the task shows of a batch: none where it holds no images
        run.loggers.log_image("train/samples", save_png(grid, run.run_dir / "train_samples.png"), run.state.step)
