"""Augmentation: the batch transform (`BatchTransform`), and beside it the features' modules that augment more, which
the augmentation options name in `_checks_` or train.py reaches from marked lines. They import each other directly."""

from trainkit.augment.batch_transform import BatchTransform

__all__ = ["BatchTransform"]
