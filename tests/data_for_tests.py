"""Data options that only tests need, importable by `_target_` (the tests put this folder on PYTHONPATH)."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from trainkit.data import Data, FileSplits, ImageData, Splits
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

    def splits(self) -> Splits | FileSplits:
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


class _Signals(torch.utils.data.Dataset):
    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor):
        self.pixels, self.labels = pixels, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        length = 16 + index * 7 % 49  # 16 to 64 values: the digit's first rows of pixels
        return {"signal": self.pixels[index, :length], "label": self.labels[index]}


@dataclass(kw_only=True)
class DigitSignals(Data):
    """The digits as 1-D signals of uneven lengths (each a digit's first 16 to 64 pixels), read as file data is
    (DataLoader, the option's collate): batches are dicts, {"signal": [B, T] zero-padded to the batch's longest,
    "lengths": [B], "label": [B]}. A data kind whose batch is not an (inputs, targets) pair."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    uses_root: ClassVar[bool] = False
    in_memory: ClassVar[bool] = False

    def splits(self) -> FileSplits:
        pixels, target = read_digits()
        signals, labels = torch.from_numpy(pixels).float().div_(16), torch.from_numpy(target).long()
        parts = carve(len(labels), {"test": self.test_fraction, "val": self.val_fraction}, self.split_seed)
        parts = self.cut_val(parts, self.split_seed, labels)
        train, val, test = (_Signals(signals[parts[s]], labels[parts[s]]) for s in ("train", "val", "test"))
        return FileSplits(train, val, test, num_classes=10)

    def collate(self, items: list[dict]) -> dict:
        signals = [item["signal"] for item in items]
        return {
            "signal": torch.nn.utils.rnn.pad_sequence(signals, batch_first=True),
            "lengths": torch.tensor([len(signal) for signal in signals]),
            "label": torch.stack([item["label"] for item in items]),
        }


@dataclass(kw_only=True)
class SizedDigitSignals(DigitSignals):
    """DigitSignals with the keys file data of yours may take: the loader's (data.prefetch_factor,
    data.pin_memory, data.skip_bad_files) and a size budget (data.max_values: values a batch), for their checks."""

    max_values: int | None = None
    prefetch_factor: int = 2
    pin_memory: bool | str = "auto"
    skip_bad_files: bool = False

    size_unit: ClassVar[str] = "values"


SIZED_SIGNALS = [  # the overrides that pick SizedDigitSignals in place of the digits' images
    "data._target_=data_for_tests.SizedDigitSignals",
    *(f"~data.{key}" for key in ("channels", "image_size", "mean", "std", "mirror_changes_label")),
    "model.in_channels=64",  # model=cnn reads data.channels, which signals have not
]


CAPTIONS = [torch.tensor(list(text.ljust(20).encode())) for text in ("a digit", "a handwritten digit", "scanned")]


def signals(count: int, seed: int = 0) -> dict:
    """A dict batch of `count` signals of uneven lengths (3 to 9 values), zero-padded, as DigitSignals collates."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 10, (count,), generator=generator)
    signal = torch.rand(count, int(lengths.max()), generator=generator)
    signal[torch.arange(signal.shape[1]) >= lengths[:, None]] = 0.0
    return {"signal": signal, "lengths": lengths, "label": torch.randint(0, 10, (count,), generator=generator)}


class _Captioned(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return {"image": self.images[index], "caption": CAPTIONS[index % 3], "targets": self.labels[index]}


@dataclass(kw_only=True)
class CaptionedDigitsWithoutPredictionBatch(ImageData):
    """The digits as image + text dict batches, {"image": [B, 1, 8, 8] uint8, "caption": [B, 20] byte ids,
    "targets": [B]}, read as file data is: the batch transform applies to the "image" entry alone (image_entries).
    It does not say how predict= images make one of its batches (CaptionedDigits does)."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    uses_root: ClassVar[bool] = False
    in_memory: ClassVar[bool] = False
    image_entries: ClassVar[tuple[str, ...]] = ("image",)

    def splits(self) -> FileSplits:
        pixels, target = read_digits()
        images = torch.from_numpy(pixels).mul(255 / 16).round().to(torch.uint8).reshape(-1, 1, 8, 8)
        labels = torch.from_numpy(target).long()
        parts = carve(len(labels), {"test": self.test_fraction, "val": self.val_fraction}, self.split_seed)
        parts = self.cut_val(parts, self.split_seed, labels)
        train, val, test = (_Captioned(images[parts[s]], labels[parts[s]]) for s in ("train", "val", "test"))
        return FileSplits(train, val, test, num_classes=10)


@dataclass(kw_only=True)
class CaptionedDigits(CaptionedDigitsWithoutPredictionBatch):
    """Image + text dict batches whose predict= batches are of the same form: images from files, each with the
    caption "a digit"."""

    def prediction_batch(self, samples: list) -> dict:
        return {"image": torch.stack(samples), "caption": CAPTIONS[0].expand(len(samples), -1)}
