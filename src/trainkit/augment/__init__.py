"""Augmentation: batched on the device for every batch (`BatchTransform`), per image in the DataLoader
workers for image folders (`attach_sample_transform`), and MixUp/CutMix with soft targets (`LabelMixing`).

train.py imports from here; the modules inside import each other directly."""

from trainkit.augment.batch_transform import BatchTransform
from trainkit.augment.mixing import LabelMixing
from trainkit.augment.sample_transforms import attach_sample_transform

__all__ = ["BatchTransform", "LabelMixing", "attach_sample_transform"]
