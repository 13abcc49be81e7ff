"""Decode an image folder once into an offline cache that `data=cached` trains from.

    python scripts/preprocess.py /path/to/cache data.root=/path/to/images data.image_size=32
    python train.py data=cached data.root=/path/to/cache data.image_size=32

The overrides are train.py's: the folder is listed, split and decoded exactly as `data=imagefolder`
does with the same `data.*` keys (image size, channels, split fractions and seed), so a cached
image equals the one the file loader would yield. The cache records those settings, and training
from it with other settings is refused with the key that differs. See src/trainkit/data/cache.py
for the layout.
"""

import argparse
import os
import sys
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python scripts/preprocess.py /data/cache32 data.root=/data/images data.image_size=32",
    )
    parser.add_argument(
        "cache_dir", type=Path, help="where to write the cache (created, or replaced once the new one is complete)"
    )
    parser.add_argument(
        "overrides", nargs="*", help="train.py overrides (data.root=... is required; data=imagefolder by default)"
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="decoding processes (default: the CPU count)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def compose(overrides: list[str]):  # -> DictConfig; Hydra is imported here, after --help
    from hydra import compose, initialize_config_dir

    from trainkit.config.validation import problems
    from trainkit.data.datasets import data_class
    from trainkit.data.imagefolder import ImageFolder
    from trainkit.errors import ConfigError

    if not any(override.startswith("data=") for override in overrides):
        overrides = ["data=imagefolder", *overrides]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=overrides)
    found = problems(cfg)
    if found:
        key, message = next(iter(found.items()))
        raise ConfigError(key, message)
    if not issubclass(data_class(cfg.data._target_), ImageFolder):
        raise ConfigError("data", f"is {cfg.data.name}; preprocess.py caches an image folder: use data=imagefolder")
    if cfg.data.get("folds") is not None:  # a cache holds the carve; the folds are cut from it when training
        raise ConfigError(
            "data.folds",
            f"is {cfg.data.folds}, but a cache holds the splits as carved; cache without it, then train with "
            f"data=cached data.folds={cfg.data.folds} data.fold=...",
        )
    return cfg


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from hydra.utils import instantiate

    from trainkit.data.cache import write_cache
    from trainkit.errors import ConfigError

    try:
        cfg = compose(args.overrides)
        data = instantiate(cfg.data)  # an ImageFolder: compose() refused any other data
        meta = write_cache(data, args.cache_dir, num_workers=args.workers, progress=not args.no_progress)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # write_cache removed the partial cache; one that was there is untouched
        kept = "the cache there is as it was" if (args.cache_dir / "meta.json").is_file() else "no cache was written"
        print(f"interrupted: {args.cache_dir}: {kept}", file=sys.stderr)
        return 130  # what a shell reports for a process ended by Ctrl-C
    counts = ", ".join(f"{split} {count}" for split, count in meta["counts"].items())
    print(
        f"cached {counts} images of {meta['channels']}x{meta['image_size']}x{meta['image_size']}, "
        f"{meta['num_classes']} classes, in {args.cache_dir}\n"
        f"train with: python train.py data=cached data.root={args.cache_dir} data.image_size={meta['image_size']}"
        + (f" data.channels={meta['channels']}" if meta["channels"] != 3 else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
