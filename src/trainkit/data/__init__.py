"""The data stage of a run: the dataset `data._target_` makes, split, sharded across ranks and loaded.

    data = build_data(cfg.data, device, seed=cfg.seed, rank=rank, world_size=world_size)
    data.train.set_epoch(epoch)
    for inputs, targets in data.train: ...

In-memory splits live on the device and batch by indexing; file splits stream through DataLoader workers and
arrive on the CPU (docs/data.md#a-data-options-class).
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainkit.data.datasets import Data, FileSplits, ImageData, Splits, Tokenizer, data_class, per_channel
from trainkit.data.fingerprint import check_same_data, data_fingerprint
from trainkit.data.identity import data_identity
from trainkit.data.loader_settings import file_loader_settings
from trainkit.data.loaders import FileLoader, TensorLoader
from trainkit.errors import ConfigError

__all__ = [
    "Data",
    "DataBundle",
    "FileLoader",
    "FileSplits",
    "ImageData",
    "Splits",
    "TensorLoader",
    "build_data",
    "check_same_data",
    "make_data",
]

log = logging.getLogger(__name__)
# Free device memory a dataset may fill; the rest is for the model, activations and the optimizer.
DEVICE_SHARE = 0.5


@dataclass
class DataBundle:
    train: TensorLoader | FileLoader
    val: TensorLoader | FileLoader
    test: TensorLoader | FileLoader
    num_classes: int
    kind: str = "image"
    pad_id: int | None = None  # None: no padding
    tokenizer: Tokenizer | None = None
    vocabulary: int | None = None
    size_unit: str | None = None
    longest: int | None = None  # the largest training item, in size_unit
    channels: int | None = None
    image_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    fingerprint: dict = field(default_factory=dict)
    class_names: list[str] = field(default_factory=list)
    option: Data | None = None

    def transforms(
        self, augmentation: Any, input_size: int | None, channels_last: bool, device: torch.device
    ) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The data option's batch transforms, for training (augmenting) and for evaluation, on `device`."""
        if self.option is None:  # a bundle made by hand, in tests
            return torch.nn.Identity(), torch.nn.Identity()
        return (
            self.option.batch_transform(augmentation, input_size, channels_last, train=True).to(device),
            self.option.batch_transform(augmentation, input_size, channels_last, train=False).to(device),
        )


def build_data(
    cfg: Mapping,
    device: torch.device,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    resumed_from: str | None = None,
    run_dir: Path | None = None,
    trains_tokenizer: bool = True,
) -> DataBundle:
    """This rank's train/val/test loaders for cfg.data, checking what only the data can tell (files, sizes, class
    counts). `seed` must be the run seed, the same on every rank, since all ranks share the train shuffle.
    `run_dir`, `trains_tokenizer`: where the option saves what it learns of the training split, and whether it
    learns it (Data.learns_in)."""
    data = make_data(cfg)
    data.learns_in(run_dir, trains_tokenizer)
    shards = dict(seed=seed, rank=rank, world_size=world_size)
    train_args: dict[str, Any] = dict(
        batch_size=data.batch_size, train=True, shuffle=data.shuffle, drop_last=data.drop_last, **shards
    )
    eval_args: dict[str, Any] = dict(batch_size=data.eval_batch_size, shuffle=False, **shards)
    train: TensorLoader | FileLoader
    val: TensorLoader | FileLoader
    test: TensorLoader | FileLoader

    made = make_splits(data)
    tokens = data.learned()
    images = isinstance(data, ImageData)
    channels: int | None
    image_size: int | None
    if isinstance(made, FileSplits):
        channels, image_size = (data.channels, data.image_size) if isinstance(data, ImageData) else (None, None)
        files = file_loader_settings(data, device)
        files["collate"] = data.collate

        def batches(split: Any, train: bool) -> Any:
            return data.batch_sampler(split, train=train, **shards)

        train = FileLoader(made.train, **train_args, **files, batch_sampler=batches(made.train, True))
        val, test = (
            FileLoader(d, **eval_args, **files, batch_sampler=batches(d, False)) for d in [made.val, made.test]
        )
    else:
        channels, image_size = None, None
        if images:
            channels, image_size = made.train[0].shape[1], made.train[0].shape[-1]
            _check_matches(data, "channels", channels)
            _check_matches(data, "image_size", image_size)
        where, pin = _placement(made, device, rank)
        train = TensorLoader(*made.train, device=where, pin_memory=pin, **train_args)
        val = TensorLoader(*made.val, device=where, pin_memory=pin, **eval_args)
        test = TensorLoader(*made.test, device=where, pin_memory=pin, **eval_args)
    num_classes = made.num_classes
    if resumed_from and data.num_classes not in (None, num_classes):  # `set data.num_classes` cannot help a resume
        raise ConfigError(
            "data.root",
            f"has {num_classes} classes now, the checkpoint's run trained on {data.num_classes} (a class folder was "
            f"added or removed): resume with the folder as it was, or start a new run on the folder as it is",
        )
    _check_matches(data, "num_classes", num_classes)

    if len(train) == 0 and train.sampler.size < world_size:
        raise ConfigError(
            "distributed.nproc_per_node",
            f"{train.sampler.size} training samples for {world_size} processes leave some without a sample (every "
            f"process trains as many); train with fewer processes, or on more data",
        )
    if len(train) == 0:
        raise ConfigError(
            "data.batch_size",
            f"{data.batch_size} per process x {world_size} processes with data.drop_last=true leaves no "
            f"training batch from {train.sampler.size} samples; lower data.batch_size",
        )
    from trainkit.data.folds import fold_name  # feature: folds

    return DataBundle(
        train,
        val,
        test,
        num_classes,
        kind=data.kind,
        pad_id=data.padding_id(),
        tokenizer=tokens,
        vocabulary=tokens.vocabulary if tokens else None,
        size_unit=data.size_unit,
        longest=_longest_item(data, made) if data.size_unit else None,
        channels=channels,
        image_size=image_size,
        mean=per_channel(data.mean, data.channels) if isinstance(data, ImageData) else None,
        std=per_channel(data.std, data.channels) if isinstance(data, ImageData) else None,
        fingerprint=data_fingerprint(
            made,
            data.source(),
            fold=fold_name(data),  # feature: folds
            tokenizer=tokens.fingerprint() if tokens else None,
            identity=data_identity(data, made),
        ),
        class_names=data.class_names(),
        option=data,
    )


def _longest_item(data: Data, made: Splits | FileSplits) -> int | None:
    """The size of the training split's largest item, in size_unit; None where the data does not say."""
    if isinstance(made, Splits):
        return made.train[0][0].numel() if len(made.train[0]) else None
    sizes = data.item_sizes(made.train)
    return int(max(sizes)) if sizes is not None and len(sizes) else None


def make_data(cfg: Mapping) -> Data:
    """`hydra.utils.instantiate(cfg)`, after a one-line error for a `_target_` that names no Data subclass."""
    import hydra.utils

    data_class(cfg["_target_"])
    data: Data = hydra.utils.instantiate(cfg)
    return data


def make_splits(data: Data) -> Splits | FileSplits:
    """`data.splits()`, checked: Splits or FileSplits, as the class's `in_memory` says."""
    made = data.splits()
    expected = Splits if data.in_memory else FileSplits
    if not isinstance(made, expected):
        raise ConfigError(
            "data._target_",
            f"{type(data).__name__}.splits() returned {type(made).__name__}, but the class says in_memory="
            f"{data.in_memory}; return trainkit.data.{expected.__name__} or set in_memory={not data.in_memory}",
        )
    return made


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


def _check_matches(data: Data, key: str, actual: int) -> None:
    # The data decides these numbers; a config that disagrees would build a mismatched model.
    configured = getattr(data, key)
    if configured is not None and configured != actual:
        raise ConfigError(f"data.{key}", f"is {configured} but {data.name} has {actual}; set data.{key}={actual}")
