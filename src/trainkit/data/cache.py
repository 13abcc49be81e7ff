"""The offline cache: an image folder decoded once into uint8 arrays, then trained from in memory
(docs/data.md#an-offline-cache-decode-once-train-from-memory). A cache directory holds:

    meta.json              what it was made from; written last, so a directory without it is not a cache
    <split>_images.npy     uint8 [N, C, S, S]
    <split>_labels.npy     int64 [N]
    <split>_files.txt      the source file of each row, in order
"""

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from trainkit.data.datasets import ImageData, Split, Splits, data_class
from trainkit.data.imagefolder import ImageFolder, load_image_folder
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

FORMAT = 1  # a cache of another format is refused
SPLITS = ("train", "val", "test")
SPLIT_KEYS = ("val_fraction", "test_fraction", "split_seed")
HOST_SHARE = 0.5  # of available host memory; a larger split stays memory-mapped


# The swap replaces only a directory that holds these files alone.
CACHE_FILES = (
    "meta.json",
    *(f"{split}_{part}" for split in SPLITS for part in ("images.npy", "labels.npy", "files.txt")),
)


def write_cache(data: ImageFolder, out: Path, *, num_workers: int = 0, progress: bool = True) -> dict[str, Any]:
    """Decode the image folder `data` (`instantiate` of an `imagefolder` data config) into a cache at `out`;
    return its meta. Written beside `out` and swapped in at the end: until then a cache at `out`
    stays whole and usable, and whatever stops the write (Ctrl-C too) removes the partial one."""
    others = sorted(p.name for p in out.iterdir() if p.name not in CACHE_FILES) if out.is_dir() else []
    if others:
        raise ConfigError(
            "cache_dir", f"{out} holds files that are not a cache's ({others[0]}); choose a new directory"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"  # same file system, so the rename is a move
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        meta = _write_arrays(data, partial, num_workers, progress)
        _swap_in(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return meta


def _swap_in(new: Path, out: Path) -> None:
    """Puts the finished cache `new` at `out` by two renames, since one rename cannot replace a directory."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)


def _write_arrays(data: ImageFolder, out: Path, num_workers: int, progress: bool) -> dict[str, Any]:
    from tqdm import tqdm

    from trainkit.data.file_data import FileLoader

    datasets, classes = load_image_folder(data)
    assert data.root is not None, "the config check requires data.root (needs_root)"
    root = Path(data.root).expanduser().resolve()
    channels, size = data.channels, data.image_size
    counts = {}
    with tqdm(total=sum(len(d) for d in datasets.values()), unit="img", desc="decoding", disable=not progress) as bar:
        for split in SPLITS:
            dataset = datasets[split]
            shape = (len(dataset), channels, size, size)
            images = np.lib.format.open_memmap(out / f"{split}_images.npy", mode="w+", dtype=np.uint8, shape=shape)
            labels = np.empty(len(dataset), dtype=np.int64)
            start = 0
            for batch, batch_labels in FileLoader(dataset, 256, shuffle=False, train=False, num_workers=num_workers):
                images[start : start + len(batch)] = batch.numpy()
                labels[start : start + len(batch)] = batch_labels.numpy()
                start += len(batch)
                bar.update(len(batch))
            images.flush()
            del images
            if start != len(dataset):
                raise ConfigError(
                    "data.skip_bad_files",
                    f"{len(dataset) - start} of the {len(dataset)} {split} images could not be read; a cache "
                    f"holds one row per listed file: remove the unreadable files the log names, then rerun",
                )
            np.save(out / f"{split}_labels.npy", labels)
            (out / f"{split}_files.txt").write_text("".join(f"{path}\n" for path, _ in dataset.samples))
            counts[split] = len(dataset)
    meta = {
        "format": FORMAT,
        "image_size": size,
        "channels": channels,
        "classes": classes,
        "num_classes": len(classes),
        "carved": [split for split in ("val", "test") if not (root / split).is_dir()],
        **{key: getattr(data, key) for key in SPLIT_KEYS},
        "source": str(root),
        "counts": counts,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


@dataclass(kw_only=True)
class Cached(ImageData):
    """The `data=cached` option: the cache at `data.root` as tensors, once checked against these settings."""

    val_fraction: float  # as the cache was made
    test_fraction: float
    split_seed: int

    needs_root: ClassVar[str] = "the folder scripts/preprocess.py wrote"
    decodes_images: ClassVar[bool] = True

    def splits(self) -> Splits:
        assert self.root is not None, "the config check requires data.root (needs_root)"
        root = Path(self.root).expanduser()
        meta = read_meta(root)
        check_made_with(self, meta, root)
        train, val, test = (_arrays(root, split) for split in SPLITS)
        if "val" in meta["carved"]:
            train, val = self._cut_val(train, val)
        else:
            made_from = f"the cache '{root}' (made from {meta['source']}/val/)"
            self.own_val(made_from, "remake it from a folder without val/")
        return Splits(train, val, test, num_classes=meta["num_classes"])

    def _cut_val(self, train: Split, val: Split) -> tuple[Split, Split]:
        """The cache's train and val rows as Data.cut_val cuts them (data.folds); without a cut, as they are."""
        labels = torch.cat([train[1], val[1]])
        rows = {"train": torch.arange(len(train[1])), "val": torch.arange(len(train[1]), len(labels))}
        parts = self.cut_val(rows, self.split_seed, labels)
        if parts is rows:
            return train, val
        images = torch.cat([train[0], val[0]])
        return (images[parts["train"]], labels[parts["train"]]), (images[parts["val"]], labels[parts["val"]])


def _arrays(root: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    images = np.load(root / f"{split}_images.npy", mmap_mode="r")
    if images.nbytes < HOST_SHARE * _available_memory():
        images = np.array(images)  # a batch is then a gather, not page faults
    else:
        log.warning("%s of %s (%.1f GiB) is read from the mapped file", split, root, images.nbytes / 2**30)
        images = np.load(root / f"{split}_images.npy", mmap_mode="c")
    return torch.from_numpy(images), torch.from_numpy(np.load(root / f"{split}_labels.npy"))


def _available_memory() -> int:
    """Bytes of host memory available to new allocations (Linux: MemAvailable; else free pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def read_meta(root: Path) -> dict[str, Any]:
    make = f"make one with: python scripts/preprocess.py {root} data.root=<image folder>"
    if not (root / "meta.json").is_file():
        what = "does not exist" if not root.exists() else "is not a finished cache (no meta.json)"
        raise ConfigError("data.root", f"'{root}' {what}; {make}")
    meta: dict[str, Any] = json.loads((root / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise ConfigError("data.root", f"'{root}' is a cache of format {meta.get('format')}, not {FORMAT}; {make}")
    return meta


def check_made_with(data: Cached | ImageFolder, meta: dict[str, Any], root: Path) -> None:
    """Refuses a cache made with other settings than `data`'s, naming the first key that differs."""
    keys = ["image_size", "channels", "num_classes"] + (list(SPLIT_KEYS) if meta["carved"] else [])
    for key in keys:
        wanted = getattr(data, key)
        if key == "num_classes" and wanted is None:
            continue  # null: as many as the cache has
        if wanted != meta[key]:
            raise ConfigError(
                f"data.{key}",
                f"is {wanted} but the cache '{root}' was made with {meta[key]}; set data.{key}={meta[key]}, "
                f"or remake it: {remake_command(data, meta, root, keys)}",
            )


def remake_command(data: Cached | ImageFolder, meta: dict[str, Any], root: Path, keys: list[str]) -> str:
    """The preprocess.py command that remakes this cache with `data`'s values for every setting it records."""
    settings = [f"data.{key}={getattr(data, key)}" for key in keys if getattr(data, key) is not None]
    if data.channels != meta["channels"]:
        settings += [f"'data.{key}=[{','.join(f'{v:g}' for v in getattr(data, key))}]'" for key in ("mean", "std")]
    return f"python scripts/preprocess.py {root} data.root={meta['source']} {' '.join(settings)}"


def cache_advice(data: Any, in_memory: bool) -> list[str]:
    """What a cache offers a run that waits for its data (trainkit.tracking.bottleneck's warning): images decoded
    from files (`in_memory` False), a cache made once; a cache (held in memory, from image files) too large for
    the device, one made smaller. Nothing for other data."""
    if not getattr(data_class(data._target_), "decodes_images", False):
        return []
    if in_memory:
        return [
            "a cache too large for the device streams from its memory-mapped file: rebuild it with "
            "scripts/preprocess.py at a smaller data.image_size so it fits on the device"
        ]
    return [
        f"decode once, offline: scripts/preprocess.py turns {data.root} into a uint8 cache at data.image_size, "
        "and data=cached trains from it on the device with no per-image decoding"
    ]
