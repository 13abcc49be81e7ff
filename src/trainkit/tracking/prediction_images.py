"""Predictions to look at while a run trains: after each validation, a few fixed validation images
with what the model predicts for them, for the tracker (`logger.log_predictions`: how many; W&B).

    shown = first_images(run.data.val, run.task, count, device)          # once, rank 0
    log_predictions(run.loggers, model, shown, transform, task, precision, device, step)   # each epoch

What a prediction is belongs to the task (`task.predict(outputs)`), so the loop stays the same
for every task: a task whose prediction is a mask (`{"mask": [B, H, W]}`, segmentation) is shown
as each image with its true and its predicted mask, which W&B draws over the image (toggled and
coloured by class in its UI). Other predictions (a class an image) are not shown: a class is a
number, and the epoch's accuracy already says more than four of them.

The same images every epoch, so the pictures show one thing changing: the model. Rank 0 alone
calls these, with the bare (or EMA) model and no collective, and draws no random number: the
training that follows is the same whether pictures are logged or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_map, tree_map_only

from trainkit.tasks.batches import first_tensor, rows, samples
from trainkit.tasks.evaluation import evaluation_outputs
from trainkit.tasks.task import Task
from trainkit.tracking.loggers import Loggers

# Tiny images (the 32x32 shapes) are enlarged by whole pixels to at least this side: W&B shows them at their size.
MIN_SIDE = 128


def first_images(loader: Iterable, task: Task, count: int, device: torch.device) -> Any:
    """The first `count` samples of `loader` as one batch of its own structure (a pair, a dict, ...), as loaded
    (before the eval transform), on `device`: the samples log_predictions shows every epoch."""
    parts, found = [], 0
    for batch in loader:
        batch = task.to_device(batch, device)
        parts.append(rows(batch, torch.arange(min(count - found, samples(batch)), device=device)))
        found += samples(parts[-1])
        if found >= count:
            break
    return tree_map(lambda first, *rest: torch.cat([first, *rest]) if isinstance(first, Tensor) else first, *parts)


def log_predictions(
    loggers: Loggers,
    model: nn.Module,
    shown: Any,
    transform: Callable[[Tensor], Tensor],
    task: Task,
    precision: str,
    device: torch.device,
    step: int,
    key: str = "val/predictions",
) -> None:
    """The model's predictions for the `shown` samples (first_images), as evaluation sees them (eval mode, the
    task's transform and outputs, its test-time augmentation: trainkit.tasks.evaluation.evaluation_outputs), to the
    loggers, when the task predicts masks (drawn over the images the task shows of the batch: task.shown_images)."""
    if callable(sample := getattr(task, "sample_for_logging", None)):  # a language model: a sample of its text
        if (logged := sample(model, shown)) is not None:
            key, text = logged
            loggers.log_text(key, text, step)
        return
    model.eval()
    with torch.no_grad():
        batch, outputs = evaluation_outputs(model, shown, transform, task, precision)
    predicted = task.predict(tree_map_only(Tensor, Tensor.float, outputs))
    images = task.shown_images(shown)
    if "mask" not in predicted or images is None:  # a class an image (or your task's own kind): nothing to draw
        return
    num_classes = first_tensor(outputs).shape[1]
    class_names = list(getattr(task, "class_names", None) or [str(k) for k in range(num_classes)])
    pictures, true_masks, predicted_masks = enlarged(images, task.targets(batch), predicted["mask"])
    loggers.log_masks(key, pictures, true_masks, predicted_masks, class_names, step)


def enlarged(images: Tensor, *masks: Tensor) -> tuple[Tensor, ...]:
    """Images [N, C, H, W] (uint8, or float in [0, 1]) as uint8 RGB [N, H', W', 3] on the CPU, and
    masks [N, H, W] likewise, both enlarged by the same whole factor (nearest: a mask keeps its
    classes) to at least MIN_SIDE pixels a side."""
    pictures = images.detach().cpu()
    if pictures.is_floating_point():
        pictures = (pictures.float().clamp(0, 1) * 255).round().to(torch.uint8)
    if pictures.shape[1] == 1:
        pictures = pictures.expand(-1, 3, -1, -1)
    factor = max(1, -(-MIN_SIDE // min(pictures.shape[-2:])))  # ceil division
    grown = [tensor.detach().cpu().repeat_interleave(factor, -2).repeat_interleave(factor, -1) for tensor in masks]
    pictures = pictures.repeat_interleave(factor, -2).repeat_interleave(factor, -1).permute(0, 2, 3, 1)
    return (pictures.contiguous(), *grown)
