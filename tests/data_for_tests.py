"""Data options that only tests need, importable by `_target_` (the tests put this folder on PYTHONPATH)."""

from dataclasses import dataclass
from typing import ClassVar

from trainkit.data import FileSplits, ImageData, Splits


@dataclass(kw_only=True)
class FolderOfMine(ImageData):
    """A dataset of your own with data=digits' keys, read from a folder and downloadable: the config
    check knows that from its class attributes alone, as it knows it of the built-in datasets."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    needs_root: ClassVar[str] = "the folder of mine"
    downloadable: ClassVar[bool] = True

    def splits(self) -> Splits | FileSplits:
        raise NotImplementedError("only the config check reads this class")
