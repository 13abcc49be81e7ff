"""MixUp and CutMix of a training batch on the device, with soft targets (`augmentation=mixup`).

    inputs, targets = mix(transformed_images, labels)  # targets: [B, num_classes] probabilities
    loss = loss_fn(logits, targets)                    # CrossEntropyLoss takes soft targets
    correct = logits.argmax(1) == labels               # accuracy stays against the hard label

`torchvision.transforms.v2.MixUp` / `CutMix` (one Beta(alpha, alpha) draw per batch, the batch mixed with itself rolled
by one; with both alphas set, one of the two is chosen per batch). Their random draws come from torch's CPU RNG, seeded
with seed + rank: deterministic under the seed, different on every rank, and no host-device synchronisation.

train.py reaches it in one marked line (`mix_batches`), which makes the task's `augment` mix; the augmentation section
that sets `mixup_alpha` or `cutmix_alpha` names this module in `_checks_`, so its checks come and go with it
(docs/features.md).

Label smoothing still applies: CrossEntropyLoss(label_smoothing=e) with probability targets uses targets * (1 - e) + e /
num_classes, as it does for class indices. Evaluation never mixes.
"""

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from omegaconf import DictConfig
from torch import Tensor

from trainkit.config.schema import Relation, number
from trainkit.config.validation import configured_task

KEYS = ("mixup_alpha", "cutmix_alpha")


class LabelMixing:
    """(images, int64 labels [B]) -> (mixed images, float targets [B, C]); the batch as it is when
    `augmentation` sets neither mixup_alpha nor cutmix_alpha."""

    def __init__(self, augmentation: Mapping | None = None, num_classes: int = 0):
        options = dict(augmentation or {})
        mixup, cutmix = float(options.get("mixup_alpha") or 0), float(options.get("cutmix_alpha") or 0)
        self.transform: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
        self.enabled = bool(mixup or cutmix)
        if not self.enabled:
            return
        from torchvision.transforms import v2  # costs seconds: only when mixing is on

        choices = []
        if mixup:
            choices.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
        if cutmix:
            choices.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
        self.transform = choices[0] if len(choices) == 1 else v2.RandomChoice(choices)

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if self.transform is None:
            return images, labels
        return self.transform(images, labels)


def mix_batches(task: Any, augmentation: Mapping | None) -> None:
    """Make `task.augment` mix each training batch (an (images, labels) pair) when `augmentation` sets
    mixup_alpha or cutmix_alpha; otherwise leave the task as it is. The config check has made sure the task
    mixes (`mixes_batches`) and has `num_classes`."""
    mixing = LabelMixing(augmentation, getattr(task, "num_classes", 0))
    if mixing.enabled:
        task.augment = lambda batch: mixing(*batch)


def augmentation_ops(augmentation: Mapping) -> dict[str, Any]:
    """The mixing this augmentation section switches on ({key: alpha}), for the core's checks of what an
    augmentation does (trainkit.config.validation)."""
    return {key: augmentation[key] for key in KEYS if augmentation.get(key)}


def _mixing_needs_a_task_that_mixes(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """MixUp/CutMix make the task's augment() mix: a task that does not mix would be given soft targets."""
    task = configured_task(cfg)
    if task is None or getattr(task, "mixes_batches", False):  # None: the core's check of task._target_ says why
        return
    mixing = list(augmentation_ops(cfg.augmentation))
    if mixing:
        yield (
            f"augmentation.{mixing[0]}",
            f"{' and '.join(mixing)} mix batches, but {task.__name__} does not mix (only a task with "
            f"mixes_batches=True does, e.g. classification); use an augmentation without them (augmentation=none)",
        )


CONFIG_RULES = {f"augmentation.{key}": number(0, null=True) for key in KEYS}  # conf/augmentation/mixup.yaml's _checks_
CONFIG_RELATIONS = (Relation(("task._target_", "augmentation"), _mixing_needs_a_task_that_mixes),)
