"""Class folders: `root/<split>/<class>/<file>`, the layout image and text folders share. The splits (a missing val/
or test/ carved from train/), the files of each class folder, and the one-line refusals of a layout that is wrong.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from trainkit.data.datasets import Data, carve
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)


def class_folder_splits(
    root: Path,
    classes: list[str],
    list_files: Callable[[Path, bool], list],
    check_classes: Callable[[Path], None] | None,
    fractions: dict[str, float],
    split_seed: int,
    what: str,
    data: Data,
) -> dict[str, list]:
    """The samples of root/train/, root/val/ and root/test/, one class per class folder; a missing val/ or test/ is
    carved from train/, stratified by class. `check_classes` None: the classes were named by data.class_folders."""
    listed = {"train": list_files(root / "train", False)}
    missing = {}
    for split in ("val", "test"):
        folder = root / split
        if folder.is_dir():
            if split == "val":
                data.own_val(f"'{folder}'", "move val/'s class folders into train/")
            if check_classes is not None:
                check_classes(folder)
            listed[split] = list_files(folder, True)
        else:
            missing[split] = fractions[split]
    if missing:
        train = listed["train"]
        labels = [sample[1] for sample in train]
        parts = data.cut_val(carve(len(train), missing, split_seed, labels), split_seed, labels, classes)
        for split, indices in parts.items():
            listed[split] = [train[i] for i in indices.tolist()]
        log.info(
            "no %s under '%s': carved from the %d train/ %s by data.split_seed=%s (%s)",
            " or ".join(f"{split}/" for split in missing),
            root,
            len(train),
            what,
            split_seed,
            ", ".join(f"{split}: {len(listed[split])}" for split in ("train", *missing)),
        )
    for split in ("val", "test"):
        if split == "val" and split in missing:
            continue  # a carved val split: Data.cut_val warned
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
