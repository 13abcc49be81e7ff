"""Data options of the tests' own that read their samples as file data does (FileData: a DataLoader, the option's
collate), importable by `_target_`: batches that are dicts, not (inputs, targets) pairs."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from trainkit.config.schema import Check, flag
from trainkit.data.datasets import ImageData, carve, read_digits
from trainkit.data.file_data import FileData, FileSplits

CAPTIONS = [torch.tensor(list(text.ljust(20).encode())) for text in ("a digit", "a handwritten digit", "scanned")]


class _Signals(torch.utils.data.Dataset):
    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor):
        self.pixels, self.labels = pixels, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        length = 16 + index * 7 % 49  # 16 to 64 values: the digit's first rows of pixels
        return {"signal": self.pixels[index, :length], "label": self.labels[index]}


@dataclass(kw_only=True)
class DigitSignals(FileData):
    """The digits as 1-D signals of uneven lengths (each a digit's first 16 to 64 pixels), read as file data is
    (DataLoader, the option's collate): batches are dicts, {"signal": [B, T] zero-padded to the batch's longest,
    "lengths": [B], "label": [B]}. A data kind whose batch is not an (inputs, targets) pair."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    uses_root: ClassVar[bool] = False

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
    skip_bad_files: bool = False

    config_rules: ClassVar[dict[str, Check]] = {**FileData.config_rules, "skip_bad_files": flag()}
    size_unit: ClassVar[str] = "values"


SIZED_SIGNALS = [  # the overrides that pick SizedDigitSignals in place of the digits' images
    "data._target_=file_data_for_tests.SizedDigitSignals",
    *(f"~data.{key}" for key in ("channels", "image_size", "mean", "std", "mirror_changes_label")),
    "model.in_channels=64",  # model=cnn reads data.channels, which signals have not
]


class _Captioned(torch.utils.data.Dataset):
    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return {"image": self.images[index], "caption": CAPTIONS[index % 3], "targets": self.labels[index]}


@dataclass(kw_only=True)
class CaptionedDigitsWithoutPredictionBatch(FileData, ImageData):
    """The digits as image + text dict batches, {"image": [B, 1, 8, 8] uint8, "caption": [B, 20] byte ids,
    "targets": [B]}, read as file data is: the batch transform applies to the "image" entry alone (image_entries).
    It does not say how predict= images make one of its batches (CaptionedDigits does)."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    uses_root: ClassVar[bool] = False
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
