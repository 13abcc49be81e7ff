"""The data stage of a run: the dataset `data._target_` makes, split, sharded across ranks, loaded.

    data = build_data(cfg.data, device, seed=cfg.seed, rank=rank, world_size=world_size)
    data.train.set_epoch(epoch)            # before every epoch, as with DistributedSampler
    for images, labels in data.train: ...  # uint8 0..255 or float32 in [0, 1], [B, C, H, W]

A data option (conf/data/<name>.yaml) names its factory in `_target_`, like a model option: a
function called with the whole `data` config (see trainkit.data.datasets). A factory that returns
`Splits` of tensors (digits, synthetic, mnist, cifar10, cached) has them live on the device and
batch by indexing; one that returns `FileSplits` of datasets (imagefolder) streams them through
DataLoader workers, and its batches arrive on the CPU. The factory is imported only when called,
so an option's heavy imports (torchvision) cost nothing to `--help` or a config error.
"""

import importlib
import logging
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from trainkit.data.datasets import FileSplits, Splits
from trainkit.data.loader_settings import file_loader_settings
from trainkit.data.loaders import FileLoader, TensorLoader
from trainkit.errors import ConfigError

__all__ = ["DataBundle", "FileLoader", "FileSplits", "Splits", "TensorLoader", "build_data", "make_dataset"]

log = logging.getLogger(__name__)
# Free device memory a dataset may fill; the rest is for the model, activations and the optimizer.
DEVICE_SHARE = 0.5


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
    trainkit.config.validation; what only the data can tell (files, sizes, class counts) is checked here."""
    name = cfg.get("name", cfg["_target_"])
    shards = dict(seed=seed, rank=rank, world_size=world_size)
    train_args = dict(
        batch_size=cfg["batch_size"], train=True, shuffle=cfg.get("shuffle", True), drop_last=cfg["drop_last"], **shards
    )
    eval_args = dict(batch_size=cfg["eval_batch_size"], shuffle=False, **shards)
    train: TensorLoader | FileLoader
    val: TensorLoader | FileLoader
    test: TensorLoader | FileLoader

    made = make_dataset(cfg)
    if isinstance(made, FileSplits):
        channels, image_size = cfg["channels"], cfg["image_size"]
        files = file_loader_settings(cfg, device)  # data.num_workers / pin_memory `auto` resolved here
        train = FileLoader(made.train, **train_args, **files)
        val, test = (FileLoader(split, **eval_args, **files) for split in (made.val, made.test))
    else:
        channels, image_size = made.train[0].shape[1], made.train[0].shape[-1]
        _check_matches(cfg, "channels", channels, name)
        _check_matches(cfg, "image_size", image_size, name)
        where, pin = _placement(made, device, rank)
        train = TensorLoader(*made.train, device=where, pin_memory=pin, **train_args)
        val = TensorLoader(*made.val, device=where, pin_memory=pin, **eval_args)
        test = TensorLoader(*made.test, device=where, pin_memory=pin, **eval_args)
    num_classes = made.num_classes
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


def make_dataset(cfg: DictConfig) -> Splits | FileSplits:
    """Call the factory `cfg._target_` names with the data config; check what it returns."""
    target = cfg["_target_"]
    factory = locate(target)
    made = factory(cfg)
    if not isinstance(made, (Splits, FileSplits)):
        raise ConfigError(
            "data._target_",
            f"{target} returned {type(made).__name__}; a data factory returns trainkit.data.Splits "
            f"(tensors, kept on the device) or trainkit.data.FileSplits (datasets decoded in workers)",
        )
    return made


def locate(target: str) -> Any:
    """The object a dotted path names, importing its module (the factory's imports happen here)."""
    module_name, _, attribute = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attribute) if module_name else None
    except (ImportError, AttributeError) as error:
        found, reason = None, f" ({error})"
    else:
        reason = ""
    if not callable(found):
        raise ConfigError(
            "data._target_",
            f"cannot find a function {target!r}{reason}; point it at module.function, e.g. "
            f"trainkit.data.datasets.load_digits",
        )
    return found


def _placement(splits: Splits, device: torch.device, rank: int) -> tuple[torch.device, bool]:
    """Where in-memory splits live, and whether batches are pinned: on the device when they fit in
    DEVICE_SHARE of its free memory; otherwise on the host, each batch gathered whole into pinned
    memory for an asynchronous copy."""
    if device.type != "cuda":
        return device, False  # host memory; a memory-mapped cache is paged in as batches touch it
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


def _check_matches(cfg: DictConfig, key: str, actual: int, name: str) -> None:
    # The data decides these numbers; a config that disagrees would build a mismatched model.
    configured = cfg.get(key)
    if configured is not None and configured != actual:
        raise ConfigError(f"data.{key}", f"is {configured} but {name} has {actual}; set data.{key}={actual}")


def _per_channel(cfg: DictConfig, key: str, channels: int) -> tuple[float, ...]:
    # One value for all, or one per channel: trainkit.config.validation held the length to data.channels,
    # and _check_matches held data.channels to the data.
    values = [float(value) for value in cfg[key]]
    return tuple(values * channels) if len(values) == 1 else tuple(values)
