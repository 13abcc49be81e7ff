"""Per-sample torchvision transforms for image folders, run in the DataLoader workers.

The standard recipes for photos decoded from files (`augmentation.per_sample`): a random resized
crop of the full image (instead of the resize + centre crop), a horizontal flip, and RandAugment
or TrivialAugmentWide, all from `torchvision.transforms.v2`. They act on one image at a time, so
they belong where images are decoded one at a time: the workers, drawing from torch's global
generator, which the loader seeds for each sample from (seed, epoch, the sample's index)
(trainkit.data.loaders.SeededSamples): the same draws whatever worker reads the image, after a
resume too. In-memory data has no workers: trainkit.config.validation refuses per_sample there, and
the device ops of trainkit.augment.batch_transform (batched, per-sample draws) do its augmenting.

    per_sample:
      random_resized_crop: [0.08, 1.0]  # area fraction of the full image; aspect ratio 3/4..4/3
      horizontal_flip: true
      policy: rand_augment              # rand_augment | trivial_augment_wide | null
      num_ops: 2                        # rand_augment only
      magnitude: 9                      # rand_augment only, 0..30

torchvision is imported when such a transform is built, in the main process before the workers
start (they inherit it), never on the --help, config-error or default paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainkit.augment.batch_transform import active_ops
from trainkit.data.images import ImageFolderDataset, resize_center_crop
from trainkit.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

POLICIES = ("rand_augment", "trivial_augment_wide")


class SampleTransform:
    """A decoded PIL image (already in the configured mode) -> augmented uint8 [C, size, size]."""

    def __init__(self, options: Mapping[str, Any], size: int):
        from torchvision.transforms import v2  # costs seconds: only when per-sample augmentation is on

        self.size = size
        scale = options.get("random_resized_crop")
        self.crop = v2.RandomResizedCrop(size, scale=tuple(scale), antialias=True) if scale else None
        ops: list[Any] = []
        if options.get("horizontal_flip"):
            ops.append(v2.RandomHorizontalFlip())
        policy = options.get("policy")
        if policy == "rand_augment":
            ops.append(v2.RandAugment(num_ops=options.get("num_ops") or 2, magnitude=options.get("magnitude") or 9))
        elif policy == "trivial_augment_wide":
            ops.append(v2.TrivialAugmentWide())
        self.ops = v2.Compose(ops) if ops else None

    def __call__(self, image: Image.Image) -> torch.Tensor:
        if self.crop is not None:
            pixels = np.array(self.crop(image))  # a PIL image in, a PIL image out
            x = torch.from_numpy(pixels).unsqueeze(0) if pixels.ndim == 2 else torch.from_numpy(pixels).permute(2, 0, 1)
            x = x.contiguous()
        else:
            x = resize_center_crop(image, self.size)
        return self.ops(x) if self.ops is not None else x

    def __repr__(self) -> str:
        return f"SampleTransform(crop={self.crop}, ops={self.ops})"


def attach_sample_transform(loader: object, augmentation: Mapping | None) -> None:
    """Give the training loader's image-folder dataset the per-sample transform of `augmentation`
    (nothing when `per_sample` is off). Call it before the loader's first pass: persistent workers
    copy the dataset when they start."""
    options = active_ops(augmentation).get("per_sample")
    if not options:
        return
    dataset = getattr(loader, "dataset", None)  # a FileLoader's dataset
    if not isinstance(dataset, ImageFolderDataset):
        raise ConfigError(
            "augmentation.per_sample",
            "runs per image while files are decoded, but this data is not decoded from files; "
            "use the device ops (crop_padding, horizontal_flip, random_erasing, mixup_alpha, cutmix_alpha)",
        )
    dataset.transform = SampleTransform(options, dataset.image_size)
