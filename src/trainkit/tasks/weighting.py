"""A batch's parts (trainer.micro_batch_size) and how the parts of an update weigh in its gradient: by samples (as a
mean of batch means), or by real tokens.

    for part, share in micro_batches(batch, micro_batch_size, sized):   # the whole batch, or parts of N samples
    scale = task.weight(part) if task.weighs == "tokens" else share / group_size   # train.py's train_step
    scaler.scale(loss * scale).backward()                   # each micro-batch part of each batch of the update
    mean_over_update_tokens(task, model, update_weight, world_size)   # at the update, before clipping and the step

A task that weighs samples (classification, segmentation): a part's mean loss weighs its share of the batch
and 1 / the batches of its update, exactly as before tokens were weighed. A task that weighs tokens (a
language model, a padded sequence classifier): a part's mean loss times its real tokens is the sum of its
token losses; at the update the gradients are divided by the real tokens of the whole update (all-reduced
over the ranks) and multiplied by the number of ranks (DDP and FSDP average gradients over ranks), so the
update's loss is the mean over every real token of it: across micro-batches, accumulated batches and ranks,
however unevenly the tokens fall.
"""

from typing import Any

import torch
from torch import Tensor, nn

from trainkit.distributed.process_group import all_reduce_sum
from trainkit.tasks.batches import first_tensor, samples, split
from trainkit.tasks.task import Task


def micro_batches(batch: Any, size: int | None, sized: bool = False) -> list[tuple[Any, float]]:
    """(part, share of the batch) for each part of at most `size` samples, cut from every tensor of the batch
    (any nested structure: trainkit.tasks.batches.split); the whole batch as its one part when `size` is None
    or not smaller than the batch (no copy, no extra op). `sized` (items of many sizes, Data.size_unit: the
    batch's first tensor holds them padded, [B, T]; token ids): `size` counts units (tokens), a part holds
    size // T items (at least one)."""
    total = samples(batch)
    if size is not None and sized:
        size = max(1, size // max(1, first_tensor(batch)[0].numel()))
    if size is None or size >= total:
        return [(batch, 1.0)]
    return [(part, samples(part) / total) for part in split(batch, size)]


def mean_over_update_tokens(task: Task, model: nn.Module, update_weight: int | Tensor, world_size: int) -> None:
    """A tokens task: gradients summed over the update's token losses become their mean over all of the update's
    real tokens, every rank's (one all-reduce; every rank calls it at the same update). Nothing for samples."""
    if task.weighs != "tokens":
        return
    total = all_reduce_sum(torch.as_tensor(update_weight, dtype=torch.float32).reshape(1).clone())
    factor = (world_size / total.clamp(min=1)).reshape(())
    for param in model.parameters():
        if param.grad is not None:
            param.grad.mul_(factor)
