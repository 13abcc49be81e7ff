"""The data factories of the built-in in-memory options, what a factory returns, and the seeded
carving of splits.

A data option's `_target_` (conf/data/*.yaml) names a factory: a function (or class) called with
the whole `data` config. It returns either
- `Splits` of `(images, labels)` tensors: images `[N, C, H, W]`, uint8 (0..255) or float32 in
  [0, 1]; labels int64. build_data puts them on the device (TensorLoader); or
- `FileSplits` of map-style datasets whose items are `(uint8 [C, S, S] tensor, label)`, decoded
  in DataLoader workers (FileLoader), as trainkit.data.imagefolder does.
Every split is a pure function of the config, so every rank builds the same one without talking
to the others.
"""

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils.data import Dataset

from trainkit.errors import ConfigError

Split = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Splits:
    train: Split
    val: Split
    test: Split
    num_classes: int


@dataclass
class FileSplits:
    """Datasets decoded in DataLoader workers; data.channels and data.image_size say their shape."""

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int


def carve(num_samples: int, fractions: dict[str, float], seed: int) -> dict[str, torch.Tensor]:
    """Sorted, disjoint indices for each named split in `fractions`, and "train" for the rest.

    One permutation drawn from `seed` is cut in the order of `fractions`, so the same
    config gives the same split on every machine and every rank. trainkit.config.validation holds each
    fraction in (0, 1) and their sum below 1; what rounding leaves of `num_samples` is checked here.
    """
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed))
    parts, start = {}, 0
    for name, fraction in fractions.items():
        count = round(num_samples * fraction)
        if count == 0:
            raise ConfigError(
                f"data.{name}_fraction",
                f"{fraction} of {num_samples} samples leaves the {name} split empty; raise it",
            )
        parts[name] = order[start : start + count].sort().values
        start += count
    if start >= num_samples:
        keys = " + ".join(f"data.{name}_fraction" for name in fractions)
        raise ConfigError(f"data.{next(iter(fractions))}_fraction", f"{keys} leave no training samples; lower them")
    parts["train"] = order[start:].sort().values
    return parts


def load_digits(cfg: DictConfig) -> Splits:
    """scikit-learn's 1,797 8x8 digits, float32 in [0, 1], carved into train/val/test."""
    pixels, target = read_digits()
    images = torch.from_numpy(pixels).float().div_(16).reshape(-1, 1, 8, 8)  # pixels are 0..16
    labels = torch.from_numpy(target).long()
    parts = carve(len(labels), {"test": cfg["test_fraction"], "val": cfg["val_fraction"]}, cfg["split_seed"])
    train, val, test = ((images[parts[s]], labels[parts[s]]) for s in ("train", "val", "test"))
    return Splits(train, val, test, num_classes=10)


def read_digits() -> tuple[Any, Any]:
    """(pixels [1797, 64], labels [1797]) from the digits file scikit-learn ships, read without
    importing scikit-learn: that import (scipy included) was 1.4 s of every default run. Where the
    file is not where scikit-learn has always kept it, its own load_digits reads it."""
    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0], "datasets", "data", "digits.csv.gz") if folders else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as sklearn_digits

        digits = sklearn_digits()
        return digits.data, digits.target
    table = np.loadtxt(path, delimiter=",")  # a row: 64 pixels, then the label
    return table[:, :-1], table[:, -1].astype(np.int64)


def load_mnist(cfg: DictConfig) -> Splits:
    """torchvision's MNIST as uint8 `[N, 1, 28, 28]`; val is carved from the official train set."""
    from torchvision.datasets import MNIST

    def read(train: bool) -> Split:
        dataset = _open_torchvision(MNIST, "MNIST", "MNIST/raw/", cfg, train)
        return dataset.data.unsqueeze(1), dataset.targets.long()

    return _carve_val(read(train=True), read(train=False), cfg)


def load_cifar10(cfg: DictConfig) -> Splits:
    """torchvision's CIFAR-10 as uint8 `[N, 3, 32, 32]`; val is carved from the official train set."""
    from torchvision.datasets import CIFAR10

    def read(train: bool) -> Split:
        dataset = _open_torchvision(CIFAR10, "CIFAR-10", "cifar-10-batches-py/", cfg, train)
        images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()  # stored NHWC
        return images, torch.tensor(dataset.targets, dtype=torch.int64)

    return _carve_val(read(train=True), read(train=False), cfg)


def make_synthetic(cfg: DictConfig) -> Splits:
    """Class prototypes plus Gaussian noise, squashed to [0, 1]: learnable, any shape, no files.

    Prototypes are drawn at a quarter of the size and upsampled, so they are smooth blobs
    rather than per-pixel noise: a small shift or flip keeps a sample in its class, as with
    real images, and augmentation can be benchmarked on this data.

    One generator seeded by `split_seed` draws the prototypes, then train, val and test in
    that order, so the data is identical on every rank and in every run with the same config.
    """
    generator = torch.Generator().manual_seed(cfg["split_seed"])
    num_classes, size = cfg["num_classes"], cfg["image_size"]
    coarse = torch.randn(num_classes, cfg["channels"], max(1, size // 4), max(1, size // 4), generator=generator)
    prototypes = 2 * torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)

    def sample(count: int) -> Split:
        labels = torch.randint(num_classes, (count,), generator=generator)
        noise = torch.randn(prototypes[labels].shape, generator=generator)
        return torch.sigmoid(prototypes[labels] + cfg["noise"] * noise), labels

    train, val, test = (sample(cfg[key]) for key in ("num_samples", "val_samples", "test_samples"))
    return Splits(train, val, test, num_classes=num_classes)


def _open_torchvision(dataset_class: type, title: str, folder: str, cfg: DictConfig, train: bool) -> Any:
    root = Path(cfg["root"]).expanduser()
    if cfg["download"]:
        before = _paths_below(root)
        try:
            return dataset_class(root=str(root), train=train, download=True)
        except (RuntimeError, OSError) as error:  # every mirror failed (RuntimeError), or no network (URLError)
            _remove_created(root, before)
            reason = _flatten(error)
            raise ConfigError("data.download", f"could not fetch {title} into '{root}': {reason}") from error
        except BaseException:
            _remove_created(root, before)
            raise
    try:
        return dataset_class(root=str(root), train=train, download=False)
    except RuntimeError as error:  # torchvision's way of saying "files missing or corrupted"
        raise ConfigError(
            "data.root",
            f"no {title} files under '{root}'; set data.download=true to fetch them, "
            f"or point data.root at a folder holding {folder}",
        ) from error


# Deep enough for what torchvision writes under data.root (MNIST/raw/<file>, <archive>,
# cifar-10-batches-py/<file>), shallow enough to stay cheap on a large data folder.
_DOWNLOAD_DEPTH = 3


def _paths_below(root: Path) -> set[Path] | Path:
    """Every path under `root` down to _DOWNLOAD_DEPTH levels; if `root` does not exist, the
    highest of it and its parents that does not (what a download's makedirs would create)."""
    if not root.exists():
        top = root.absolute()
        while not top.parent.exists():
            top = top.parent
        return top
    found: set[Path] = set()
    level = [root]
    for _ in range(_DOWNLOAD_DEPTH):
        level = [child for path in level if path.is_dir() and not path.is_symlink() for child in path.iterdir()]
        found.update(level)
    return found


def _remove_created(root: Path, before: set[Path] | Path) -> None:
    """Undo what a failed download created, and only that: `before` as _paths_below gave it, so
    either the folder that did not exist (`root` or a missing parent), or the paths under `root`
    that were there."""
    import shutil

    if isinstance(before, Path):
        shutil.rmtree(before, ignore_errors=True)
        return
    after = _paths_below(root)
    created = after - before if isinstance(after, set) else set()
    for path in sorted(created, key=lambda p: len(p.parts)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _flatten(error: BaseException) -> str:
    """torchvision's multi-line download report as one line."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def _carve_val(train: Split, test: Split, cfg: DictConfig) -> Splits:
    parts = carve(len(train[1]), {"val": cfg["val_fraction"]}, cfg["split_seed"])
    images, labels = train
    return Splits(
        (images[parts["train"]], labels[parts["train"]]),
        (images[parts["val"]], labels[parts["val"]]),
        test,
        num_classes=10,
    )
