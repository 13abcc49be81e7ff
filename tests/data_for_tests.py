"""Data options that only tests need, importable by `_target_` (the tests put this folder on PYTHONPATH)."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from trainkit.data import Data, ImageData, Splits
from trainkit.data.datasets import Digits, carve, read_digits
from trainkit.data.feature_rows import read_feature_rows


@dataclass(kw_only=True)
class FolderOfMine(ImageData):
    """A dataset of your own with data=digits' keys, read from a folder and downloadable: the config
    check knows that from its class attributes alone, as it knows it of the built-in datasets."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    needs_root: ClassVar[str] = "the folder of mine"
    downloadable: ClassVar[bool] = True

    def splits(self) -> Splits:
        raise NotImplementedError("only the config check reads this class")


@dataclass(kw_only=True)
class ThreeChannelDigits(Digits):
    """The digits with their grey image in each of 3 channels (data.channels=3): a batch whose memory layout
    trainer.channels_last changes, which a 1-channel batch's does not."""

    def splits(self) -> Splits:
        made = super().splits()
        train, val, test = (
            (images.expand(-1, 3, -1, -1).contiguous(), labels) for images, labels in (made.train, made.val, made.test)
        )
        return Splits(train, val, test, num_classes=made.num_classes)


@dataclass(kw_only=True)
class DigitsTable(Data):
    """The digits as a table, not images: 64 pixel features a row, the digit as a float target (a regression),
    carved into train/val/test like the digits. A data option of kind "generic": no channels, size or
    normalization keys, no batch transform, float targets kept float."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    uses_root: ClassVar[bool] = False
    prediction_files: ClassVar[tuple[str, ...]] = (".csv", ".npy")  # predict=: a CSV or .npy file of 64-pixel rows

    def splits(self) -> Splits:
        pixels, target = read_digits()
        features = torch.from_numpy(pixels).float().div_(16)  # [1797, 64]
        values = torch.from_numpy(target).float() + 0.25  # float targets: a cast to int64 would change them
        parts = carve(len(values), {"test": self.test_fraction, "val": self.val_fraction}, self.split_seed)
        parts = self.cut_val(parts, self.split_seed)  # data.folds: a regression has no classes to stratify by
        train, val, test = ((features[parts[s]], values[parts[s]]) for s in ("train", "val", "test"))
        return Splits(train, val, test, num_classes=1)

    def read_for_prediction(self, path: Path) -> Sequence[torch.Tensor]:
        return read_feature_rows(path, columns=64).div_(16)  # the features as splits() scales them


def signals(count: int, seed: int = 0) -> dict:
    """A dict batch of `count` signals of uneven lengths (3 to 9 values), zero-padded, as DigitSignals
    (tests/file_data_for_tests.py) collates."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 10, (count,), generator=generator)
    signal = torch.rand(count, int(lengths.max()), generator=generator)
    signal[torch.arange(signal.shape[1]) >= lengths[:, None]] = 0.0
    return {"signal": signal, "lengths": lengths, "label": torch.randint(0, 10, (count,), generator=generator)}
