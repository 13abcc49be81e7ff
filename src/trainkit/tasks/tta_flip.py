"""`trainer.tta_flip`: wherever the run evaluates, the model's outputs for each image are averaged with those for its
mirror, through the task's `test_time_augmentation`, which evaluation_outputs calls in place of the model."""

from collections.abc import Callable, Iterator
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils._pytree import tree_leaves, tree_map, tree_map_only

from trainkit.config.schema import Check, Relation, flag
from trainkit.config.validation import configured_data_class
from trainkit.data.datasets import ImageData
from trainkit.errors import ConfigError
from trainkit.tasks.task import Task


def average_with_mirror(task: Task, on: bool) -> None:
    """With `on`, evaluation calls the model averaged with its mirror (`with_mirror`) for `task`'s batches."""
    if on:
        task.test_time_augmentation = with_mirror


def with_mirror(model: Callable[..., Any], task: Task) -> Callable[..., Any]:
    """`model` averaged with its mirror: each [B, C, H, W] argument is flipped along its width and the task unmirrors
    the outputs (`Task.mirror_outputs`). Refused in one line without an image batch or with outputs not floating."""

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


CONFIG_RULES: dict[str, Check] = {"trainer.tta_flip": flag()}


def _not_where_mirroring_changes_the_label(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    if cfg.trainer.tta_flip and cfg.data.get("mirror_changes_label"):
        yield (
            "trainer.tta_flip",
            f"averages each image with its mirror, but {cfg.data.name} sets data.mirror_changes_label=true; "
            f"set trainer.tta_flip=false",
        )


def _only_on_images(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    data = configured_data_class(cfg) if cfg.trainer.tta_flip else None  # None: the core's check says why
    if data is not None and not issubclass(data, ImageData):
        what = f"{cfg.data.name} is {data.kind} data ({data.__name__}), not images"
        yield "trainer.tta_flip", f"mirrors images, but {what}; set trainer.tta_flip=false"


CONFIG_RELATIONS = (
    Relation(("data.mirror_changes_label", "trainer.tta_flip"), _not_where_mirroring_changes_the_label),
    Relation(("data._target_", "trainer.tta_flip"), _only_on_images),
)
