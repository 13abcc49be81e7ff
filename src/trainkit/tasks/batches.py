"""A batch is whatever the data's loader yields: a pair, a tuple, a dict of tensors, lengths beside values,
several inputs, nested. Its tensors share their first dimension, the samples. These move, count, pick and cut
any such batch (torch's pytree utilities walk it); what a batch means is the task's (trainkit.tasks.task).

    batch = to_device(batch, device)           # every tensor of it, non-blocking
    samples(batch)                             # its samples: the first dimension of its tensors
    rows(batch, index)                         # the same samples of every tensor (the finders repeat a batch)
    split(batch, size)                         # parts of `size` samples (the last may be smaller)
"""

from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten

from trainkit.errors import ConfigError


def to_device(batch: Any, device: torch.device) -> Any:
    return tree_map_only(Tensor, lambda tensor: tensor.to(device, non_blocking=True), batch)


def detach(outputs: Any) -> Any:
    return tree_map_only(Tensor, Tensor.detach, outputs)


def first_tensor(batch: Any) -> Tensor:
    """The batch's first tensor (a pair's inputs; a dict's first value): token data's ids."""
    return next(leaf for leaf in tree_leaves(batch) if isinstance(leaf, Tensor))


def samples(batch: Any) -> int:
    return len(first_tensor(batch))


def rows(batch: Any, index: Tensor) -> Any:
    return tree_map_only(Tensor, lambda tensor: tensor[index], batch)


def split(batch: Any, size: int) -> list[Any]:
    """The batch in parts of `size` samples, each the batch's structure; what is not a tensor is in every part."""
    leaves, spec = tree_flatten(batch)
    lengths = {len(leaf) for leaf in leaves if isinstance(leaf, Tensor)}
    if len(lengths) != 1:
        raise ConfigError(
            "trainer.micro_batch_size",
            f"cuts a batch along its first dimension, but this batch's tensors have {sorted(lengths)} rows; "
            f"give every tensor of a batch one row a sample, or set trainer.micro_batch_size=null",
        )
    parts = [leaf.split(size) if isinstance(leaf, Tensor) else None for leaf in leaves]
    count = -(-lengths.pop() // size)
    return [
        tree_unflatten([leaf if part is None else part[n] for leaf, part in zip(leaves, parts)], spec)
        for n in range(count)
    ]
