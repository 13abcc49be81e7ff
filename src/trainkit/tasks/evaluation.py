"""Evaluation: a model's loss and its task's metrics over a split, each sample counted exactly once.

    metrics = evaluate(model, data.val, eval_transform, task, precision, device)   # {"loss", "acc", ..., "samples"}
    batch, outputs = batch_outputs(model, batch, eval_transform, task, precision, device)  # one batch, as evaluated

train.py validates and tests with it; eval.py evaluates a trained checkpoint with it. Every rank
calls it on its own shard (the evaluation sampler splits without padding): the sums and counts
are all-reduced before dividing, never per-rank means.
"""

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from trainkit.data.loaders import limited
from trainkit.distributed.process_group import all_reduce_sum
from trainkit.runtime import autocast
from trainkit.tasks.batches import samples
from trainkit.tasks.task import Task


def evaluate(
    model: nn.Module,
    loader: Iterable,
    transform: Callable[[torch.Tensor], torch.Tensor],
    task: Task,
    precision: str,
    device: torch.device,
    limit: int | None = None,
    tta_flip: bool = False,
) -> dict:
    """The task's plain loss and metrics over each sample exactly once: sums and counts are
    all-reduced across ranks before dividing, never per-rank means. The loss is the mean over what
    the task weighs (task.weight): samples, or real tokens (val/loss per token). `tta_flip`: the
    outputs are the mean of the image's and its mirror's (trainer.tta_flip)."""
    model.eval()
    loss_sum, sums = torch.zeros(1, device=device), task.empty_metric_sums(device)
    weight, sample_count = torch.zeros(1, device=device), 0
    with torch.no_grad():
        for batch in limited(loader, limit):  # limit: a seeded sample of so many batches a process, every call the same
            batch, outputs = batch_outputs(model, batch, transform, task, precision, device, tta_flip)
            targets = task.targets(batch)
            loss_sum += task.evaluation_loss(outputs, targets).sum()
            sums += task.metric_sums(outputs, targets)
            weight += task.weight(batch)
            sample_count += samples(batch)
    counts = torch.cat([weight, torch.full((1,), float(sample_count), device=device)])
    totals = all_reduce_sum(torch.cat([loss_sum, counts, sums]))
    loss_sum, weight_sum, samples_sum = totals[:3].tolist()
    return {"loss": loss_sum / max(weight_sum, 1), **task.metrics(totals[3:]), "samples": int(samples_sum)}


def batch_outputs(
    model: nn.Module,
    batch: Any,
    transform: Callable[[Any], Any],
    task: Task,
    precision: str,
    device: torch.device,
    tta_flip: bool = False,
) -> tuple[Any, Any]:
    """(the batch on the device, transformed; the outputs the task scores): task.step's, as training makes them (a
    model of two inputs, or returning (logits, aux), is the task's to call). Evaluation and eval.py's figures."""
    forward = functools.partial(model_outputs, model, task=task, tta_flip=True) if tta_flip else model  # images
    with autocast(precision, device):
        batch = task.transform(task.to_device(batch, device), transform)
        _, outputs = task.step(forward, batch)  # the training loss, unused: val/loss is evaluation_loss's
    return batch, outputs


def model_outputs(model: nn.Module, inputs: torch.Tensor, task: Task, tta_flip: bool = False) -> torch.Tensor:
    """The model's outputs for a transformed batch; with `tta_flip`, the mean of the batch's and
    its mirror's (unmirrored by the task). Evaluation (the model its task.step calls), eval.py's
    figures and its predictions share it, so all three see the same outputs."""
    outputs = model(inputs)
    if tta_flip:
        outputs = (outputs + task.mirror_outputs(model(inputs.flip(-1)))) / 2
    return outputs
