"""The bottleneck report: the epoch line's timing extras, and one warning a run when data is the limit.

The rule of thumb: when the step waits for its batch more than a third of the time
(train/data_wait_fraction > 1/3), faster hardware or a bigger model would not train faster; the
loader would. The warning names the switches that help for the data option in use, with their
current values, instead of generic advice.
"""

import logging

from omegaconf import DictConfig

from trainkit.data.loader_settings import available_cores
from trainkit.data.loaders import FileLoader
from trainkit.tracking.timing import LoopTimer

log = logging.getLogger("train")

DATA_BOUND = 1 / 3  # waiting above this share of the step time: the data is the bottleneck


def epoch_line_extras(metrics: dict) -> str:
    """e.g. `  data 12% of 3.1 ms/step  cpu 85%` or `  data 40% of 9.8 ms/step  gpu 55%  mem 12.3 GiB`:
    each part after two spaces, as in the rest of the epoch line; empty when nothing was measured."""
    parts = []
    if "train/data_wait_fraction" in metrics:
        parts.append(f"data {metrics['train/data_wait_fraction']:.0%} of {metrics['train/step_ms']:.1f} ms/step")
    if "train/gpu_util" in metrics:
        parts.append(f"gpu {metrics['train/gpu_util']:.0%}")
    if "train/peak_memory_gb" in metrics:
        parts.append(f"mem {metrics['train/peak_memory_gb']:.1f} GiB")
    if "train/cpu_util" in metrics:
        parts.append(f"cpu {metrics['train/cpu_util']:.0%}")
    return "".join(f"  {part}" for part in parts)


def data_bound_advice(loader: object, data: DictConfig, on_cuda: bool) -> list[str]:
    """The switches that shorten the wait for this data option, each with its current value."""
    if not isinstance(loader, FileLoader):  # in memory: batches are slices of a tensor on the device
        advice = [
            f"{data.name} is held in memory on the device, so workers and pinned memory do not apply: the wait is "
            f"the per-batch gather, large next to a step this short; raise data.batch_size (now {data.batch_size})"
        ]
        if data.name == "cached":
            advice.append(
                "a cache too large for the device streams from its memory-mapped file: rebuild it with "
                "scripts/preprocess.py at a smaller data.image_size so it fits on the device"
            )
        return advice
    workers, cores = loader.loader.num_workers, available_cores()
    advice = []
    if workers < cores:
        advice.append(
            f"more decoding workers: data.num_workers={min(cores, max(2 * workers, 1))} "
            f"(now {workers}; this process may use {cores} cores)"
        )
    else:
        advice.append(f"the {workers} workers already use all {cores} cores of this process: decoding is the limit")
    if workers > 0 and (loader.loader.prefetch_factor or 0) < 4:
        advice.append(f"data.prefetch_factor=4 (now {loader.loader.prefetch_factor}) evens out slow batches")
    if on_cuda and not loader.loader.pin_memory:
        advice.append("pinned memory: data.pin_memory=true (asynchronous host-to-device copies)")
    advice.append(
        f"decode once, offline: scripts/preprocess.py turns {data.root} into a uint8 cache at data.image_size, "
        "and data=cached trains from it on the device with no per-image decoding"
    )
    advice.append(f"a smaller data.image_size (now {data.image_size}): less to decode, resize and copy")
    return advice


def warn_if_data_bound(timer: LoopTimer, metrics: dict, loader: object, data: DictConfig) -> None:
    """Rank 0, after each epoch: the warning, the first time an epoch of the run waited too long."""
    fraction = metrics.get("train/data_wait_fraction", 0.0)
    if timer.warned_data_bound or fraction <= DATA_BOUND:
        return
    timer.warned_data_bound = True
    advice = "".join(f"\n  - {line}" for line in data_bound_advice(loader, data, timer.cuda))
    log.warning(
        f"data-bound: the step waited for its batch {fraction:.0%} of the time (rule of thumb: at most a third; "
        f"train/data_wait_fraction in metrics.jsonl). What helps for data={data.name}:{advice}"
    )
