"""The Python standard library's own source: a text corpus on every machine, with nothing to download, read by
data=stdlib_functions and data=text. Splits are by file, so no file's text is in two splits. The corpus changes
with the Python version (corpus_version()), which the data fingerprint records.
"""

import platform
import sysconfig
from pathlib import Path

from trainkit.data.datasets import Data, carve

# Folders of tests and of installed packages: not the standard library's own code.
LEFT_OUT = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files outside its test folders, sorted by their path below `root`."""
    root = root or stdlib_root()
    return sorted(
        path
        for path in root.rglob("*.py")
        if not LEFT_OUT.intersection(path.relative_to(root).parts[:-1]) and path.is_file()
    )


def package_of(path: Path, root: Path | None = None) -> str:
    """The top-level package a file belongs to (`email/mime/text.py` -> "email"); "" for a top-level module."""
    parts = path.relative_to(root or stdlib_root()).parts
    return parts[0] if len(parts) > 1 else ""


def corpus_version() -> str:
    """What decides the corpus's text: the interpreter and its version."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def split_by_file(
    files: list[Path], val_fraction: float, test_fraction: float, seed: int, data: Data | None = None
) -> dict[str, list[Path]]:
    """Disjoint train/val/test lists of `files`, carved by `seed` (trainkit.data.datasets.carve), each in file order;
    `data`: the option whose Data.cut_val may cut val from train and val in place of the carved one."""
    parts = carve(len(files), {"test": test_fraction, "val": val_fraction}, seed)
    if data is not None:
        parts = data.cut_val(parts, seed)
    return {name: [files[i] for i in parts[name].tolist()] for name in ("train", "val", "test")}
