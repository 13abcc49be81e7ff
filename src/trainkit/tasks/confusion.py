"""A confusion matrix, counts[target, prediction], of class maps or class labels, summed over batches and ranks.
Counting uses index_add_, not torch.bincount, which syncs with the host to size its output."""

import torch
from torch import Tensor


def confusion_counts(predictions: Tensor, targets: Tensor, num_classes: int) -> Tensor:
    """int64 [K, K] counts of two tensors of classes of one shape (labels or class maps), with values in 0..K-1."""
    if predictions.shape != targets.shape:
        raise ValueError(f"predictions {list(predictions.shape)} and targets {list(targets.shape)} differ in shape")
    pairs = targets.reshape(-1).long() * num_classes + predictions.reshape(-1).long()
    counts = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=targets.device)
    counts.index_add_(0, pairs, torch.ones_like(pairs))
    return counts.view(num_classes, num_classes)
