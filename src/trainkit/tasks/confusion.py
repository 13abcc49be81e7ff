"""Segmentation metrics from a confusion matrix, counts[target, prediction], summed over batches and ranks.

Mean IoU is a ratio of counts over the whole split, not a mean of per-batch IoUs, so the counts are summed before
dividing. It averages over the classes that occur in the targets or the predictions (as mmsegmentation does).
Counting uses index_add_, not torch.bincount, which syncs with the host to size its output.
"""

import torch
from torch import Tensor


def confusion_counts(predictions: Tensor, masks: Tensor, num_classes: int) -> Tensor:
    """int64 [K, K] pixel counts of two class maps of one shape, with values in 0..K-1."""
    if predictions.shape != masks.shape:
        raise ValueError(f"predictions {list(predictions.shape)} and masks {list(masks.shape)} differ in shape")
    pairs = masks.reshape(-1).long() * num_classes + predictions.reshape(-1).long()
    counts = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=masks.device)
    counts.index_add_(0, pairs, torch.ones_like(pairs))
    return counts.view(num_classes, num_classes)


def miou_and_pixel_acc(counts: Tensor) -> tuple[Tensor, Tensor]:
    """(mean IoU, pixel accuracy) as 0-dim tensors; NaN for both when the counts are all zero."""
    counts = counts.to(torch.float32)
    correct = counts.diagonal()
    union = counts.sum(dim=0) + counts.sum(dim=1) - correct
    occurs = union > 0
    iou = torch.where(occurs, correct / union.clamp(min=1), torch.zeros_like(correct))
    return iou.sum() / occurs.sum(), correct.sum() / counts.sum()
