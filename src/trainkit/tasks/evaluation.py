"""A model's loss and its task's metrics over a split, each sample counted exactly once: every rank evaluates its own
shard (split without padding), and the sums and counts are all-reduced before dividing."""

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from trainkit.data.loaders import limited
from trainkit.distributed.process_group import all_reduce_sum
from trainkit.runtime import autocast
from trainkit.tasks.task import Task, first_tensor, samples


def evaluate(
    model: nn.Module,
    loader: Iterable,
    transform: Callable[[torch.Tensor], torch.Tensor],
    task: Task,
    precision: str,
    device: torch.device,
    limit: int | None = None,
) -> dict:
    """{"loss", the task's metrics, "samples"} over the loader; the loss is the mean over what the task weighs."""
    model.eval()
    loss_sum, sums = torch.zeros(1, device=device), task.empty_metric_sums(device)
    weight, sample_count = torch.zeros(1, device=device), 0
    with torch.no_grad():
        for batch in limited(loader, limit):  # limit: the same seeded sample of batches on every call
            batch, outputs = evaluation_outputs(model, task.to_device(batch, device), transform, task, precision)
            targets = task.targets(batch)
            loss_sum += task.evaluation_loss(outputs, targets).sum()
            sums += task.metric_sums(outputs, targets)
            weight += task.weight(batch)
            sample_count += samples(batch)
    totals = all_reduce_sum(torch.cat([loss_sum, weight, torch.full((1,), float(sample_count), device=device), sums]))
    loss_sum, weight_sum, samples_sum = totals[:3].tolist()
    return {"loss": loss_sum / max(weight_sum, 1), **task.metrics(totals[3:]), "samples": int(samples_sum)}


def evaluation_outputs(
    model: nn.Module, batch: Any, transform: Callable[[torch.Tensor], torch.Tensor], task: Task, precision: str
) -> tuple[Any, Any]:
    """(the batch transformed, its outputs) as evaluation, the trackers' pictures and eval.py all see them. Call it
    under torch.no_grad(), in eval mode, with the batch on the device. The task's test-time augmentation, where a
    feature set one, is called in place of the model."""
    augmented = task.test_time_augmentation
    forward = model if augmented is None else augmented(model, task)
    device = first_tensor(batch).device
    with autocast(precision, device):
        batch = task.transform(batch, transform)
        outputs = task.outputs(forward, batch)
    return batch, outputs
