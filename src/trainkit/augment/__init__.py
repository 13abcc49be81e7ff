"""Augmentation: the batch transform (`BatchTransform`: scale, resize, the shift of augmentation=shift, normalize, on
the device for every batch), and beside it the modules of the features that augment more (docs/features.md), which
the augmentation options name in `_checks_` or train.py reaches from marked lines.

The modules inside import each other directly."""

from trainkit.augment.batch_transform import BatchTransform

__all__ = ["BatchTransform"]
