"""Your own images: `root/<split>/<class>/<file>`, resized and centre-cropped in DataLoader workers.

Augmentation and normalization happen later, batched on the device. A file Pillow cannot read becomes a `BadFile`
rather than an exception, which torch would re-raise in the main process as a multi-line RuntimeError. What is read
and how: docs/data.md. Pillow is imported only where images are opened.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset

from trainkit.data.datasets import FileSplits, Folds, ImageData, carve
from trainkit.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

log = logging.getLogger(__name__)

# Named in messages; any extension Pillow can open is read.
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")
SKIP_HINT = "fix or remove it, or pass data.skip_bad_files=true to skip unreadable images (counted in the log)"


@dataclass(frozen=True)
class BadFile:
    """What the dataset returns for a file Pillow cannot read: picklable, for FileLoader to raise or skip."""

    path: str
    reason: str
    skip: bool  # data.skip_bad_files

    def error(self) -> ConfigError:
        return ConfigError("data.root", f"cannot read image '{self.path}' ({self.reason}); {SKIP_HINT}")


@dataclass(kw_only=True)
class ImageFolder(Folds, ImageData):
    """The `data=imagefolder` option; a missing val/ or test/ is carved from train/ by the fractions."""

    val_fraction: float
    test_fraction: float
    split_seed: int
    prefetch_factor: int = 2  # batches each worker keeps ready
    pin_memory: bool | str = "auto"  # auto: on with CUDA
    skip_bad_files: bool = False

    in_memory: ClassVar[bool] = False
    needs_root: ClassVar[str] = "a folder holding train/<class>/<images>"
    decodes_images: ClassVar[bool] = True

    def splits(self) -> FileSplits:
        datasets, classes = load_image_folder(self)
        return FileSplits(datasets["train"], datasets["val"], datasets["test"], num_classes=len(classes))

    def class_names(self) -> list[str]:
        return class_names(self.root) if self.root else []


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


def decode(path: str, mode: str, size: int) -> torch.Tensor:
    """The image at `path` in `mode`, resized and centre-cropped to `size`; raises what Pillow raises."""
    return resize_center_crop(open_image(path, mode, size), size)


def open_image(path: str, mode: str, size: int) -> Image.Image:
    """The fully decoded image in `mode` ("L" or "RGB"), alpha dropped. Pillow's own convert would clip 16-bit
    values to 255 and warn about palette transparency."""
    from PIL import Image

    with Image.open(path) as image:
        image.draft(mode, (size, size))  # JPEG only: decode at a reduced scale still >= size, much faster
        image.load()  # a truncated or corrupt file fails here, inside the caller's try
        if image.mode == "I" or image.mode.startswith("I;16"):
            # 16-bit greyscale (PNG/TIFF; "I" is how Pillow may open it): keep the top 8 bits.
            pixels = np.asarray(image, dtype=np.float64) / 256
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="L")
        elif image.mode == "P" and "transparency" in image.info:
            image = image.convert("RGBA")
        return image.convert(mode)


def resize_center_crop(image: Image.Image, size: int) -> torch.Tensor:
    """Resize the shorter side to `size`, centre-crop `size x size`: uint8 [C, size, size]."""
    from PIL import Image

    scale = size / min(image.size)
    width, height = (max(size, round(side * scale)) for side in image.size)
    image = image.resize((width, height), Image.Resampling.BILINEAR)
    left, top = (width - size) // 2, (height - size) // 2
    pixels = np.array(image.crop((left, top, left + size, top + size)))  # a writable copy for torch
    if pixels.ndim == 2:
        return torch.from_numpy(pixels).unsqueeze(0)
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


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


def class_folder_splits(
    root: Path,
    classes: list[str],
    list_files: Callable[[Path, bool], list],
    check_classes: Callable[[Path], None] | None,
    fractions: dict[str, float],
    split_seed: int,
    what: str,
    folding: Folds,
) -> dict[str, list]:
    """The samples of root/train/, root/val/ and root/test/, one class per class folder; a missing val/ or test/ is
    carved from train/, stratified by class. `check_classes` None: the classes were named by data.class_folders."""
    listed = {"train": list_files(root / "train", False)}
    missing = {}
    for split in ("val", "test"):
        folder = root / split
        if folder.is_dir():
            if split == "val" and folding.folds is not None:
                raise ConfigError(
                    "data.folds",
                    f"is {folding.folds}, but '{folder}' is a val split of its own: folds are cut from train/ alone "
                    f"and one of them is val; remove data.folds, or move val/'s class folders into train/",
                )
            if check_classes is not None:
                check_classes(folder)
            listed[split] = list_files(folder, True)
        else:
            missing[split] = fractions[split]
    if missing:
        train = listed["train"]
        labels = [sample[1] for sample in train]
        parts = folding.folded(carve(len(train), missing, split_seed, labels), split_seed, labels, classes)
        for split, indices in parts.items():
            listed[split] = [train[i] for i in indices.tolist()]
        log.info(
            "no %s under '%s': carved from the %d train/ %s by data.split_seed=%s%s (%s)",
            " or ".join(f"{split}/" for split in missing),
            root,
            len(train),
            what,
            split_seed,
            f", val {folding.fold_name()}" if folding.folds is not None else "",
            ", ".join(f"{split}: {len(listed[split])}" for split in ("train", *missing)),
        )
    for split in ("val", "test"):
        if split == "val" and split in missing:
            continue  # a carved val split: Folds.folded warned
        warn_lacking_classes(split, listed[split], classes, f"'{root / split}'" if split not in missing else None)
    return listed


def warn_lacking_classes(split: str, samples: list, classes: list[str], folder: str | None) -> None:
    """Warns once for a val or test split that lacks some of the training classes (`folder` None: carved)."""
    present = {sample[1] for sample in samples}
    lacking = [name for label, name in enumerate(classes) if label not in present]
    if not lacking:
        return
    others = [name for name in classes if name not in lacking]
    where = folder or f"the {split} split carved from train/ (data.{split}_fraction)"
    always = f" (a model that always answers {others[0]} scores {split}/acc 1.0)" if len(others) == 1 else ""
    fix = "add some to it" if folder else f"raise data.{split}_fraction"
    log.warning(
        f"{where} holds no file of class {', '.join(lacking)}, which train/ has: its metrics cover "
        f"{', '.join(others)} alone{always}; {fix}"
    )


@cache
def image_extensions() -> frozenset[str]:
    """Every file extension Pillow can open here (lower case), e.g. .png, .jpg, .webp, .ppm, .tga."""
    from PIL import Image

    return frozenset(ext.lower() for ext, kind in Image.registered_extensions().items() if kind in Image.OPEN)


def class_names(root: str | Path) -> list[str]:
    """The class names of an image folder, in label order: the sorted class folders of root/train
    (what `ImageFolder` numbers its labels by); [] when root/train is not there."""
    train = Path(root).expanduser() / "train"
    return _class_folders(train) if train.is_dir() else []


def walk_files(folder: Path, extensions: Collection[str]) -> tuple[list[Path], list[Path], list[Path]]:
    """(the files under `folder` with one of `extensions`, sorted; the hidden entries; the others): the one rule by
    which class folders and predict= folders are read."""
    files, hidden, others = [], [], []
    for top, folders, names in os.walk(folder):  # symlinked sub-folders are not entered, as Path.rglob does not
        hidden += [Path(top, name) for name in [*folders, *names] if name.startswith(".")]  # .DS_Store, .git/
        folders[:] = [name for name in folders if not name.startswith(".")]
        others += [Path(top, name) for name in folders if os.path.islink(os.path.join(top, name))]
        for name in names:
            path = Path(top, name)
            if name.startswith("."):
                continue
            if path.suffix.lower() in extensions and path.is_file():
                files.append(path)
            else:
                others.append(path)
    return sorted(files), hidden, others


def is_hidden(path: Path, root: Path) -> bool:
    """A hidden file, or one below a hidden folder (.git/, .ipynb_checkpoints/), under `root`: never read."""
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _check_root(root: str | Path, files: str = "<images>") -> Path:
    """data.root as a Path, refused in one line where it holds no train/ folder; `files`: what a class folder holds."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError(
            "data.root", f"folder '{root}' does not exist; set data.root to a folder holding train/<class>/"
        )
    if not (root / "train").is_dir():
        found = _class_folders(root)
        if root.name in ("train", "val", "test"):  # aclImdb/train given for aclImdb
            hint = f"; it looks like a split's folder itself: set data.root={root.parent}"
        elif found:
            hint = f"; if its folders ({', '.join(found[:5])}) are the classes, move them into {root}/train/"
        else:
            hint = ""
        raise ConfigError(
            "data.root", f"folder '{root}' has no train/ folder; expected {root}/train/<class>/{files}{hint}"
        )
    return root


def _class_folders(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.is_dir() and not path.name.startswith("."))


def _check_same_classes(folder: Path, classes: list[str], class_list_key: str | None = None) -> None:
    """Refuses a val/ or test/ whose class folders are not train/'s: that is a layout mistake, not a missing class."""
    found = _class_folders(folder)
    if found != classes:
        missing, extra = sorted(set(classes) - set(found)), sorted(set(found) - set(classes))
        both = [name for name in classes if name in found]
        hint = (
            f", or name the classes to read: {class_list_key}=[{','.join(both)}]"
            if class_list_key and len(both) > 1
            else ""
        )
        raise ConfigError(
            "data.root",
            f"class folders of '{folder}' differ from train/ (missing {missing}, extra {extra}); "
            f"val/ and test/ need the same class folders as train/ (one may be empty: a warning){hint}",
        )


def _list_images(folder: Path, classes: list[str], allow_empty_classes: bool) -> list[tuple[str, int]]:
    kind = ("images", "non-image entries (not a format Pillow opens)")
    return class_files(folder, classes, image_extensions(), IMAGE_EXTENSIONS, kind, allow_empty_classes)


def class_files(
    folder: Path,
    classes: list[str],
    extensions: Collection[str],
    shown: Sequence[str],
    kind: tuple[str, str],
    allow_empty_classes: bool,
) -> list[tuple[str, int]]:
    """(path, label) of the files in each class folder of `folder`, sorted per class. Only val/ and test/ may lack a
    class, and no split may be empty."""
    samples = []
    hidden, others = 0, 0  # ignored entries, counted in the log
    for label, name in enumerate(classes):
        files, hidden_here, others_here = (
            walk_files(folder / name, extensions) if (folder / name).is_dir() else ([], [], [])
        )
        hidden, others = hidden + len(hidden_here), others + len(others_here)
        if not files and not allow_empty_classes:
            raise ConfigError(
                "data.root",
                f"class folder '{folder / name}' holds no {kind[0]} ({', '.join(shown)}), sub-folders included",
            )
        samples += [(str(path), label) for path in files]
    if hidden or others:
        log.info("'%s': ignored %d hidden and %d %s in its class folders", folder, hidden, others, kind[1])
    if not samples:
        raise ConfigError("data.root", f"'{folder}' holds no {kind[0]} ({', '.join(shown)})")
    return samples
