"""Segmentation metrics from a confusion matrix summed on the device, batch by batch and rank by rank.

    counts = confusion_counts(outputs.argmax(dim=1), masks, num_classes)   # int64 [K, K], each batch
    miou, pixel_acc = miou_and_pixel_acc(summed_counts)                    # 0-dim tensors; .item() at log time

counts[target, prediction] counts pixels: rows are the true class, columns the predicted one.

Why a confusion matrix: mean IoU is not a mean of per-batch IoUs (a class's IoU is a ratio of
counts over the whole split), so the counts are what must be summed, across batches and ranks,
before dividing. K * K integers hold everything both metrics need, and summing them is exact.
The counting is an index_add_ into a fixed-size vector, not torch.bincount: bincount reads the
largest value to size its output, a host-device sync at every training step on a GPU.

The mean IoU averages over the classes that occur at all, in the targets or the predictions: a
class in neither has no pixels to get right or wrong (its IoU is 0 / 0), and counting it as 0 or
1 would move the mean by what the split happens to hold rather than by the model. A class that
only the predictions hold has IoU 0 and counts: predicting it was wrong everywhere. (The same as
a NaN-skipping mean of per-class IoUs, as mmsegmentation reports it.)
"""

import torch
from torch import Tensor


def confusion_counts(predictions: Tensor, masks: Tensor, num_classes: int) -> Tensor:
    """int64 [K, K] pixel counts, counts[target, prediction], on the inputs' device. `predictions`
    and `masks` are integer class maps of one shape ([B, H, W]) with values in 0..K-1."""
    if predictions.shape != masks.shape:
        raise ValueError(f"predictions {list(predictions.shape)} and masks {list(masks.shape)} differ in shape")
    pairs = masks.reshape(-1).long() * num_classes + predictions.reshape(-1).long()  # one bin a (target, prediction)
    counts = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=masks.device)
    counts.index_add_(0, pairs, torch.ones_like(pairs))
    return counts.view(num_classes, num_classes)


def miou_and_pixel_acc(counts: Tensor) -> tuple[Tensor, Tensor]:
    """(mean IoU, pixel accuracy) as 0-dim float32 tensors on the counts' device.

    IoU of class k = counts[k, k] / (row k + column k - counts[k, k]), averaged over the classes
    whose row or column holds a pixel (see the module docstring). Pixel accuracy is the trace over
    the total. All-zero counts (no pixels) give NaN for both."""
    counts = counts.to(torch.float32)  # ratios only: float32's relative error is ~1e-7 at any count
    correct = counts.diagonal()
    union = counts.sum(dim=0) + counts.sum(dim=1) - correct
    occurs = union > 0
    iou = torch.where(occurs, correct / union.clamp(min=1), torch.zeros_like(correct))  # no data-dependent shape
    return iou.sum() / occurs.sum(), correct.sum() / counts.sum()
