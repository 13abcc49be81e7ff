"""Evaluation: a model's loss and its task's metrics over a split, each sample counted exactly once.

    metrics = evaluate(model, data.val, eval_transform, task, precision, device)   # {"loss", "acc", ..., "samples"}
    batch, outputs = evaluation_outputs(model, batch, eval_transform, task, precision)  # a batch, as evaluate sees it

train.py validates and tests with it; eval.py evaluates a trained checkpoint with it. Every rank
calls it on its own shard (the evaluation sampler splits without padding): the sums and counts
are all-reduced before dividing, never per-rank means.
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
    """The task's plain loss and metrics over each sample exactly once: sums and counts are
    all-reduced across ranks before dividing, never per-rank means. The loss is the mean over what
    the task weighs (task.weight): samples, or real tokens (val/loss per token). `tta_flip`: the
    outputs are the mean of the image's and its mirror's (trainer.tta_flip)."""
    model.eval()
    loss_sum, sums = torch.zeros(1, device=device), task.empty_metric_sums(device)
    weight, sample_count = torch.zeros(1, device=device), 0
    with torch.no_grad():
        for batch in limited(loader, limit):  # limit: a seeded sample of so many batches a process, every call the same
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
    """(the batch transformed, its outputs) as evaluation sees them, for a batch on the device (any structure the
    task knows: trainkit.tasks.task; eval.py's predict= batches have None for targets): the task's transform, then
    task.outputs (what scoring and predict take), the model averaged with its mirror with `tta_flip`, under
    autocast for `precision`. Evaluation, the tracker's prediction images, eval.py's figures and its predictions
    share it. Call it under torch.no_grad(), in eval mode."""
    forward = with_mirror(model, task) if tta_flip else model  # images
    device = first_tensor(batch).device
    with autocast(precision, device):
        batch = task.transform(batch, transform)
        outputs = task.outputs(forward, batch)
    return batch, outputs


def with_mirror(model: Callable[..., Any], task: Task) -> Callable[..., Any]:
    """`model` averaged with its mirror (trainer.tta_flip), called as the model is: the model's outputs and those of
    the same call with every image batch among its arguments ([B, C, H, W], any number of them) mirrored along its
    width, unmirrored by the task (task.mirror_outputs), their mean leaf by leaf, so a tuple or dict of outputs
    (logits and embeddings, several heads) is averaged as one tensor is. Other arguments (lengths, token ids) are
    given as they are. One line naming trainer.tta_flip where nothing is mirrored or an output is not floating point
    (a class id has no mean)."""

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
        return output  # not a tensor (a None, a count): the same for both
    if not output.is_floating_point():
        raise ConfigError(
            "trainer.tta_flip",
            f"averages the model's outputs with its mirror's, but one is {output.dtype}, which has no mean; "
            f"return scores, or set it to false",
        )
    return (output + mirrored) / 2
