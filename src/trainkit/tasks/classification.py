"""Classification: one label per sample, cross-entropy with label smoothing, accuracy. Its loss and metrics also take
soft targets ([B, C] shares, as a feature that mixes batches makes them: `mixes_batches`); train/acc then counts a
prediction right when it names the label with the larger share. Evaluation never mixes."""

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from trainkit.errors import ConfigError
from trainkit.tasks.task import Task


class Classification(Task):
    metric_names = ("acc",)
    headline_metric = "acc"
    metric_ranges: ClassVar[dict[str, tuple[float | None, float | None]]] = {"acc": (0, 1), "loss": (0, None)}
    monitored_metric = "loss"  # early stopping: smoother than the accuracy on a small validation split
    mixes_batches = True  # the loss and metrics take soft targets too

    def __init__(self, num_classes: int, label_smoothing: float = 0.0):
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        _refuse_numbers(outputs, targets)
        return F.cross_entropy(outputs, targets, label_smoothing=self.label_smoothing)

    def evaluation_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        _refuse_numbers(outputs, targets)
        return F.cross_entropy(outputs.float(), targets, reduction="none")

    def empty_metric_sums(self, device: torch.device) -> Tensor:
        return torch.zeros(2, device=device)  # right predictions, samples

    def metric_sums(self, outputs: Tensor, targets: Tensor) -> Tensor:
        labels = targets.argmax(dim=1) if targets.is_floating_point() else targets  # soft targets: the larger share
        sums = torch.full((2,), float(labels.numel()), device=labels.device)  # a fill: no host-to-device copy
        sums[0] = (outputs.argmax(dim=1) == labels).sum()
        return sums

    def metrics(self, sums: Tensor) -> dict[str, float]:
        correct, count = sums.tolist()
        return {"acc": correct / max(count, 1)}

    def predict(self, outputs: Tensor) -> dict[str, Tensor]:
        probabilities = outputs.float().softmax(dim=1)
        confidence, label = probabilities.max(dim=1)
        return {"class": label, "probability": confidence}


def _refuse_numbers(outputs: Tensor, targets: Tensor) -> None:
    """Refuses one float target per sample (a number to predict, not MixUp's shares) in one line, where
    cross-entropy would raise a dtype error."""
    if targets.is_floating_point() and targets.dim() < outputs.dim():
        raise ConfigError(
            "task._target_",
            f"is Classification, which takes a class index per sample, but the data's targets are "
            f"{str(targets.dtype).removeprefix('torch.')} numbers: they suit a regression task (a loss on numbers, "
            f"as docs/recipes.md's regression on a table); choose it with task=<its option>",
        )
