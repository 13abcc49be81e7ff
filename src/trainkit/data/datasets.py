"""What a data option is (Data; ImageData for images), what its splits() returns (Splits) and how they load, the
seeded carving of splits, and the built-in Digits. What a data option may set: docs/data.md#a-data-options-class."""

import importlib
import importlib.util
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from trainkit.data.fingerprint import samples_identity
from trainkit.data.loaders import ShardedLoader, TensorLoader
from trainkit.errors import ConfigError

Split = tuple[torch.Tensor, torch.Tensor]
log = logging.getLogger(__name__)
# Free device memory a dataset may fill; the rest is for the model, activations and the optimizer.
DEVICE_SHARE = 0.5


@dataclass
class Splits:
    train: Split
    val: Split
    test: Split
    num_classes: int


class Tokenizer(Protocol):
    """What the core reads of the tokenizer a data option makes (Data.learned); tasks read the rest."""

    vocabulary: int

    def fingerprint(self) -> str | None: ...


# kw_only lets a subclass add fields without defaults after these (Hydra passes keywords).
@dataclass(kw_only=True)
class Data:
    """The keys every data option has. A subclass adds its own keys as fields and defines `splits()`; the config
    check reads the class attributes from the class before anything is built."""

    name: str  # for messages only: the class decides what loads
    root: str | None = None
    download: bool = False
    num_classes: int | None  # null: as many as the data has
    batch_size: int  # per process
    eval_batch_size: int
    num_workers: int | str
    drop_last: bool
    shuffle: bool
    folds: int | None = None  # feature: folds
    fold: int | None = None  # feature: folds

    kind: ClassVar[str] = "generic"
    size_unit: ClassVar[str | None] = None
    in_memory: ClassVar[bool] = True
    needs_root: ClassVar[str] = ""
    uses_root: ClassVar[bool] = True
    downloadable: ClassVar[bool] = False
    needs_num_classes: ClassVar[bool] = False
    prediction_files: ClassVar[tuple[str, ...]] = ()
    suits: ClassVar[tuple[str, ...]] = ()

    def splits(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define splits()")

    def cut_val(
        self, parts: dict[str, torch.Tensor], seed: int, labels: Any = None, names: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """`parts` (a carve's indices) with the val split a feature cuts from train and val (data.folds), or `parts`
        itself; every class that carves val calls it. `labels`: stratify, and warn of a class val lacks."""
        from trainkit.data.folds import folded  # feature: folds

        parts = folded(parts, self.folds, self.fold, seed, labels, names)  # feature: folds
        if labels is not None:  # a carve of a few samples may miss a class
            warn_val_lacking_classes(parts, labels, names, "carved by data.val_fraction; raise it")
        return parts

    def own_val(self, where: str, instead: str) -> None:
        """Called in place of cut_val where the val split is the data's own (`where`): data.folds refuses it."""
        from trainkit.data.folds import refuse_own_val  # feature: folds

        refuse_own_val(self, where, instead)  # feature: folds

    def learns_in(self, run_dir: Path | None, learns: bool = True) -> None:
        """Where the option saves what it learns of the training split (a tokenizer), and whether it learns it."""

    def read_learned(self, run_dir: Path | None) -> None:
        """Reads back from `run_dir` what the run learned of its training split, for predictions."""

    def learned(self) -> Tokenizer | None:
        """The tokenizer splits() (or read_learned) made of the training split, which batches encode with."""
        return None

    def padding_id(self) -> int | None:
        """The id batches pad their sequences with; None: they do not pad."""
        return getattr(self, "pad_id", None)

    def read_for_prediction(self, path: Path) -> Sequence[Any]:
        """The samples in one predict= file, each as the splits hold it; raises for a file it cannot read."""
        raise NotImplementedError(f"{type(self).__name__} must define read_for_prediction() for its prediction_files")

    def prediction_batch(self, samples: list[Any]) -> Any:
        """A batch of predict= samples without targets, as `task.outputs` takes it: here (stacked samples, None)."""
        return torch.stack(samples), None

    def class_names(self) -> list[str]:
        """The class names in label order, which checkpoints keep for predictions; [] when labels are numbers."""
        return []

    def source(self) -> str | None:
        """What decides the data besides its fields and files, for the data fingerprint; None here."""
        return None

    def identity(self, made: Any) -> dict:
        """What this data is before any split (summary.json's `data`): by default every sample of the three splits,
        in no order; an option whose splits do not partition one set of samples returns what it read."""
        return samples_identity(made)

    def batch_transform(self, augmentation: Any, input_size: int | None, channels_last: bool, train: bool) -> nn.Module:
        """What runs on whole batches on the device between the loader and the model; nothing here."""
        return nn.Identity()

    def loaders(self, made: Any, device: torch.device, train: dict, evaluation: dict) -> list[ShardedLoader]:
        """This rank's train, val and test loaders of what splits() made, given the loaders' arguments for training
        and for evaluation: here TensorLoaders of Splits."""
        if not isinstance(made, Splits):
            raise ConfigError(
                "data._target_",
                f"{type(self).__name__}.splits() returned {type(made).__name__}, but the class loads in-memory "
                f"tensors; return trainkit.data.Splits",
            )
        where, pin = _placement(made, device, train["rank"])
        return [
            TensorLoader(*split, device=where, pin_memory=pin, **args)
            for split, args in ((made.train, train), (made.val, evaluation), (made.test, evaluation))
        ]

    def longest_item(self, made: Any) -> int | None:
        """The size of the training split's largest item, in size_unit; None where the data does not say."""
        return made.train[0][0].numel() if len(made.train[0]) else None


@dataclass(kw_only=True)
class ImageData(Data):
    """Images `[N, C, S, S]`, which its batch transform scales, resizes, augments and normalizes on the device."""

    channels: int
    image_size: int
    mirror_changes_label: bool
    mean: Sequence[float]  # of the pixels scaled to [0, 1]
    std: Sequence[float]

    kind: ClassVar[str] = "image"
    decodes_images: ClassVar[bool] = False
    image_entries: ClassVar[tuple[str, ...]] = ()

    @staticmethod
    def config_problems(channels: int, mean: Sequence[float], std: Sequence[float]) -> Iterator[tuple[str, str]]:
        """One statistic per channel, or one for all."""
        for key, values in (("mean", mean), ("std", std)):
            if len(values) not in (1, channels):
                yield (
                    f"data.{key}",
                    f"has {len(values)} values for data.channels={channels}; give one per channel, or one for all",
                )

    def loaders(self, made: Any, device: torch.device, train: dict, evaluation: dict) -> list[ShardedLoader]:
        if isinstance(made, Splits):  # the images' shape is the tensors'
            check_matches(self, "channels", made.train[0].shape[1])
            check_matches(self, "image_size", made.train[0].shape[-1])
        return super().loaders(made, device, train, evaluation)

    def batch_transform(self, augmentation: Any, input_size: int | None, channels_last: bool, train: bool) -> nn.Module:
        from trainkit.augment.batch_transform import BatchTransform

        mean, std = per_channel(self.mean, self.channels), per_channel(self.std, self.channels)
        return BatchTransform(
            mean,
            std,
            input_size or self.image_size,
            augmentation if train else None,
            train=train,
            channels_last=channels_last,
            entries=self.image_entries,
        )


def _placement(splits: Splits, device: torch.device, rank: int) -> tuple[torch.device, bool]:
    """Where in-memory splits live, and whether batches are pinned: on the device when they fit in DEVICE_SHARE of
    its free memory, else on the host."""
    if device.type != "cuda":
        return device, False
    needed = sum(t.numel() * t.element_size() for split in (splits.train, splits.val, splits.test) for t in split)
    free, _ = torch.cuda.mem_get_info(device)
    if needed <= DEVICE_SHARE * free:
        return device, False
    if rank == 0:
        log.warning(
            "the dataset takes %.2f GiB, more than half of the %.2f GiB free on %s: it stays in host memory "
            "and each batch is copied from pinned memory (slower; a smaller data.image_size fits on the device)",
            needed / 2**30,
            free / 2**30,
            device,
        )
    return torch.device("cpu"), True


def check_matches(data: Data, key: str, actual: int) -> None:
    # The data decides these numbers; a config that disagrees would build a mismatched model.
    configured = getattr(data, key)
    if configured is not None and configured != actual:
        raise ConfigError(f"data.{key}", f"is {configured} but {data.name} has {actual}; set data.{key}={actual}")


def per_channel(values: Sequence[float], channels: int) -> tuple[float, ...]:
    """One value per channel, from one value for all or one per channel."""
    numbers = tuple(float(value) for value in values)
    return numbers * channels if len(numbers) == 1 else numbers


def data_class(target: str) -> type[Data]:
    """The Data subclass `data._target_` names, imported but not built; a one-line ConfigError if there is none."""
    module_name, _, attribute = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:  # ValueError: no module part
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(
            "data._target_",
            f"cannot import {target!r} ({reason}); point it at module.Class, e.g. trainkit.data.datasets.Digits",
        ) from error
    if not (isinstance(found, type) and issubclass(found, Data)):
        raise ConfigError(
            "data._target_",
            f"{target} is not a subclass of trainkit.data.Data; a data option names a dataclass derived "
            f"from it (ImageData for images), whose fields are the option's keys (README: Add your own data)",
        )
    return found


def carve(
    num_samples: int, fractions: dict[str, float], seed: int, labels: Sequence[int] | None = None
) -> dict[str, torch.Tensor]:
    """Sorted, disjoint indices for each split in `fractions`, and "train" for the rest, cut from one permutation
    drawn from `seed` (the same on every machine). With `labels` (a class index per sample) each split holds each
    class in its fraction, to within one sample."""
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed))
    if labels is not None:
        classes = torch.as_tensor(labels)
        if classes.is_floating_point() or classes.is_complex():
            raise TypeError(
                f"carve(labels=...) takes a class index per sample, but got "
                f"{str(classes.dtype).removeprefix('torch.')} values: pass labels=None for numbers (a regression "
                f"target), or their quantile bins to stratify them"
            )
        # Rearranged so that every prefix of the order holds each class in proportion.
        ordered = classes.to(torch.int64)[order]
        position = torch.empty(num_samples, dtype=torch.float64)
        for label in ordered.unique():
            members = (ordered == label).nonzero().flatten()
            position[members] = (torch.arange(len(members), dtype=torch.float64) + 0.5) / len(members)
        order = order[torch.sort(position, stable=True).indices]
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


def class_name(label: int, names: Sequence[str] | None) -> str:
    return f"class {names[label]!r}" if names is not None and 0 <= label < len(names) else f"class {label}"


def warn_val_lacking_classes(parts: dict[str, torch.Tensor], labels: Any, names: Any, how: str) -> None:
    """Warns once, naming each class that the train split of `parts` has and its val split lacks."""
    labels = torch.as_tensor(labels)
    if labels.dim() != 1 or labels.is_floating_point() or "val" not in parts:
        return  # not one class per sample
    trained = set(labels[torch.as_tensor(parts["train"])].tolist())
    validated = set(labels[torch.as_tensor(parts["val"])].tolist())
    if lacking := sorted(trained - validated):
        log.warning(
            f"the val split ({how}) holds no sample of {', '.join(class_name(label, names) for label in lacking)}, "
            f"which the training split has: val metrics cover the other classes alone"
        )


@dataclass(kw_only=True)
class Digits(ImageData):
    """scikit-learn's 1,797 8x8 digits, float32 in [0, 1], carved into train/val/test."""

    val_fraction: float
    test_fraction: float
    split_seed: int

    uses_root: ClassVar[bool] = False  # shipped with scikit-learn

    def splits(self) -> Splits:
        pixels, target = read_digits()
        images = torch.from_numpy(pixels).float().div_(16).reshape(-1, 1, 8, 8)  # pixels are 0..16
        labels = torch.from_numpy(target).long()
        parts = carve(len(labels), {"test": self.test_fraction, "val": self.val_fraction}, self.split_seed)
        parts = self.cut_val(parts, self.split_seed, labels)
        train, val, test = ((images[parts[s]], labels[parts[s]]) for s in ("train", "val", "test"))
        return Splits(train, val, test, num_classes=10)


def read_digits() -> tuple[Any, Any]:
    """(pixels [1797, 64], labels [1797]) from the file scikit-learn ships, read without importing scikit-learn
    (1.4 s of every default run), else by its load_digits."""
    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0], "datasets", "data", "digits.csv.gz") if folders else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as sklearn_digits

        digits = sklearn_digits()
        return digits.data, digits.target
    table = np.loadtxt(path, delimiter=",")  # a row: 64 pixels, then the label
    return table[:, :-1], table[:, -1].astype(np.int64)
