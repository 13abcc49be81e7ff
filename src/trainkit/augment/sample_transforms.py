"""Per-sample torchvision transforms for image folders, run in the DataLoader workers.

The standard recipes for photos decoded from files (`augmentation.per_sample`): a random resized crop of the full image
(instead of the resize + centre crop), a horizontal flip, and RandAugment or TrivialAugmentWide, all from
`torchvision.transforms.v2`. They act on one image at a time, so they belong where images are decoded one at a time: the
workers, drawing from torch's global generator, which the loader seeds for each sample from (seed, epoch, the sample's
index) (trainkit.data.file_data.SeededSamples): the same draws whatever worker reads the image, after a resume too.
In-memory data has no workers: trainkit.config.validation refuses per_sample there, and the device ops of
trainkit.augment.batch_transform (batched, per-sample draws) do its augmenting.

    per_sample:
      random_resized_crop: [0.08, 1.0]  # area fraction of the full image; aspect ratio 3/4..4/3
      horizontal_flip: true
      policy: rand_augment              # rand_augment | trivial_augment_wide | null
      num_ops: 2                        # rand_augment only
      magnitude: 9                      # rand_augment only, 0..30

torchvision is imported when such a transform is built, in the main process before the workers start (they inherit it),
never on the --help, config-error or default paths. train.py attaches it in one marked line (`attach_sample_transform`);
the augmentation sections that set `per_sample` (conf/augmentation/randaugment.yaml, trivialaugment.yaml) name this
module in `_checks_`, so its checks come and go with it (docs/features.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig

from trainkit.config.schema import Check, Relation, flag, integer, interval, section, show, unknown_keys
from trainkit.config.validation import configured_data_class, flip_refused
from trainkit.data.image_files import resize_center_crop
from trainkit.data.imagefolder import ImageFolderDataset
from trainkit.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

POLICIES = ("rand_augment", "trivial_augment_wide")
KEYS = ("random_resized_crop", "horizontal_flip", "policy", "num_ops", "magnitude")


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
    options = augmentation_ops(augmentation or {}).get("per_sample")
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


def augmentation_ops(augmentation: Mapping) -> dict[str, dict[str, Any]]:
    """{"per_sample": its options that are set} when `augmentation` switches a per-sample transform on (num_ops
    and magnitude alone switch nothing on), else {}: for attach_sample_transform and the core's checks of what
    an augmentation does (trainkit.config.validation)."""
    options = augmentation.get("per_sample")
    per_sample = {key: value for key, value in options.items() if value} if isinstance(options, Mapping) else {}
    if per_sample.get("random_resized_crop") or per_sample.get("horizontal_flip") or per_sample.get("policy"):
        return {"per_sample": per_sample}
    return {}


def _policy(value: object) -> str | None:
    if value is None or value in POLICIES:
        return None
    return f"must be one of {', '.join(POLICIES)} or null (off); got {show(value)}"


def _needs_files(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    data = configured_data_class(cfg)  # None: the core's check of data._target_ says why
    if data is not None and data.in_memory and augmentation_ops(cfg.augmentation):
        yield (
            "augmentation.per_sample",
            f"runs per image in the DataLoader workers that decode files, but {cfg.data.name} is held in "
            f"memory on the device; use data decoded from files (an image folder), or the device ops "
            f"(augmentation=basic, strong or mixup: crop_padding, horizontal_flip, random_erasing, mixup_alpha, "
            f"cutmix_alpha)",
        )


def _no_flips_where_mirroring_changes_the_label(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    if augmentation_ops(cfg.augmentation).get("per_sample", {}).get("horizontal_flip"):
        yield from flip_refused(cfg, "per_sample.horizontal_flip")


def ignored_settings(cfg: DictConfig) -> list[str]:
    """RandAugment's settings under another policy: lines for the config check to print."""
    per_sample = augmentation_ops(cfg.augmentation).get("per_sample", {})
    return [
        f"augmentation.per_sample.{key}={per_sample[key]} is ignored: it sets RandAugment, and "
        f"augmentation.per_sample.policy is {per_sample.get('policy')}; leave it null"
        for key in ("num_ops", "magnitude")
        if per_sample.get(key) and per_sample.get("policy") != "rand_augment"
    ]


# Gathered by the config check: conf/augmentation/randaugment.yaml's and trivialaugment.yaml's _checks_.
CONFIG_RULES: dict[str, Check] = {
    "augmentation.per_sample": section(KEYS),
    "augmentation.per_sample.random_resized_crop": interval(above=0, null=True),
    "augmentation.per_sample.horizontal_flip": flag(null=True),
    "augmentation.per_sample.policy": _policy,
    "augmentation.per_sample.num_ops": integer(1, null=True),
    "augmentation.per_sample.magnitude": integer(0, 30, null=True),
}
CONFIG_RELATIONS = (
    unknown_keys("augmentation.per_sample", KEYS),
    Relation(("data._target_", "augmentation"), _needs_files),
    Relation(("data.mirror_changes_label", "augmentation"), _no_flips_where_mirroring_changes_the_label),
)
