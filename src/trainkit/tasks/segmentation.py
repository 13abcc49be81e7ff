"""Semantic segmentation of (images [B, C, H, W], masks [B, H, W]): per-pixel cross-entropy, pixel accuracy and mean
IoU from the split's summed confusion counts, over the classes that occur (as mmsegmentation computes it). Image and
mask are flipped and shifted together, so the augmentation group's geometric ops, which move the image alone, are
refused."""

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import tree_map_only

from trainkit.augment.image_and_mask import augment_image_and_mask
from trainkit.config.schema import Check, flag, number
from trainkit.errors import ConfigError
from trainkit.tasks.confusion import confusion_counts
from trainkit.tasks.task import Task, first_tensor

# Tiny images (the 32x32 shapes) are enlarged by whole pixels to at least this side: W&B shows them at their size.
MIN_SIDE = 128


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

    def pictures_for_logging(
        self, batch: Any, outputs: Tensor, shown: Any
    ) -> tuple[Tensor, Tensor, Tensor, list[str]] | None:
        """What logger.log_predictions draws: the `shown` images, true and predicted masks enlarged alike, the class
        names; None where the batch holds no images."""
        images = self.shown_images(shown)
        if images is None:
            return None
        class_names = self.class_names or [str(k) for k in range(first_tensor(outputs).shape[1])]
        pictures, true_masks, predicted_masks = enlarged(images, self.targets(batch), self.predict(outputs)["mask"])
        return pictures, true_masks, predicted_masks, class_names


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


def miou_and_pixel_acc(counts: Tensor) -> tuple[Tensor, Tensor]:
    """(mean IoU, pixel accuracy) as 0-dim tensors; NaN for both when the counts are all zero."""
    counts = counts.to(torch.float32)
    correct = counts.diagonal()
    union = counts.sum(dim=0) + counts.sum(dim=1) - correct
    occurs = union > 0
    iou = torch.where(occurs, correct / union.clamp(min=1), torch.zeros_like(correct))
    return iou.sum() / occurs.sum(), correct.sum() / counts.sum()


def enlarged(images: Tensor, *masks: Tensor) -> tuple[Tensor, ...]:
    """Images [N, C, H, W] (uint8, or float in [0, 1]) as uint8 RGB [N, H', W', 3] on the CPU, and masks [N, H, W],
    enlarged by one whole factor (nearest: a mask keeps its classes) to at least MIN_SIDE pixels a side."""
    pictures = images.detach().cpu()
    if pictures.is_floating_point():
        pictures = (pictures.float().clamp(0, 1) * 255).round().to(torch.uint8)
    if pictures.shape[1] == 1:
        pictures = pictures.expand(-1, 3, -1, -1)
    factor = max(1, -(-MIN_SIDE // min(pictures.shape[-2:])))  # ceil division
    grown = [tensor.detach().cpu().repeat_interleave(factor, -2).repeat_interleave(factor, -1) for tensor in masks]
    pictures = pictures.repeat_interleave(factor, -2).repeat_interleave(factor, -1).permute(0, 2, 3, 1)
    return (pictures.contiguous(), *grown)
