"""The optimization ladder: one training workload under settings that each add one speed-up.

Each row is a real `python train.py` run with the previous row's overrides plus one change:

  baseline       file loader (data=imagefolder), data.num_workers=0, data.pin_memory=false, precision=fp32
  workers        + data.num_workers=auto, data.pin_memory=auto (pinned only when training on CUDA)
  cached         + the offline cache (data=cached, made by scripts/preprocess.py): decoded once, on the device
  amp            + mixed precision: precision=bf16 (fp16 with GradScaler on a GPU without bf16)
  channels_last  + trainer.channels_last=true
  compile        + trainer.compile=true (the compiling step is left out of the timing by train.py)
  ddp            + distributed=ddp on all local GPUs (skipped without 2 or more CUDA devices)

Every run trains 2 epochs of --steps steps (trainer.limit_train_batches) and the second one is
measured (the first is warm-up: loader start, allocator, cuDNN autotuning, compilation), read from
the run's metrics.jsonl: samples/s, ms per step, the share of the step spent waiting for data,
peak memory (CUDA: train/peak_memory_gb; CPU: the largest process's max RSS, Python and torch
included), and the speed-up over the first row measured. Rows this machine cannot run are listed
as skipped with the reason. Writes benchmark.md and benchmark.png to --out (each run's directory
and log under --out/runs/) and prints the table.

The workload is train.py's overrides; the data is an image folder (data.root=...) or, without one,
--images synthetic PNGs written once to --out/images (scripts/benchmark_dataloader.py's). With no
overrides at all: a small CNN, batch 64, on 32x32 images, sized for a 2-core CPU.

    python scripts/benchmark.py                                    # the small CPU workload, all rows
    python scripts/benchmark.py --rows baseline,workers,cached --steps 10
    python scripts/benchmark.py --images 40000 --steps 50 model=speedrun data.batch_size=512   # a GPU
    python scripts/benchmark.py data.root=/path/to/images data.image_size=64 model=timm model.name=resnet18
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers of benchmark_dataloader.py, preprocess.py

SMALL_CPU_WORKLOAD = ["model=cnn", "model.widths=[8,16,32]", "data.batch_size=64"]
ROWS = ["baseline", "workers", "cached", "amp", "channels_last", "compile", "ddp"]


@dataclass
class Row:
    name: str
    change: str
    overrides: list[str]  # added to the previous row's
    drop: tuple[str, ...] = ()  # keys of the previous rows' overrides that no longer apply
    skip: str | None = None  # why this machine cannot run it
    result: dict = field(default_factory=dict)  # the measured epoch, or {"failed": ...}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("overrides", nargs="*", help="train.py overrides: the workload (model=..., data.root=...)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmark", help="default: outputs/benchmark")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated (default: all)")
    parser.add_argument("--steps", type=int, default=50, help="training steps per epoch (default 50); epoch 2 is timed")
    parser.add_argument("--images", type=int, default=5000, help="synthetic PNGs made without data.root (default 5000)")
    args = parser.parse_args(argv)
    args.out, args.rows = args.out.resolve(), args.rows.split(",")
    unknown = [name for name in args.rows if name not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    return args


def ladder(folder: str, cache: Path, device_type: str, gpus: int, bf16: bool) -> list[Row]:
    precision = "bf16" if bf16 else "fp16"
    amp = "bf16 autocast" if bf16 else "fp16 autocast + GradScaler (this GPU has no bf16)"
    pinned = "pinned memory" if device_type == "cuda" else f"pinned memory (auto: off on {device_type})"
    ddp_skip = None
    if device_type != "cuda":
        ddp_skip = f"on {device_type}: DDP over all local GPUs needs CUDA (scripts/benchmark_ddp.py times CPU ranks)"
    elif gpus < 2:
        ddp_skip = "1 CUDA device: DDP needs 2 or more"
    baseline = [
        "data=imagefolder",
        f"data.root={folder}",
        "data.num_workers=0",
        "data.pin_memory=false",
        "precision=fp32",
    ]
    return [
        Row("baseline", "file loader, 0 workers, no pinned memory, fp32", baseline),
        Row("workers", f"+ loader workers, {pinned}", ["data.num_workers=auto", "data.pin_memory=auto"]),
        Row(
            "cached",
            "+ offline cache, on the device (data=cached)",
            ["data=cached", f"data.root={cache}"],
            drop=("data.num_workers", "data.pin_memory"),  # in memory: no loader workers
        ),
        Row("amp", f"+ {amp}", [f"precision={precision}"]),
        Row("channels_last", "+ channels_last", ["trainer.channels_last=true"]),
        Row("compile", "+ torch.compile", ["trainer.compile=true"]),
        Row(
            "ddp",
            f"+ DDP on {gpus} GPUs" if gpus > 1 else "+ DDP on all local GPUs",
            ["distributed=ddp", f"distributed.nproc_per_node={gpus}"],
            skip=ddp_skip,
        ),
    ]


def keyed(overrides: list[str]) -> dict[str, str]:
    """{key: override}: a later override of the same key replaces the earlier one."""
    return {override.split("=", 1)[0]: override for override in overrides}


def row_overrides(workload: list[str], rows: list[Row]) -> dict[str, list[str]]:
    """Each row's overrides for train.py: the workload's, then the changes of every row up to it."""
    current, result = keyed(workload), {}
    for row in rows:
        current = {key: override for key, override in current.items() if key not in row.drop} | keyed(row.overrides)
        result[row.name] = list(current.values())
    return result


def run_row(overrides: list[str], run_dir: Path, steps: int) -> dict:
    """Train 2 epochs of `steps` steps; the second epoch's metrics, with the peak memory."""
    fixed = [
        f"hydra.run.dir={run_dir}",
        "trainer.max_epochs=2",
        f"trainer.limit_train_batches={steps}",
        "trainer.limit_val_batches=1",
        "regularization.early_stopping.enabled=false",
        "trainer.progress_bar=false",
        "print_config=false",
    ]
    command = [sys.executable, "train.py", *fixed, *overrides]
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier ladder's run: its metrics.jsonl would be appended to
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)  # this run's own rusage: max RSS of its largest process
    process.returncode = os.waitstatus_to_exitcode(status)
    lines = log.read_text().strip().splitlines() or [""]
    if process.returncode != 0:
        reason = next((line for line in reversed(lines) if line.startswith("error:")), lines[-1])
        return {"failed": f"exit {process.returncode}: {reason[:120]} (log: {log})"}
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [metrics for metrics in epochs if "train/samples_per_sec" in metrics]
    if len(epochs) < 2:
        return {"failed": f"{len(epochs)} epoch trained, not 2: {lines[-1][:120]} (log: {log})"}
    first, epoch = epochs[-2:]
    epoch["steps"] = epoch["step"] - first["step"]
    if "train/peak_memory_gb" in epoch:
        epoch["peak memory"] = f"{epoch['train/peak_memory_gb']:.2f} GiB (GPU)"
    else:
        epoch["peak memory"] = f"{usage.ru_maxrss / 2**20:.2f} GiB (RSS)"  # ru_maxrss is in KiB on Linux
    return epoch


def table(rows: list[Row]) -> str:
    measured = [row for row in rows if "train/samples_per_sec" in row.result]
    reference = measured[0] if measured else None
    speedup = f"speed-up vs {reference.name}" if reference else "speed-up"
    lines = [
        f"| row | change | samples/s | step (ms) | data wait | peak memory | {speedup} |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        metrics = row.result
        if reference and "train/samples_per_sec" in metrics:
            rate = metrics["train/samples_per_sec"]
            cells = [
                f"{rate:,.0f}",
                f"{metrics['train/step_ms']:.1f}",
                f"{metrics['train/data_wait_fraction']:.0%}",
                metrics["peak memory"],
                f"{rate / reference.result['train/samples_per_sec']:.2f}x",
            ]
        else:
            cells = [f"skipped: {row.skip}" if row.skip else f"failed: {metrics['failed']}", "", "", "", ""]
        lines.append(f"| {row.name} | {row.change} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.6))
    rates = [row.result.get("train/samples_per_sec", 0.0) for row in rows]
    bars = axes.barh([row.name for row in rows], rates, color="tab:blue")
    reference = next((rate for rate in rates if rate), 1.0)
    for row, bar, rate in zip(rows, bars, rates):
        label = f" {rate / reference:.2f}x" if rate else " skipped" if row.skip else " failed"
        axes.text(rate, bar.get_y() + bar.get_height() / 2, label, va="center")
    axes.invert_yaxis()
    axes.set_xlim(0, 1.12 * max(rates, default=0.0) or 1.0)  # room for the labels
    axes.set_xlabel("training samples/s (epoch 2)")
    axes.set_title(textwrap.fill(title, 110), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch
    from benchmark_dataloader import ensure_cache, with_png_folder
    from preprocess import compose

    from trainkit.errors import ConfigError
    from trainkit.runtime import pick_device

    workload = list(args.overrides) or SMALL_CPU_WORKLOAD
    other_data = [override for override in workload if override.startswith("data=") and override != "data=imagefolder"]
    if other_data:
        print(
            f"error: data: {other_data[0]}, but the ladder trains an image folder (its file loader, then its cache): "
            "give data.root=/path/to/images, or no data.root for synthetic PNGs",
            file=sys.stderr,
        )
        return 1
    if not any(override.startswith("data.root=") for override in workload):
        workload = with_png_folder(args.out / "images", args.images, workload)
    try:
        cfg = compose(workload)  # the file loader's config: checked, and the cache is made from it
        ensure_cache(cfg, args.out / "cache")
        device = pick_device(cfg.device)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    bf16 = device.type != "cuda" or torch.cuda.is_bf16_supported()
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} CPU cores"
    title = f"{time.strftime('%Y-%m-%d')}, {device.type} ({hardware}), torch {torch.__version__}: {' '.join(workload)}"
    print(f"{title}\n{args.steps} steps an epoch, epoch 2 timed; runs and logs in {args.out / 'runs'}", flush=True)

    every_row = ladder(cfg.data.root, args.out / "cache", device.type, gpus, bf16)
    overrides = row_overrides(workload, every_row)
    rows = [row for row in every_row if row.name in args.rows]
    for row in rows:
        if not row.skip:
            started = time.perf_counter()
            row.result = run_row(overrides[row.name], args.out / "runs" / row.name, args.steps)
            rate = row.result.get("train/samples_per_sec")
            done = f"{rate:,.0f} samples/s" if rate else row.result["failed"]
            if rate and row.result["steps"] < args.steps:
                done += f"; only {row.result['steps']} steps an epoch: make the data larger (--images)"
            print(f"  {row.name}: {done} ({time.perf_counter() - started:.0f} s)", flush=True)
    text = table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "benchmark.md").write_text(f"{title}\n\n{text}\n")
    plot(rows, args.out / "benchmark.png", title)
    print(text)
    return 1 if any("failed" in row.result for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
