"""Your own images: `root/<split>/<class>/<file>`, decoded with PIL in DataLoader workers.

Each image is resized (shorter side) and centre-cropped to a square uint8 tensor here;
augmentation and normalization happen later, batched on the device.
"""

import logging
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from PIL import Image
from torch.utils.data import Dataset

from trainkit.data.datasets import FileSplits, carve
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")


class ImageFolderDataset(Dataset):
    """`(path, label)` pairs that decode to `(uint8 [C, S, S] tensor, label)`."""

    def __init__(self, samples: list[tuple[str, int]], channels: int, image_size: int):
        self.samples = samples
        self.mode = "L" if channels == 1 else "RGB"
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return decode(path, self.mode, self.image_size), label


def decode(path: str, mode: str, size: int) -> torch.Tensor:
    """Open, convert to `mode`, resize the shorter side to `size`, centre-crop `size x size`."""
    with Image.open(path) as image:
        image.draft(mode, (size, size))  # JPEG only: decode at a reduced scale still >= size, much faster
        image = image.convert(mode)
    scale = size / min(image.size)
    width, height = (max(size, round(side * scale)) for side in image.size)
    image = image.resize((width, height), Image.Resampling.BILINEAR)
    left, top = (width - size) // 2, (height - size) // 2
    pixels = np.array(image.crop((left, top, left + size, top + size)))  # a writable copy for torch
    if pixels.ndim == 2:
        return torch.from_numpy(pixels).unsqueeze(0)
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def load_image_folder(cfg: DictConfig) -> tuple[dict[str, ImageFolderDataset], list[str]]:
    """The train/val/test datasets and the class names (sorted folder names under train/)."""
    root = _check_root(cfg.get("root"))
    classes = _class_folders(root / "train")
    if not classes:
        raise ConfigError("data.root", f"'{root / 'train'}' has no class folders; put images in train/<class>/")
    samples = {"train": _list_images(root / "train", classes, allow_empty_classes=False)}
    missing = {}
    for split in ("val", "test"):
        folder = root / split
        if folder.is_dir():
            _check_same_classes(folder, classes)
            samples[split] = _list_images(folder, classes, allow_empty_classes=True)
        else:
            missing[split] = cfg[f"{split}_fraction"]
    if missing:
        train = samples["train"]
        for split, indices in carve(len(train), missing, cfg["split_seed"]).items():
            samples[split] = [train[i] for i in indices.tolist()]
        log.info(
            "no %s under '%s': carved from the %d train/ images by data.split_seed=%s (%s)",
            " or ".join(f"{split}/" for split in missing),
            root,
            len(train),
            cfg["split_seed"],
            ", ".join(f"{split}: {len(samples[split])}" for split in ("train", *missing)),
        )
    channels, image_size = cfg["channels"], cfg["image_size"]
    return {split: ImageFolderDataset(samples[split], channels, image_size) for split in samples}, classes


def image_folder(cfg: DictConfig) -> FileSplits:
    """The `data=imagefolder` factory (conf/data/imagefolder.yaml's `_target_`)."""
    datasets, classes = load_image_folder(cfg)
    return FileSplits(datasets["train"], datasets["val"], datasets["test"], num_classes=len(classes))


def _check_root(root: str | Path) -> Path:
    root = Path(root).expanduser()  # never null: trainkit.config requires data.root for image folders
    if not root.is_dir():
        raise ConfigError(
            "data.root", f"folder '{root}' does not exist; set data.root to a folder holding train/<class>/"
        )
    if not (root / "train").is_dir():
        raise ConfigError("data.root", f"folder '{root}' has no train/ folder; expected {root}/train/<class>/<images>")
    return root


def _class_folders(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.is_dir() and not path.name.startswith("."))


def _check_same_classes(folder: Path, classes: list[str]) -> None:
    found = _class_folders(folder)
    if found != classes:
        missing, extra = sorted(set(classes) - set(found)), sorted(set(found) - set(classes))
        raise ConfigError(
            "data.root",
            f"class folders of '{folder}' differ from train/ (missing {missing}, extra {extra}); "
            f"val/ and test/ need the same class folders as train/",
        )


def _list_images(folder: Path, classes: list[str], allow_empty_classes: bool) -> list[tuple[str, int]]:
    # A small val/ or test/ may lack a class; train/ may not, and no split may be empty.
    samples = []
    for label, name in enumerate(classes):
        files = sorted(
            path
            for path in (folder / name).iterdir()
            if path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith(".")
        )
        if not files and not allow_empty_classes:
            raise ConfigError(
                "data.root", f"class folder '{folder / name}' holds no images ({', '.join(IMAGE_EXTENSIONS)})"
            )
        samples += [(str(path), label) for path in files]
    if not samples:
        raise ConfigError("data.root", f"'{folder}' holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    return samples
