"""What a task is: the one object that knows what a batch means, what to minimise and what to
measure. The loop, evaluation, both finders, eval.py and the summary call these methods and
nothing else task-specific, so a new task (regression, multi-label, detection) is one class and
one conf/task/<name>.yaml, with train.py left as it is:

    batch = task.to_device(batch, device)        # a loader's batch (any nested tensors: trainkit.tasks.batches)
    batch = task.transform(batch, transform)     # the data option's batch transform (images: on the inputs)
    batch = task.augment(batch)                  # training batches, after the transform (MixUp/CutMix)
    loss, outputs = task.step(model, batch)      # THE step: forward and the training loss, a mean over what it weighs
    outputs = task.outputs(model, batch)         # what the model predicts for a batch, targets unread (evaluation)
    weight = task.weight(batch)                  # what the batch weighs: samples, real tokens, or a count of its own
    targets = task.targets(batch)                # what the outputs are scored against
    losses = task.evaluation_loss(outputs, targets)  # one plain loss a weighed unit: val/loss, test/loss
    sums = task.metric_sums(outputs, targets)    # 1-D, on the device: summed over batches and ranks
    task.metrics(sums)                           # {"acc": ...}: from the sums of every rank
    task.mirror_outputs(outputs)                 # a mirrored input's model outputs, unmirrored (tta_flip)
    task.predict(outputs)                        # what eval.py writes for predict=
    self.record("aux_loss", aux_loss)            # in your step: a number logged as train/step_aux_loss, train/aux_loss

A batch is whatever the data's loader yields (a pair, a dict, lengths beside values, several inputs);
the loop moves, cuts into micro-batches and counts it without looking inside (trainkit.tasks.batches).
Two methods give a batch to the model. `step` trains: the loop, both finders and micro_batch_size=auto
call it, on a micro-batch part as on a whole batch. `outputs` is what the model predicts for a batch,
its targets unread: evaluation (with `tta_flip`, `model` averages an input's and its mirror's outputs),
its figures, the tracker's prediction images and eval.py's predict= (whose batches have None for
targets) call it, so what val/ and test/ score is what a prediction is. The defaults here are for
(inputs, targets) pairs, `model(inputs)` and `loss(outputs, targets)`, and for dict batches whose
"targets" key holds the targets: `model(**the other keys)` (a signal and its lengths), the data's
transform on the whole dict; `step` is then the loss of `outputs`. A model that returns (logits, aux),
an auxiliary loss, two views or a model that computes its own loss is a `step` of your own, and an
`outputs` picking what is scored (tests/tasks_for_tests.py; docs/recipes.md).

Metrics are sums, never means: evaluation adds the batches' sums on the device and all-reduces
them across ranks once, so each sample counts exactly once and no rank's mean is averaged with
another's. `metric_names`, a class attribute, names what val/ and test/ report besides loss; the
config check reads it from the class (no model or data built yet) to check
regularization.early_stopping.monitor and optimized_metric; every metric is maximized but the loss
and the names in `minimized_metrics`. `headline_metric` is the default of optimized_metric (val/<it>), and of
the early-stopping monitor unless the task names another in `monitored_metric` (classification and segmentation
keep their loss, smoother than their accuracy or IoU on a small validation split). `metric_ranges` says where a
metric lies ({"acc": (0, 1), "loss": (0, None)}: a cross-entropy is never negative).

How a batch is weighed (`weighs`): by its samples (classification, segmentation: a batch's loss is the
mean over its samples, as today), or by its real target tokens (a language model, a padded sequence
classifier: `loss` is the mean over the batch's real tokens, `weight` counts them, `evaluation_loss`
gives one loss a real token). For "tokens" the loop makes an update's loss the mean over all real tokens
of the update, across micro-batches, accumulated batches and ranks, and val/loss, test/loss and
train/loss are per token. A task weighing something else returns its count from `weight` and a loss
that is the mean over it, with `weighs = "tokens"` (the update then means over that count).
"""

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from trainkit.errors import ConfigError
from trainkit.tasks.batches import Shared, samples, to_device

TARGETS = "targets"  # a dict batch's key for what the outputs are scored against; its other keys go to the model


class Task:
    """The defaults a task may keep: batches are (inputs, targets) pairs, the data's transform runs on the
    inputs, no task-level augmentation, mirrored outputs mean what they meant. Subclasses implement the rest."""

    metric_names: ClassVar[tuple[str, ...]] = ()
    minimized_metrics: ClassVar[tuple[str, ...]] = ()  # of metric_names, those where lower is better (an error)
    headline_metric: ClassVar[str] = "loss"  # the default of optimized_metric and the early-stopping monitor (val/<it>)
    # The values a metric can take, (lowest, highest), None: no limit; recorded in summary.json, where
    # scripts/compare_runs.py clips an interval to them. A metric not named here (a loss, unless said) has none.
    metric_ranges: ClassVar[dict[str, tuple[float | None, float | None]]] = {}
    monitored_metric: ClassVar[str | None] = None  # the early-stopping monitor's default (val/<it>); None: the headline
    spatial_targets: ClassVar[bool] = False  # a target per pixel: augmentation that moves the image alone is refused
    mixes_batches: ClassVar[bool] = False  # its augment() runs MixUp/CutMix (augmentation.mixup_alpha, cutmix_alpha)
    weighs: ClassVar[str] = "samples"  # "samples" | "tokens": what a batch's loss is the mean over
    # A loss that couples the samples of a batch (a contrastive loss: every other sample is a negative): a part of
    # the batch would train on another loss, so trainer.micro_batch_size is refused. `gathers_across_ranks`: its
    # step gathers every rank's samples (all_gather), so under DDP the coupled batch is the global one.
    couples_batch: ClassVar[bool] = False
    gathers_across_ranks: ClassVar[bool] = False
    # Text: the data's tokenizer (trainkit.data.tokenizing), set once the data is built (train.py, eval.py); a
    # language model reads each id's bytes (bits per byte) and text (samples) from it. None: not text.
    tokenizer: Any = None
    _recorded: dict[str, Tensor] | None = None  # this step's `record` calls, until the loop takes them

    def to_device(self, batch: Any, device: torch.device) -> Any:
        return to_device(batch, device)

    def transform(self, batch: Any, transform: Callable[[Any], Any]) -> Any:
        """The data's batch transform: on a pair's inputs (images); a dict batch is the data's own, given whole."""
        if isinstance(batch, Mapping):
            return transform(batch)
        inputs, targets = batch
        return transform(inputs), targets

    def augment(self, batch: Any) -> Any:
        return batch

    def step(self, model: Callable[..., Any], batch: Any) -> tuple[Tensor, Any]:
        """The training loss of a batch (a mean over what it weighs) and what the scoring methods take: here the
        loss of `outputs`, scored in fp32 against the batch's targets."""
        outputs = self.outputs(model, batch)
        return self.loss(outputs.float(), self.targets(batch)), outputs

    def record(self, name: str, value: Tensor) -> None:
        """Log a 0-d tensor of this training step (an auxiliary loss, a temperature, a balancing term), kept on the
        device: at logging steps as train/step_<name>, its mean since the last one, and each epoch as
        train/<name>, its mean over what the batches weigh (as train/loss), over all ranks. Every rank must
        record the same names; a name must not be one of the task's metric names or "loss"."""
        if self._recorded is None:
            self._recorded = {}
        self._recorded[name] = value.detach().float()

    def take_recorded(self) -> dict[str, Tensor]:
        """What `record` was given since the last call, by name; the loop calls it after each step."""
        recorded, self._recorded = self._recorded or {}, None
        return recorded

    def outputs(self, model: Callable[..., Any], batch: Any) -> Any:
        """What the model predicts for a batch, its targets unread (eval.py's predict= gives None): what the scoring
        methods and `predict` take. Here the model's output for the batch's inputs (a pair's first; a dict's other
        keys, as keyword arguments, a Shared entry as its tensor), which must be one tensor: a model returning more
        says which part is scored in a task of its own."""
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
        """A pair's second (None in eval.py's predict= batches); a dict batch's "targets"."""
        return batch[TARGETS] if isinstance(batch, Mapping) else batch[1]

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        raise NotImplementedError

    def weight(self, batch: Any) -> int | Tensor:
        """What a batch weighs: its number of samples (known on the host, no sync); for a task that weighs
        tokens, its real target tokens (targets != -100, the ignored index) as a 0-d tensor on the device."""
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
        """The model's outputs for a mirrored input, unmirrored (any structure): per-image scores mean what they
        meant; a task predicting a map flips it back."""
        return outputs

    def predict(self, outputs: Tensor) -> dict[str, Tensor]:
        raise NotImplementedError

    def shown_images(self, batch: Any) -> Tensor | None:
        """The images of a batch that trackers show (logger.log_images' grid, prediction pictures), [B, C, H, W] with
        C 1 or 3, or None: nothing to show, and nothing is. Here a pair's inputs where they are such images; a dict
        batch shows none unless its task says which entry holds them (`return batch["image"]`)."""
        inputs = None if isinstance(batch, Mapping) else batch[0]
        is_images = isinstance(inputs, Tensor) and inputs.dim() == 4 and inputs.shape[1] in (1, 3)
        return inputs if is_images else None


def metric_names_of(task_class: type) -> tuple[str, ...]:
    """val/ and test/ metric names a task class reports: loss, then its own."""
    return ("loss", *getattr(task_class, "metric_names", ()))


def task_class(target: str) -> type:
    """The task class a `task._target_` names, imported but not built (the config check reads its names)."""
    from hydra.utils import get_class

    return get_class(target)


def higher_is_better(task: type | Task, metric: str) -> bool:
    """Whether a larger `metric` (val/acc, test/loss, miou) is better for `task`: every metric but
    the loss and the names in the task's `minimized_metrics` (an error, a distance) is maximized."""
    name = metric.rsplit("/", 1)[-1]
    return name != "loss" and name not in getattr(task, "minimized_metrics", ())
