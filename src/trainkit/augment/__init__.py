"""Augmentation: batched on the device for every batch (`BatchTransform`); the recipes of the feature `augment_recipes`
(docs/features.md) beside it: per image in the DataLoader workers for image folders (trainkit.augment.sample_transforms)
and MixUp/CutMix with soft targets (trainkit.augment.mixing), which train.py reaches from marked lines.

The modules inside import each other directly."""

from trainkit.augment.batch_transform import BatchTransform

__all__ = ["BatchTransform"]
