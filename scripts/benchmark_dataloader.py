"""Which data path feeds training fastest? Samples/s of the file loader and of the offline cache.

For an image folder (train.py's overrides, `data=imagefolder` by default), measure side by side:
- the file loader (`data=imagefolder`: PIL decode in DataLoader workers) for data.num_workers from 0
  to --max-workers, and always at 1x, 1.5x and 2x the CPU cores this process may use (the counts of
  the articles' rule, trainkit.data.file_data), with and without pinned memory (pinned only
  where CUDA is available);
- the offline cache (`data=cached`: the folder decoded once by scripts/preprocess.py, batches
  gathered from tensors on the device), made here first if --cache holds no matching cache.
Each setting draws --warmup batches first (worker start, first allocations and page faults), then
--batches training batches are timed, moved to the training device as train.py moves them. Prints a
Markdown table and a one-line
recommendation (the overrides to use), and writes both with a PNG chart to --out. The recommended
worker count follows the articles' rule: 1x the cores (what `auto` gives one process), unless a count
from 1 to 2x the cores delivered more than 5% more samples/s; never more than 2x, never 0.

    python scripts/benchmark_dataloader.py --make-folder 10000 data.image_size=32     # a synthetic PNG folder
    python scripts/benchmark_dataloader.py data.root=/path/to/images data.image_size=64 --batches 100
"""

import argparse
import math
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/preprocess.py's compose


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("overrides", nargs="*", help="train.py overrides (data.root=..., data.image_size=...)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmark_dataloader", help="results folder")
    parser.add_argument("--make-folder", type=int, metavar="N", help="first write N synthetic PNGs to --folder")
    parser.add_argument("--folder", type=Path, help="the folder --make-folder writes (default: OUT/images)")
    parser.add_argument("--cache", type=Path, help="the offline cache to use or make (default: OUT/cache)")
    parser.add_argument("--batches", type=int, default=50, help="timed batches per setting (after one warm-up)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches first, per setting")
    parser.add_argument("--threads", type=int, help="torch threads of this process (default: torch's own)")
    parser.add_argument(
        "--max-workers", type=int, help="0 to this many workers (default: 2x the cores), and 1x, 1.5x, 2x"
    )
    return parser.parse_args(argv)


def make_png_folder(root: Path, count: int, size: int, classes: int = 10) -> None:
    """`count` PNGs of size x size under root/train/<class>/: a colour per class plus noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    colours = rng.integers(40, 216, (classes, 1, 1, 3))
    for index in range(count):
        label = index % classes
        folder = root / "train" / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(colours[label] + rng.normal(0, 30, (size, size, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{index:06d}.png")


def with_png_folder(folder: Path, count: int, overrides: list[str]) -> list[str]:
    """Write `count` synthetic PNGs of the overrides' data.image_size (default 32) to `folder`; the
    overrides that train on it. A folder already holding that many images of that size is kept."""
    size = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("data.image_size=")), 32)
    stamp, made = folder / ".synthetic", f"{count} {size}"
    if not stamp.exists() or stamp.read_text() != made:
        if stamp.exists():  # made here before with another count or size
            shutil.rmtree(folder / "train")
        print(f"writing {count} PNGs of {size}x{size} to {folder}", flush=True)
        make_png_folder(folder, count, size)
        stamp.write_text(made)
    return [f"data.root={folder}", f"data.image_size={size}", *overrides]


def samples_per_second(loader, device, batches: int, warmup: int) -> float:
    import torch

    loader.set_epoch(0)
    iterator = iter(loader)
    for _ in zip(range(warmup), iterator):  # worker start, first allocations and page faults
        pass
    count, start = 0, time.perf_counter()
    for _, (images, labels) in zip(range(batches), iterator):
        images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        count += len(labels)
    if count == 0:
        raise SystemExit(f"error: --warmup {warmup} leaves none of the {len(loader)} training batches to time")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count / (time.perf_counter() - start)


# A worker count beats the cores' count only by more than this share of samples/s: runs of the
# same setting differ by a few percent, and the articles' start should not lose to noise.
NOISE = 0.05


def worker_counts(max_workers: int, cores: int) -> list[int]:
    """0 to max_workers, and always the articles' 1x, 1.5x and 2x the cores."""
    from trainkit.runtime import MAX_WORKERS_PER_CORE, RAISE

    return sorted({*range(max_workers + 1), cores, math.ceil(RAISE * cores), MAX_WORKERS_PER_CORE * cores})


def recommended_workers(rates: dict[int, float], cores: int) -> int:
    """The articles' rule on measured samples/s by worker count: 1x the cores, unless a count from
    1 to 2x the cores (never more) delivered more than NOISE more; then the fastest of those. Not 0,
    however fast here: this times loading alone, and without workers a training step waits for
    every batch to be decoded."""
    from trainkit.runtime import MAX_WORKERS_PER_CORE

    allowed = {workers: rate for workers, rate in rates.items() if 1 <= workers <= MAX_WORKERS_PER_CORE * cores}
    fastest = max(allowed, key=allowed.__getitem__)
    return cores if allowed[fastest] <= (1 + NOISE) * allowed[cores] else fastest


def measure(cfg, cache: Path, device, batches: int, warmup: int, counts: list[int]) -> list[tuple[str, str, float]]:
    """[(path, setting, samples/s)], the file loader's settings first, the cache last."""
    import torch
    from omegaconf import OmegaConf

    from trainkit.data import build_data, make_data
    from trainkit.data.file_data import FileLoader

    train = make_data(cfg.data).splits().train
    results = []
    for pin in (False, True) if device.type == "cuda" else (False,):
        for workers in counts:
            loader = FileLoader(
                train, cfg.data.batch_size, shuffle=True, train=True, num_workers=workers, pin_memory=pin
            )
            setting = f"data.num_workers={workers}" + (" pinned" if pin else "")
            results.append(("files", setting, samples_per_second(loader, device, batches, warmup)))
            print(f"  {results[-1][1]}: {results[-1][2]:,.0f} samples/s", flush=True)
            del loader
    cached = OmegaConf.load(ROOT / "conf" / "data" / "cached.yaml")
    # The image folder's settings, for the keys data=cached has (not the file loader's own, such as pin_memory).
    cached.merge_with({key: cfg.data[key] for key in cached if key in cfg.data and key != "_target_"})
    cached.merge_with({"name": "cached", "root": str(cache)})
    start = time.perf_counter()
    data = build_data(cached, torch.device(device), seed=0)
    print(f"  data=cached: loaded in {time.perf_counter() - start:.2f} s (once per run, not timed below)")
    # On a CPU, also with one torch thread: on a busy machine a multi-threaded gather waits for a
    # descheduled thread at every batch, and one thread shows the cost of the path itself.
    threads = torch.get_num_threads()
    for count in (threads, 1) if device.type == "cpu" and threads > 1 else (threads,):
        torch.set_num_threads(count)
        setting = f"data=cached on {device.type}" + (
            f", {count} torch thread{'s' * (count > 1)}" if threads > 1 else ""
        )
        results.append(("cached", setting, samples_per_second(data.train, device, batches, warmup)))
        print(f"  {results[-1][1]}: {results[-1][2]:,.0f} samples/s", flush=True)
    torch.set_num_threads(threads)
    return results


def check_warmup(cfg, warmup: int) -> None:
    """Before the cache is made (minutes on a large folder): --warmup must leave batches to time."""
    from trainkit.data import make_data
    from trainkit.data.file_data import FileLoader

    train = make_data(cfg.data).splits().train  # the listing and split only: nothing decoded
    batches = len(FileLoader(train, cfg.data.batch_size, shuffle=True, train=True, num_workers=0))
    if warmup >= batches:
        raise SystemExit(
            f"error: --warmup {warmup} leaves none of the {batches} training batches ({len(train)} images of "
            f"data.batch_size={cfg.data.batch_size}) to time; pass --warmup {max(batches // 2, 0)} or a smaller "
            f"data.batch_size, or a larger folder"
        )


def ensure_cache(cfg, cache: Path) -> None:
    from trainkit.data import make_data
    from trainkit.data.cache import check_made_with, read_meta, write_cache
    from trainkit.errors import ConfigError

    data = make_data(cfg.data)  # the image folder
    try:
        meta = read_meta(cache)
        check_made_with(data, meta, cache)
        if meta["source"] == str(Path(cfg.data.root).expanduser().resolve()):
            return
    except ConfigError:
        pass
    write_cache(data, cache, num_workers=os.cpu_count() or 1)


def report(results: list[tuple[str, str, float]], cfg, cache: Path, out: Path, cores: int) -> str:
    files = [row for row in results if row[0] == "files"]
    best = max(files, key=lambda row: row[2])
    rates: dict[int, float] = {}  # the best of pinned and not, per worker count
    for _, setting, rate in files:  # e.g. `data.num_workers=3 pinned`
        workers = int(setting.split()[0].removeprefix("data.num_workers="))
        rates[workers] = max(rate, rates.get(workers, 0.0))
    cached = max((row for row in results if row[0] == "cached"), key=lambda row: row[2])
    lines = ["| path | setting | samples/s | vs best file loader |", "|---|---|---:|---:|"]
    lines += [f"| {path} | `{setting}` | {rate:,.0f} | {rate / best[2]:.2f}x |" for path, setting, rate in results]
    size = cfg.data.image_size
    if cached[2] > 1.2 * best[2]:
        advice = (
            f"recommendation: data=cached data.root={cache} data.image_size={size} "
            f"({cached[2] / best[2]:.1f}x the best file loader; make it with "
            f"python scripts/preprocess.py {cache} data.root={cfg.data.root} data.image_size={size})"
        )
    else:
        advice = f"recommendation: {workers_advice(rates, cores)} (the cache is not faster here)"
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + f"\n\nfile loader: {workers_advice(rates, cores)}\n\n{advice}"
    (out / "benchmark_dataloader.md").write_text(f"{text}\n")
    plot(results, out / "benchmark_dataloader.png")
    return text


def workers_advice(rates: dict[int, float], cores: int) -> str:
    """`data.num_workers=auto (...)` or `data.num_workers=N (...)`, with what the rule saw."""
    workers = recommended_workers(rates, cores)
    if workers == cores:
        return (
            f"data.num_workers=auto ({cores} workers, 1x the {cores} cores; no count up to 2x the cores "
            f"was more than {NOISE:.0%} faster)"
        )
    gain = rates[workers] / rates[cores]
    return f"data.num_workers={workers} ({workers / cores:g}x the {cores} cores: {gain:.2f}x the samples/s of 1x)"


def plot(results: list[tuple[str, str, float]], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure = draw(results)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def draw(results: list[tuple[str, str, float]]):
    """One bar a setting, on a log axis with its samples/s written at its end: with the cache 50x
    faster, linear bars of the file loader could not be read or compared."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 0.4 * len(results) + 1.5))
    labels = [setting for _, setting, _ in results]
    colours = ["tab:orange" if path == "cached" else "tab:blue" for path, _, _ in results]
    bars = axes.barh(labels, [rate for _, _, rate in results], color=colours)
    axes.set_xscale("log")
    axes.bar_label(bars, labels=[f"{rate:,.0f}" for _, _, rate in results], padding=3, fontsize="small")
    axes.margins(x=0.15)  # room for the label of the longest bar
    axes.invert_yaxis()
    axes.set_xlabel("samples/s, log scale (training batches delivered to the device)")
    axes.set_title("data loading: file loader vs offline cache")
    figure.tight_layout()
    return figure


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch
    from preprocess import compose

    # Workers beyond the CPU count are the point of the sweep: torch's warning about them is not news here.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    from trainkit.errors import ConfigError
    from trainkit.runtime import available_cores, pick_device

    overrides = list(args.overrides)
    if args.make_folder:
        overrides = with_png_folder(args.folder or args.out / "images", args.make_folder, overrides)
    try:
        cfg = compose(overrides)
        check_warmup(cfg, args.warmup)
        cache = args.cache or args.out / "cache"
        ensure_cache(cfg, cache)
        device = pick_device(cfg.device)
        if args.threads:
            torch.set_num_threads(args.threads)
        cores = available_cores()
        counts = worker_counts(args.max_workers if args.max_workers is not None else 2 * cores, cores)
        print(
            f"timing {args.batches} batches of {cfg.data.batch_size} per setting after {args.warmup} on {device}, "
            f"{torch.get_num_threads()} torch threads in this process, {cores} cores",
            flush=True,
        )
        results = measure(cfg, cache, device, args.batches, args.warmup, counts)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(report(results, cfg, cache, args.out, cores))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
