"""A model's loss and its task's metrics over a split, each sample counted exactly once.

Every rank evaluates its own shard (split without padding), and the sums and counts are all-reduced before
dividing. train.py validates and tests with it; eval.py evaluates a checkpoint with it.
"""

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map, tree_map_only

from trainkit.data.loaders import limited
from trainkit.distributed.process_group import all_reduce_sum
from trainkit.errors import ConfigError
from trainkit.runtime import autocast
from trainkit.tasks.batches import first_tensor, samples
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
    """{"loss", the task's metrics, "samples"} over the loader; the loss is the mean over what the task weighs."""
    model.eval()
    loss_sum, sums = torch.zeros(1, device=device), task.empty_metric_sums(device)
    weight, sample_count = torch.zeros(1, device=device), 0
    with torch.no_grad():
        for batch in limited(loader, limit):  # limit: the same seeded sample of batches on every call
            batch, outputs = evaluation_outputs(
                model, task.to_device(batch, device), transform, task, precision, tta_flip
            )
            targets = task.targets(batch)
            loss_sum += task.evaluation_loss(outputs, targets).sum()
            sums += task.metric_sums(outputs, targets)
            weight += task.weight(batch)
            sample_count += samples(batch)
    counts = torch.cat([weight, torch.full((1,), float(sample_count), device=device)])
    totals = all_reduce_sum(torch.cat([loss_sum, counts, sums]))
    loss_sum, weight_sum, samples_sum = totals[:3].tolist()
    return {"loss": loss_sum / max(weight_sum, 1), **task.metrics(totals[3:]), "samples": int(samples_sum)}


def evaluation_outputs(
    model: nn.Module,
    batch: Any,
    transform: Callable[[torch.Tensor], torch.Tensor],
    task: Task,
    precision: str,
    tta_flip: bool = False,
) -> tuple[Any, Any]:
    """(the batch transformed, its outputs) as evaluation, the trackers' pictures and eval.py all see them.

    Call it under torch.no_grad(), in eval mode, with the batch on the device."""
    forward = with_mirror(model, task) if tta_flip else model  # images
    device = first_tensor(batch).device
    with autocast(precision, device):
        batch = task.transform(batch, transform)
        outputs = task.outputs(forward, batch)
    return batch, outputs


def with_mirror(model: Callable[..., Any], task: Task) -> Callable[..., Any]:
    """`model` averaged with its mirror (trainer.tta_flip): each [B, C, H, W] argument is mirrored along its width,
    the task unmirrors the outputs, and the two are averaged leaf by leaf. Refused in one line when no argument is
    an image batch or an output is not floating point."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        images = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor) and leaf.dim() == 4]
        if not images:
            raise ConfigError(
                "trainer.tta_flip", "mirrors image batches [B, C, H, W], but the model is given none; set it to false"
            )
        outputs = model(*args, **kwargs)
        mirrored_args, mirrored_kwargs = tree_map_only(
            torch.Tensor, lambda leaf: leaf.flip(-1) if leaf.dim() == 4 else leaf, (args, kwargs)
        )
        mirrored = task.mirror_outputs(model(*mirrored_args, **mirrored_kwargs))
        return tree_map(mean_of_two, outputs, mirrored)

    return forward


def mean_of_two(output: Any, mirrored: Any) -> Any:
    if not isinstance(output, torch.Tensor):
        return output
    if not output.is_floating_point():
        raise ConfigError(
            "trainer.tta_flip",
            f"averages the model's outputs with its mirror's, but one is {output.dtype}, which has no mean; "
            f"return scores, or set it to false",
        )
    return (output + mirrored) / 2
