"""The data stage of a run: the dataset `data._target_` makes, split, sharded across ranks and loaded by its class's
`loaders` (docs/data.md#a-data-options-class). `build_data(cfg.data, device, seed, rank, world_size)` gives a
DataBundle: `for inputs, targets in bundle.train` after `bundle.train.set_epoch(epoch)`."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainkit.data.datasets import Data, ImageData, Splits, Tokenizer, check_matches, data_class, per_channel
from trainkit.data.fingerprint import check_same_data, data_fingerprint, data_identity
from trainkit.data.loaders import ShardedLoader, TensorLoader
from trainkit.errors import ConfigError

__all__ = ["Data", "DataBundle", "ImageData", "Splits", "TensorLoader", "build_data", "check_same_data", "make_data"]


@dataclass
class DataBundle:
    train: ShardedLoader
    val: ShardedLoader
    test: ShardedLoader
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
    """This rank's loaders for cfg.data, checking what only the data can tell (class counts, sizes). `seed`: the run
    seed, the same on every rank, which share the train shuffle; `run_dir`, `trains_tokenizer`: Data.learns_in's."""
    data = make_data(cfg)
    data.learns_in(run_dir, trains_tokenizer)
    shards = dict(seed=seed, rank=rank, world_size=world_size)
    train_args: dict[str, Any] = dict(
        batch_size=data.batch_size, train=True, shuffle=data.shuffle, drop_last=data.drop_last, **shards
    )
    eval_args: dict[str, Any] = dict(batch_size=data.eval_batch_size, shuffle=False, **shards)
    made = data.splits()
    train, val, test = data.loaders(made, device, train_args, eval_args)
    tokens = data.learned()
    image = data if isinstance(data, ImageData) else None
    num_classes = made.num_classes
    if resumed_from and data.num_classes not in (None, num_classes):  # `set data.num_classes` cannot help a resume
        raise ConfigError(
            "data.root",
            f"has {num_classes} classes now, the checkpoint's run trained on {data.num_classes} (a class folder was "
            f"added or removed): resume with the folder as it was, or start a new run on the folder as it is",
        )
    check_matches(data, "num_classes", num_classes)

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
        longest=data.longest_item(made) if data.size_unit else None,
        channels=image.channels if image else None,
        image_size=image.image_size if image else None,
        mean=per_channel(image.mean, image.channels) if image else None,
        std=per_channel(image.std, image.channels) if image else None,
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


def make_data(cfg: Mapping) -> Data:
    """`hydra.utils.instantiate(cfg)`, after a one-line error for a `_target_` that names no Data subclass."""
    import hydra.utils

    data_class(cfg["_target_"])
    return hydra.utils.instantiate(cfg)
