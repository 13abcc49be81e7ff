"""Semantic segmentation: one class per pixel, per-pixel cross-entropy, mean IoU and pixel accuracy.

Batches are (images [B, C, H, W], masks [B, H, W] int64). The task flips and shifts image and mask together, so the
config check refuses the augmentation group's geometric ops, which would move the image alone.
"""

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import tree_map_only

from trainkit.augment.image_and_mask import augment_image_and_mask
from trainkit.config.schema import Check, flag, number
from trainkit.errors import ConfigError
from trainkit.tasks.confusion import confusion_counts, miou_and_pixel_acc
from trainkit.tasks.task import Task


class Segmentation(Task):
    metric_names = ("miou", "pixel_acc")
    headline_metric = "miou"
    metric_ranges: ClassVar[dict[str, tuple[float | None, float | None]]] = {
        "miou": (0, 1),
        "pixel_acc": (0, 1),
        "loss": (0, None),
    }
    monitored_metric = "loss"  # early stopping: smoother than the IoU on a small validation split
    spatial_targets = True
    config_rules: ClassVar[dict[str, Check]] = {"horizontal_flip": flag(), "crop_padding": number(0, below=1)}

    def __init__(
        self,
        num_classes: int,
        horizontal_flip: bool = True,
        crop_padding: float = 0.0,
        class_names: Sequence[str] | None = None,
    ):
        self.num_classes = num_classes
        self.horizontal_flip = horizontal_flip
        self.crop_padding = crop_padding
        self.class_names = list(class_names) if class_names else None

    def to_device(self, batch: Any, device: torch.device) -> tuple[Tensor, Tensor]:
        inputs, targets = super().to_device(batch, device)
        if targets.dim() != inputs.dim() - 1 or targets.is_floating_point():
            raise ConfigError(
                "task",
                f"needs an int64 mask [B, H, W] for each image, but the data gives targets of "
                f"shape {list(targets.shape)} ({targets.dtype}); use data with masks (data=shapes) or classification",
            )
        return inputs, targets

    def augment(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        return augment_image_and_mask(*batch, self.horizontal_flip, self.crop_padding)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        check_per_pixel(outputs, targets)
        return F.cross_entropy(outputs, targets)

    def evaluation_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        check_per_pixel(outputs, targets)
        per_pixel = F.cross_entropy(outputs.float(), targets, reduction="none")
        return per_pixel.flatten(1).mean(dim=1)  # each image's pixel mean

    def empty_metric_sums(self, device: torch.device) -> Tensor:
        return torch.zeros(self.num_classes**2, device=device)

    def metric_sums(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return confusion_counts(outputs.argmax(dim=1), targets, self.num_classes).flatten().float()

    def metrics(self, sums: Tensor) -> dict[str, float]:
        miou, pixel_acc = miou_and_pixel_acc(sums.view(self.num_classes, self.num_classes))
        return {"miou": miou.item(), "pixel_acc": pixel_acc.item()}

    def mirror_outputs(self, outputs: Any) -> Any:
        """Flips back every output of 3 or more dimensions (a class map); per-image scores stay as they are."""
        return tree_map_only(Tensor, lambda output: output.flip(-1) if output.dim() >= 3 else output, outputs)

    def predict(self, outputs: Tensor) -> dict[str, Tensor]:
        return {"mask": outputs.argmax(dim=1)}


def check_per_pixel(outputs: Tensor, targets: Tensor) -> None:
    """Refuses a classifier's outputs against masks in one line, rather than cross_entropy's shape error.

    A classifier declares nothing the config check could read, so this is found at the first batch."""
    if outputs.dim() != targets.dim() + 1:
        raise ConfigError(
            "model._target_",
            f"gives outputs of shape {list(outputs.shape)}, but segmentation needs class scores per pixel "
            f"[B, classes, H, W] for masks {list(targets.shape)}; use a per-pixel model "
            f"(model=unet or model=torchvision_segmentation)",
        )
