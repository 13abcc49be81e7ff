"""The data stage of a run: the dataset named by `data.name`, split, sharded across ranks, loaded.

    data = build_data(cfg.data, device, seed=cfg.seed, rank=rank, world_size=world_size)
    data.train.set_epoch(epoch)            # before every epoch, as with DistributedSampler
    for images, labels in data.train: ...  # uint8 0..255 or float32 in [0, 1], [B, C, H, W]

In-memory datasets (digits, synthetic, mnist, cifar10) live on the device and batch by
indexing; image folders stream through DataLoader workers and arrive on the CPU.
"""

from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from trainkit.data.datasets import load_cifar10, load_digits, load_mnist, make_synthetic
from trainkit.data.imagefolder import load_image_folder
from trainkit.data.loader_settings import file_loader_settings
from trainkit.data.loaders import FileLoader, TensorLoader
from trainkit.errors import ConfigError

__all__ = ["DataBundle", "FileLoader", "TensorLoader", "build_data"]

IN_MEMORY = {"digits": load_digits, "mnist": load_mnist, "cifar10": load_cifar10, "synthetic": make_synthetic}
DATASETS = (*IN_MEMORY, "imagefolder")


@dataclass
class DataBundle:
    train: TensorLoader | FileLoader
    val: TensorLoader | FileLoader
    test: TensorLoader | FileLoader
    channels: int
    image_size: int
    num_classes: int
    mean: tuple[float, ...]  # one value per channel, for normalizing images scaled to [0, 1]
    std: tuple[float, ...]


def build_data(cfg: DictConfig, device: torch.device, seed: int, rank: int = 0, world_size: int = 1) -> DataBundle:
    """Loaders for train/val/test of this rank. `seed` must be the same on every rank (the run
    seed, not seed + rank): it fixes the train shuffle that all ranks share. `cfg` was checked by
    trainkit.config; what only the data can tell (files, sizes, class counts) is checked here."""
    name = cfg["name"]
    shards = dict(seed=seed, rank=rank, world_size=world_size)
    train_args = dict(
        batch_size=cfg["batch_size"], train=True, shuffle=cfg.get("shuffle", True), drop_last=cfg["drop_last"], **shards
    )
    eval_args = dict(batch_size=cfg["eval_batch_size"], shuffle=False, **shards)
    train: TensorLoader | FileLoader
    val: TensorLoader | FileLoader
    test: TensorLoader | FileLoader

    if name == "imagefolder":
        datasets, classes = load_image_folder(cfg)
        channels, image_size, num_classes = cfg["channels"], cfg["image_size"], len(classes)
        files = file_loader_settings(cfg, device)  # data.num_workers / pin_memory `auto` resolved here
        train = FileLoader(datasets["train"], **train_args, **files)
        val, test = (FileLoader(datasets[split], **eval_args, **files) for split in ("val", "test"))
    else:
        splits = IN_MEMORY[name](cfg)
        channels, image_size = splits.train[0].shape[1], splits.train[0].shape[-1]
        num_classes = splits.num_classes
        _check_matches(cfg, "channels", channels, name)
        _check_matches(cfg, "image_size", image_size, name)
        train = TensorLoader(*splits.train, device=device, **train_args)
        val = TensorLoader(*splits.val, device=device, **eval_args)
        test = TensorLoader(*splits.test, device=device, **eval_args)
    _check_matches(cfg, "num_classes", num_classes, name)

    if len(train) == 0:
        raise ConfigError(
            "data.batch_size",
            f"{cfg['batch_size']} per process x {world_size} processes with data.drop_last=true leaves no "
            f"training batch from {train.sampler.size} samples; lower data.batch_size",
        )
    return DataBundle(
        train,
        val,
        test,
        channels,
        image_size,
        num_classes,
        mean=_per_channel(cfg, "mean", channels),
        std=_per_channel(cfg, "std", channels),
    )


def _check_matches(cfg: DictConfig, key: str, actual: int, name: str) -> None:
    # The data decides these numbers; a config that disagrees would build a mismatched model.
    configured = cfg.get(key)
    if configured is not None and configured != actual:
        raise ConfigError(f"data.{key}", f"is {configured} but {name} has {actual}; set data.{key}={actual}")


def _per_channel(cfg: DictConfig, key: str, channels: int) -> tuple[float, ...]:
    # One value for all, or one per channel: trainkit.config held the length to data.channels,
    # and _check_matches held data.channels to the data.
    values = [float(value) for value in cfg[key]]
    return tuple(values * channels) if len(values) == 1 else tuple(values)
