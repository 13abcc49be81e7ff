"""Your own images: `root/<split>/<class>/<file>`, resized and centre-cropped in DataLoader workers.

Augmentation and normalization happen later, batched on the device. The layout's rules are
trainkit.data.class_folders' (text folders share them), the decoding trainkit.data.image_files'. What is read and how:
docs/data.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.utils.data import Dataset

from trainkit.config.schema import Check, flag
from trainkit.data.class_folders import (
    _check_root,
    _check_same_classes,
    _class_folders,
    class_files,
    class_folder_splits,
    class_names,
)
from trainkit.data.datasets import ImageData
from trainkit.data.file_data import BadFile, FileData, FileSplits
from trainkit.data.image_files import IMAGE_EXTENSIONS, image_extensions, open_image, resize_center_crop
from trainkit.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

log = logging.getLogger(__name__)


class ImageFolderDataset(Dataset):
    """`(path, label)` pairs that decode to `(uint8 [C, S, S] tensor, label)`, or to a `BadFile`. `transform`
    (per-image augmentation of the training split) replaces the resize and centre crop."""

    def __init__(
        self,
        samples: list[tuple[str, int]],
        channels: int,
        image_size: int,
        *,
        skip_bad_files: bool = False,
        transform: Callable[[Image.Image], torch.Tensor] | None = None,
    ):
        self.samples = samples
        self.mode = "L" if channels == 1 else "RGB"
        self.image_size = image_size
        self.skip_bad_files = skip_bad_files
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | BadFile:
        path, label = self.samples[index]
        try:
            image = open_image(path, self.mode, self.image_size)
        except Exception as error:
            return BadFile(path, f"{type(error).__name__}: {error}", self.skip_bad_files)
        if self.transform is not None:
            return self.transform(image), label
        return resize_center_crop(image, self.image_size), label


@dataclass(kw_only=True)
class ImageFolder(FileData, ImageData):
    """The `data=imagefolder` option; a missing val/ or test/ is carved from train/ by the fractions."""

    val_fraction: float
    test_fraction: float
    split_seed: int
    skip_bad_files: bool = False

    config_rules: ClassVar[dict[str, Check]] = {**FileData.config_rules, "skip_bad_files": flag()}
    needs_root: ClassVar[str] = "a folder holding train/<class>/<images>"
    decodes_images: ClassVar[bool] = True

    def splits(self) -> FileSplits:
        datasets, classes = load_image_folder(self)
        return FileSplits(datasets["train"], datasets["val"], datasets["test"], num_classes=len(classes))

    def class_names(self) -> list[str]:
        return class_names(self.root) if self.root else []


def load_image_folder(data: ImageFolder) -> tuple[dict[str, ImageFolderDataset], list[str]]:
    """The train/val/test datasets and the class names (sorted folder names under train/)."""
    assert data.root is not None, "the config check requires data.root (needs_root)"
    root = _check_root(data.root)
    classes = _class_folders(root / "train")
    strays = [path.name for path in (root / "train").iterdir() if path.name not in classes]
    if strays:  # .ipynb_checkpoints/, README.txt, a loose image: not a class
        log.info("'%s': ignored %d entries that are not class folders (%s)", root / "train", len(strays), strays[:5])
    if not classes:
        raise ConfigError("data.root", f"'{root / 'train'}' has no class folders; put images in train/<class>/")
    if len(classes) == 1:  # loss 0 and accuracy 1.0, learning nothing
        raise ConfigError(
            "data.root",
            f"'{root / 'train'}' has one class folder ({classes[0]}); classification needs at least two: "
            "put each class's images in its own train/<class>/ folder",
        )
    samples = class_folder_splits(
        root,
        classes,
        lambda folder, allow_empty: _list_images(folder, classes, allow_empty_classes=allow_empty),
        lambda folder: _check_same_classes(folder, classes),
        {"val": data.val_fraction, "test": data.test_fraction},
        data.split_seed,
        "images",
        data,
    )
    datasets = {
        split: ImageFolderDataset(samples[split], data.channels, data.image_size, skip_bad_files=data.skip_bad_files)
        for split in samples
    }
    return datasets, classes


def _list_images(folder: Path, classes: list[str], allow_empty_classes: bool) -> list[tuple[str, int]]:
    kind = ("images", "non-image entries (not a format Pillow opens)")
    return class_files(folder, classes, image_extensions(), IMAGE_EXTENSIONS, kind, allow_empty_classes)
