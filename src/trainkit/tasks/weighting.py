"""A batch's micro-batch parts (trainer.micro_batch_size) and how each part weighs in its update's gradient.

By samples, a part's mean loss weighs its share of the batch over the batches of its update; by tokens, the update's
loss becomes the mean over all of its real tokens, on every rank: docs/how-the-loop-works.md explains why.
"""

from typing import Any

import torch
from torch import Tensor, nn

from trainkit.distributed.process_group import all_reduce_sum
from trainkit.tasks.batches import first_tensor, samples, split
from trainkit.tasks.task import Task


def micro_batches(batch: Any, size: int | None, sized: bool = False) -> list[tuple[Any, float]]:
    """(part, share of the batch) for each part of at most `size` samples; the whole batch, uncopied, when `size` is
    None or not smaller. For `sized` data (a padded [B, T] first tensor), `size` counts units: size // T items."""
    total = samples(batch)
    if size is not None and sized:
        size = max(1, size // max(1, first_tensor(batch)[0].numel()))
    if size is None or size >= total:
        return [(batch, 1.0)]
    return [(part, samples(part) / total) for part in split(batch, size)]


def mean_over_update_tokens(task: Task, model: nn.Module, update_weight: int | Tensor, world_size: int) -> None:
    """For a task that weighs tokens, divides the gradients by the update's real tokens on all ranks (one
    all-reduce, so every rank must call it at the same update)."""
    if task.weighs != "tokens":
        return
    total = all_reduce_sum(torch.as_tensor(update_weight, dtype=torch.float32).reshape(1).clone())
    factor = (world_size / total.clamp(min=1)).reshape(())
    for param in model.parameters():
        if param.grad is not None:
            param.grad.mul_(factor)
