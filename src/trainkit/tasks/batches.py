"""Move, count, pick and cut any batch the loader yields (a pair, a dict, nested), along its first dimension.

A tensor the whole batch shares is wrapped as `Shared(tensor)`: moved with the batch, never cut or counted. Any
other batch whose tensors disagree in their first dimension is refused in one line.
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten

from trainkit.errors import ConfigError


@dataclass(frozen=True)
class Shared:
    """A tensor that all the samples of a batch share: moved with the batch, never cut or counted."""

    tensor: Tensor

    def pin_memory(self) -> "Shared":  # the DataLoader's pin_memory=True calls it
        return Shared(self.tensor.pin_memory())

    def to(self, device: torch.device, non_blocking: bool = False) -> "Shared":  # to_device calls it
        return Shared(self.tensor.to(device, non_blocking=non_blocking))


def to_device(batch: Any, device: torch.device) -> Any:
    return tree_map_only((Tensor, Shared), lambda leaf: leaf.to(device, non_blocking=True), batch)


def detach(outputs: Any) -> Any:
    return tree_map_only(Tensor, Tensor.detach, outputs)


def first_tensor(batch: Any) -> Tensor:
    """The batch's first tensor (a pair's inputs; a dict's first value; a Shared entry is not one): token data's ids."""
    return next(leaf for leaf in tree_leaves(batch) if isinstance(leaf, Tensor))


def samples(batch: Any) -> int:
    """The batch's samples: the rows of its tensors, which must agree (Shared entries aside)."""
    return _rows(tree_leaves(batch))


def _rows(leaves: list[Any]) -> int:
    lengths = [len(leaf) if leaf.dim() else 0 for leaf in leaves if isinstance(leaf, Tensor)]
    if len(set(lengths)) > 1:
        raise ConfigError(
            "data._target_",
            f"yields batches whose tensors have {list(dict.fromkeys(lengths))} rows, but each holds one row per sample "
            f"(what a batch weighs and how it is cut); keep a tensor the whole batch shares in the task or the model, "
            f"or wrap it in the batch as trainkit.tasks.batches.Shared(tensor) (never cut or counted)",
        )
    return lengths[0]


def rows(batch: Any, index: Tensor) -> Any:
    return tree_map_only(Tensor, lambda tensor: tensor[index], batch)


def split(batch: Any, size: int) -> list[Any]:
    """The batch in parts of `size` samples; what is not a row of samples (a Shared entry) is in every part."""
    leaves, spec = tree_flatten(batch)
    count = -(-_rows(leaves) // size)
    parts = [leaf.split(size) if isinstance(leaf, Tensor) else None for leaf in leaves]
    return [
        tree_unflatten([leaf if part is None else part[n] for leaf, part in zip(leaves, parts)], spec)
        for n in range(count)
    ]


def micro_batches(batch: Any, size: int | None, sized: bool = False) -> list[tuple[Any, float]]:
    """(part, share of the batch) for each part of at most `size` samples (trainer.micro_batch_size); the whole
    batch, uncopied, when `size` is None or not smaller. For `sized` data (a padded [B, T] first tensor), `size`
    counts units: size // T items. How each part weighs in its update: docs/how-the-loop-works.md."""
    total = samples(batch)
    if size is not None and sized:
        size = max(1, size // max(1, first_tensor(batch)[0].numel()))
    if size is None or size >= total:
        return [(batch, 1.0)]
    return [(part, samples(part) / total) for part in split(batch, size)]
