"""Data options that only tests need, importable by `_target_` (the tests put this folder on PYTHONPATH)."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from trainkit.data import Data, FileSplits, ImageData, Splits
from trainkit.data.datasets import carve, read_digits


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


@dataclass(kw_only=True)
class DigitsTable(Data):
    """The digits as a table, not images: 64 pixel features a row, the digit as a float target (a regression),
    carved into train/val/test like the digits. A data option of kind "generic": no channels, size or
    normalization keys, no batch transform, float targets kept float."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    uses_root: ClassVar[bool] = False

    def splits(self) -> Splits:
        pixels, target = read_digits()
        features = torch.from_numpy(pixels).float().div_(16)  # [1797, 64]
        values = torch.from_numpy(target).float() + 0.25  # float targets: a cast to int64 would change them
        parts = carve(len(values), {"test": self.test_fraction, "val": self.val_fraction}, self.split_seed)
        train, val, test = ((features[parts[s]], values[parts[s]]) for s in ("train", "val", "test"))
        return Splits(train, val, test, num_classes=1)
