"""The offline cache: an image folder decoded once into uint8 arrays, then trained from in memory.

    python scripts/preprocess.py /cache data.root=/images data.image_size=32    # write_cache
    python train.py data=cached data.root=/cache data.image_size=32              # load_cache

Decoding a PNG or JPEG costs far more than the step of a small model; the cache pays it once.
Pixels are decoded by trainkit.data.imagefolder (the same listing, splits, resize and crop as
`data=imagefolder`), so a cached image equals the one the file loader yields. `data=cached` then
takes the device-resident path of the built-in datasets (TensorLoader: one gather a batch, random
augmentation still on the device, every epoch). A cache directory holds:

    meta.json              what it was made from: image size, channels, classes, split keys, sources
    <split>_images.npy     uint8 [N, C, S, S], memory-mapped when loaded (pages read as touched)
    <split>_labels.npy     int64 [N]
    <split>_files.txt      the source file of each row, in order

meta.json is written last: a directory without it (an interrupted run) is not a cache.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from trainkit.data.datasets import Splits
from trainkit.errors import ConfigError

FORMAT = 1  # of meta.json and the arrays; a cache of another format is refused
SPLITS = ("train", "val", "test")
SPLIT_KEYS = ("val_fraction", "test_fraction", "split_seed")  # matter only for splits carved from train/


def write_cache(cfg: DictConfig, out: Path, *, num_workers: int = 0, progress: bool = True) -> dict[str, Any]:
    """Decode the image folder `cfg` (an `imagefolder` data config) into a cache at `out`; return its meta."""
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    from trainkit.data.imagefolder import load_image_folder

    datasets, classes = load_image_folder(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)  # until the arrays are complete, this is not a cache
    root = Path(cfg["root"]).expanduser().resolve()
    channels, size = cfg["channels"], cfg["image_size"]
    counts = {}
    with tqdm(total=sum(len(d) for d in datasets.values()), unit="img", desc="decoding", disable=not progress) as bar:
        for split in SPLITS:
            dataset = datasets[split]
            shape = (len(dataset), channels, size, size)
            images = np.lib.format.open_memmap(out / f"{split}_images.npy", mode="w+", dtype=np.uint8, shape=shape)
            labels = np.empty(len(dataset), dtype=np.int64)
            start = 0
            for batch, batch_labels in DataLoader(dataset, batch_size=256, num_workers=num_workers):
                images[start : start + len(batch)] = batch.numpy()
                labels[start : start + len(batch)] = batch_labels.numpy()
                start += len(batch)
                bar.update(len(batch))
            images.flush()
            del images
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
        **{key: cfg[key] for key in SPLIT_KEYS},
        "source": str(root),
        "counts": counts,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def load_cache(cfg: DictConfig) -> Splits:
    """The `data=cached` factory: the cache at `data.root` as memory-mapped tensors, after checking
    that it was made with this config's image size, channels, classes and splits."""
    root = Path(cfg["root"]).expanduser()
    meta = read_meta(root)
    check_made_with(cfg, meta, root)
    splits = []
    for split in SPLITS:
        # mmap_mode="c": copy-on-write, so torch gets a writable array without reading the file.
        images = torch.from_numpy(np.load(root / f"{split}_images.npy", mmap_mode="c"))
        labels = torch.from_numpy(np.load(root / f"{split}_labels.npy"))
        splits.append((images, labels))
    return Splits(*splits, num_classes=meta["num_classes"])


def read_meta(root: Path) -> dict[str, Any]:
    make = f"make one with: python scripts/preprocess.py {root} data.root=<image folder>"
    if not (root / "meta.json").is_file():
        what = "does not exist" if not root.exists() else "is not a finished cache (no meta.json)"
        raise ConfigError("data.root", f"'{root}' {what}; {make}")
    meta: dict[str, Any] = json.loads((root / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise ConfigError("data.root", f"'{root}' is a cache of format {meta.get('format')}, not {FORMAT}; {make}")
    return meta


def check_made_with(cfg: DictConfig, meta: dict[str, Any], root: Path) -> None:
    """Refuse a cache made with other settings than `cfg`, naming the first key that differs."""
    keys = ["image_size", "channels", "num_classes"] + (list(SPLIT_KEYS) if meta["carved"] else [])
    for key in keys:
        wanted = cfg.get(key)
        if key == "num_classes" and wanted is None:
            continue  # null: as many as the cache has
        if wanted != meta[key]:
            raise ConfigError(
                f"data.{key}",
                f"is {wanted} but the cache '{root}' was made with {meta[key]}; set data.{key}={meta[key]}, "
                f"or remake it: python scripts/preprocess.py {root} data.root={meta['source']} data.{key}={wanted}",
            )
