"""torchvision's MNIST and CIFAR-10 (data=mnist, data=cifar10), read from data.root or fetched into it once with
data.download=true; a failed download removes what it created. Val is carved from the official training set."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from trainkit.data.datasets import ImageData, Split, Splits, carve
from trainkit.errors import ConfigError


@dataclass(kw_only=True)
class MNIST(ImageData):
    """torchvision's MNIST as uint8 `[N, 1, 28, 28]`; val is carved from the official train set."""

    val_fraction: float
    split_seed: int

    needs_root: ClassVar[str] = "a folder holding MNIST/raw/"
    downloadable: ClassVar[bool] = True

    def splits(self) -> Splits:
        from torchvision.datasets import MNIST as TorchvisionMNIST

        def read(train: bool) -> Split:
            dataset = _open_torchvision(TorchvisionMNIST, "MNIST", "MNIST/raw/", self, train)
            return dataset.data.unsqueeze(1), dataset.targets.long()

        return _carve_val(read(train=True), read(train=False), self)


@dataclass(kw_only=True)
class CIFAR10(ImageData):
    """torchvision's CIFAR-10 as uint8 `[N, 3, 32, 32]`; val is carved from the official train set."""

    val_fraction: float
    split_seed: int

    needs_root: ClassVar[str] = "a folder holding cifar-10-batches-py/"
    downloadable: ClassVar[bool] = True

    def splits(self) -> Splits:
        from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

        def read(train: bool) -> Split:
            dataset = _open_torchvision(TorchvisionCIFAR10, "CIFAR-10", "cifar-10-batches-py/", self, train)
            images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()  # stored NHWC
            return images, torch.tensor(dataset.targets, dtype=torch.int64)

        return _carve_val(read(train=True), read(train=False), self)


def _open_torchvision(dataset_class: type, title: str, folder: str, data: ImageData, train: bool) -> Any:
    assert data.root is not None, "the config check requires data.root (needs_root)"
    root = Path(data.root).expanduser()
    if data.download:
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


# Deep enough for what torchvision writes under data.root, shallow enough to stay cheap on a large folder.
_DOWNLOAD_DEPTH = 3


def _paths_below(root: Path) -> set[Path] | Path:
    """Every path under `root` down to _DOWNLOAD_DEPTH levels, or the highest missing folder if `root` is missing."""
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
    """Removes what a failed download created, and only that (`before`: what _paths_below gave before it)."""
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


def _carve_val(train: Split, test: Split, data: "MNIST | CIFAR10") -> Splits:
    images, labels = train
    parts = data.cut_val(carve(len(labels), {"val": data.val_fraction}, data.split_seed), data.split_seed, labels)
    return Splits(
        (images[parts["train"]], labels[parts["train"]]),
        (images[parts["val"]], labels[parts["val"]]),
        test,
        num_classes=10,
    )
