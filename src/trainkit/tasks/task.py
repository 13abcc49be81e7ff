"""What a task is: what a batch means, what to minimise and what to measure; nothing else in a run is task-specific
(docs/how-the-loop-works.md#the-task-contract). Below the Task, the functions that count, pick and cut any batch the
loader yields (a pair, a dict, nested) along its first dimension, which its tensors share (`Shared` ones aside)."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten

from trainkit.errors import ConfigError

TARGETS = "targets"  # a dict batch's targets; its other keys go to the model
# What the loop logs under train/ itself: a recorded value of one of these names would overwrite it.
LOGGED_BY_THE_LOOP = frozenset(
    {"loss", "step_loss", "grad_norm", "samples_per_sec", "tokens_per_sec", "padding_fraction"}
)


class Task:
    """Defaults for (inputs, targets) pairs and dict batches with "targets"; subclasses give the loss and metrics."""

    metric_names: ClassVar[tuple[str, ...]] = ()
    minimized_metrics: ClassVar[tuple[str, ...]] = ()  # of metric_names, those where lower is better (an error)
    headline_metric: ClassVar[str] = "loss"  # the default of optimized_metric and the early-stopping monitor (val/<it>)
    # (lowest, highest), None for no limit: scripts/compare_runs.py clips its intervals to them.
    metric_ranges: ClassVar[dict[str, tuple[float | None, float | None]]] = {}
    monitored_metric: ClassVar[str | None] = None  # the early-stopping default; None: the headline metric
    spatial_targets: ClassVar[bool] = False  # one target per pixel: augmenting the image alone is refused
    mixes_batches: ClassVar[bool] = False  # its loss takes soft targets, so augment() may mix a batch's samples
    weighs: ClassVar[str] = "samples"  # "samples" | "tokens": what a batch's loss is the mean over
    # A loss that couples a batch's samples (contrastive) would be another loss on a part of the batch, so
    # micro-batches are refused; gathers_across_ranks: its step all-gathers every rank's samples.
    couples_batch: ClassVar[bool] = False
    gathers_across_ranks: ClassVar[bool] = False
    tokenizer: Any = None  # set from the data once it is built (train.py, eval.py); None unless the data is text
    # Set by a feature's test-time augmentation (train.py, eval.py): what evaluation calls in the model's place.
    test_time_augmentation: Callable[[Callable[..., Any], "Task"], Callable[..., Any]] | None = None
    _recorded: dict[str, Tensor] | None = None  # this step's `record` calls, until the loop takes them

    def to_device(self, batch: Any, device: torch.device) -> Any:
        return tree_map_only((Tensor, Shared), lambda leaf: leaf.to(device, non_blocking=True), batch)

    def transform(self, batch: Any, transform: Callable[[Any], Any]) -> Any:
        """Applies the data's batch transform to a pair's inputs, or to a dict batch whole."""
        if isinstance(batch, Mapping):
            return transform(batch)
        inputs, targets = batch
        return transform(inputs), targets

    def augment(self, batch: Any) -> Any:
        return batch

    def step(self, model: Callable[..., Any], batch: Any) -> tuple[Tensor, Any]:
        """The training loss of a batch (the mean over what it weighs) and the outputs the metrics score."""
        outputs = self.outputs(model, batch)
        return self.loss(outputs.float(), self.targets(batch)), outputs

    def record(self, name: str, value: Tensor) -> None:
        """Log a 0-d tensor of this training step (an auxiliary loss, a temperature, a balancing term), kept on the
        device: at logging steps as train/step_<name>, its mean since the last one, and each epoch as
        train/<name>, its mean over what the batches weigh (as train/loss), over all ranks. Every rank must
        record the same names; a name the loop or the task's metrics log already is refused (ValueError)."""
        if name in LOGGED_BY_THE_LOOP or name in self.metric_names:
            raise ValueError(
                f"{type(self).__name__}.record({name!r}): train/{name} is logged already; pick another name"
            )
        self._recorded = {**(self._recorded or {}), name: value.detach().float()}

    def take_recorded(self) -> dict[str, Tensor]:
        """What `record` was given since the last call, by name; the loop calls it after each step."""
        recorded, self._recorded = self._recorded or {}, None
        return recorded

    def outputs(self, model: Callable[..., Any], batch: Any) -> Any:
        """The model's one output tensor for a batch, without its targets: a dict batch's other keys are keyword
        arguments. For a model that returns more, override this to pick what is scored."""
        if isinstance(batch, Mapping):
            inputs = {key: value.tensor if isinstance(value, Shared) else value for key, value in batch.items()}
            outputs = model(**{key: value for key, value in inputs.items() if key != TARGETS})
        else:
            outputs = model(batch[0])
        if not isinstance(outputs, Tensor):
            raise ConfigError(
                "task",
                f"scores the model's output as one tensor, but the model returns a {type(outputs).__name__}; give "
                f"the task an outputs(model, batch) that picks what is scored (and a step for the loss: "
                f"docs/recipes.md)",
            )
        return outputs

    def targets(self, batch: Any) -> Any:
        """A pair's second item, or a dict batch's "targets" (None under eval.py's predict=)."""
        return batch[TARGETS] if isinstance(batch, Mapping) else batch[1]

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        raise NotImplementedError

    def weight(self, batch: Any) -> int | Tensor:
        """The batch's samples, or for a task that weighs tokens its real target tokens (not -100), on the device."""
        if self.weighs == "tokens":
            return (self.targets(batch) != -100).sum()
        return samples(batch)

    def evaluation_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        raise NotImplementedError

    def empty_metric_sums(self, device: torch.device) -> Tensor:
        """Zeros of metric_sums' shape: what a rank with no evaluation batch contributes."""
        raise NotImplementedError

    def metric_sums(self, outputs: Tensor, targets: Tensor) -> Tensor:
        raise NotImplementedError

    def metrics(self, sums: Tensor) -> dict[str, float]:
        raise NotImplementedError

    def mirror_outputs(self, outputs: Any) -> Any:
        """The outputs for a mirrored input, unmirrored: a task that predicts a map flips it back."""
        return outputs

    def predict(self, outputs: Tensor) -> dict[str, Tensor]:
        raise NotImplementedError

    def shown_images(self, batch: Any) -> Tensor | None:
        """The batch's images to show, [B, C, H, W] with C 1 or 3, or None; a task of dict batches names its own."""
        inputs = None if isinstance(batch, Mapping) else batch[0]
        is_images = isinstance(inputs, Tensor) and inputs.dim() == 4 and inputs.shape[1] in (1, 3)
        return inputs if is_images else None


def metric_names_of(task_class: type) -> tuple[str, ...]:
    """The metric names a task class reports under val/ and test/: loss, then its own."""
    return ("loss", *getattr(task_class, "metric_names", ()))


def higher_is_better(task: type | Task | str | None, metric: str) -> bool:
    """Whether a larger `metric` is better: true for all but the loss and the task's `minimized_metrics`. `task`: a
    task, its class, or the `task._target_` that names it (None: a task that minimizes only the loss)."""
    if isinstance(task, str):
        from hydra.utils import get_class

        task = get_class(task)
    name = metric.rsplit("/", 1)[-1]
    return name != "loss" and name not in getattr(task, "minimized_metrics", ())


def mean_over_update_tokens(model: nn.Module, update_weight: int | Tensor, world_size: int) -> None:
    """For a task that weighs tokens (the caller checks `task.weighs`), divides the gradients by the update's real
    tokens on all ranks: one all-reduce, so every rank calls it at the same update (why: docs/how-the-loop-works.md)."""
    total = torch.as_tensor(update_weight, dtype=torch.float32).reshape(1).clone()
    if dist.is_available() and dist.is_initialized():  # all_reduce_sum written here: one file fewer in the step
        dist.all_reduce(total)
    factor = (world_size / total.clamp(min=1)).reshape(())
    for param in model.parameters():
        if param.grad is not None:
            param.grad.mul_(factor)


@dataclass(frozen=True)
class Shared:
    """A tensor that all the samples of a batch share: moved with the batch, never cut or counted."""

    tensor: Tensor

    def pin_memory(self) -> "Shared":  # the DataLoader's pin_memory=True calls it
        return Shared(self.tensor.pin_memory())

    def to(self, device: torch.device, non_blocking: bool = False) -> "Shared":  # Task.to_device calls it
        return Shared(self.tensor.to(device, non_blocking=non_blocking))


def first_tensor(batch: Any) -> Tensor:
    """The batch's first tensor (a pair's inputs; a dict's first value; a Shared entry is not one): token data's ids."""
    return next(leaf for leaf in tree_leaves(batch) if isinstance(leaf, Tensor))


def samples(batch: Any) -> int:
    """The batch's samples: the rows of its tensors, which must agree (Shared entries aside)."""
    lengths = [len(leaf) if leaf.dim() else 0 for leaf in tree_leaves(batch) if isinstance(leaf, Tensor)]
    if len(set(lengths)) > 1:
        raise ConfigError(
            "data._target_",
            f"yields batches whose tensors have {list(dict.fromkeys(lengths))} rows, but each holds one row per sample "
            f"(what a batch weighs and how it is cut); keep a tensor the whole batch shares in the task or the model, "
            f"or wrap it in the batch as trainkit.tasks.task.Shared(tensor) (never cut or counted)",
        )
    return lengths[0]


def rows(batch: Any, index: Tensor) -> Any:
    return tree_map_only(Tensor, lambda tensor: tensor[index], batch)


def split(batch: Any, size: int) -> list[Any]:
    """The batch in parts of `size` samples; what is not a row of samples (a Shared entry) is in every part."""
    leaves, spec = tree_flatten(batch)
    count = -(-samples(leaves) // size)
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
