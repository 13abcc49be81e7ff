"""How a file loader is set up, by the two loader rules of the articles this template grew from.

    data.num_workers: auto    # 1x the CPU cores this rank may use (its affinity mask, shared among the node's ranks)
    data.pin_memory: auto     # on when training on CUDA (page-locked batches copy asynchronously)
    data.prefetch_factor: 2   # batches each worker keeps ready; only meaningful with workers

The rules, in the articles' numbers:
- Workers: start at the core count (8 cores: 8 workers, 12: 12); raise them to 1.5x when the GPU
  keeps falling under 50% busy or loading takes too long; never go above 2x the cores (on a
  32-core server, 16 workers starved the GPU, 48 choked the loader, 32 was right).
- Too long: loading over a third of the compute time, wait / (step - wait) > 1/3, which is a wait
  over a quarter of the whole step.
`auto` is the first rule's start. trainkit.tracking.bottleneck warns by the second rule and
advises by the first; scripts/benchmark_dataloader.py measures 1x, 1.5x and 2x the cores.

Explicit values are used as given. Only file-backed data (image folders) has worker processes;
in-memory data slices batches from a tensor on the device and ignores these keys.
"""

import logging
import math
import os
from typing import Any

import torch

from trainkit.distributed.process_group import process_info

log = logging.getLogger(__name__)

RAISE = 1.5  # the step up from the cores when the GPU starves or loading takes too long
MAX_WORKERS_PER_CORE = 2  # the ceiling: beyond it the workers choke the loader (and the host)
GPU_STARVED = 0.5  # train/gpu_util under this while the data wait is high: the GPU waits for its batches
LOADING_LIMIT = 1 / 3  # loading time over compute time above which the loader is the bottleneck


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask (taskset, SLURM, containers set it),
    not the machine's count, which over-counts on shared nodes."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS and Windows have no affinity mask


def cores_per_rank(cores: int, local_ranks: int = 1) -> int:
    """A rank's share of `cores` when `local_ranks` ranks run on this node, at least 1: what the
    articles call the cores, for one rank, and so the worker count `auto` starts from."""
    return max(1, cores // max(local_ranks, 1))


def this_rank_cores() -> int:
    """The cores this rank may use: its affinity mask shared among the ranks of this node."""
    return cores_per_rank(available_cores(), process_info().local_world_size)


def resolve_num_workers(value: int | str) -> int:
    """`auto`: 1x the cores this rank may use, the articles' start; a number is used as given."""
    return this_rank_cores() if value == "auto" else int(value)


def more_workers(workers: int, cores: int) -> int | None:
    """The articles' next worker count up from `workers` for a rank with `cores` cores: the cores
    themselves (their start) while below them, then 1.5x, never above 2x the cores; None at the ceiling."""
    ceiling = MAX_WORKERS_PER_CORE * cores
    if workers >= ceiling:
        return None
    return cores if workers < cores else min(math.ceil(RAISE * workers), ceiling)


def loading_per_compute(wait_share: float) -> float:
    """Loading time over compute time, from the wait's share of the step (train/data_wait_fraction):
    wait / (step - wait)."""
    return wait_share / (1 - wait_share) if wait_share < 1 else math.inf


def data_bound(wait_share: float) -> bool:
    """The articles' rule: loading took over a third of the compute time (a wait over 1/4 of the step)."""
    return loading_per_compute(wait_share) > LOADING_LIMIT


def resolve_pin_memory(value: bool | str, device: torch.device) -> bool:
    """`auto`: pinned on CUDA, where page-locked batches let `.to(device, non_blocking=True)`
    overlap the copy with compute; elsewhere pinning buys nothing."""
    return device.type == "cuda" if value == "auto" else bool(value)


def file_loader_settings(data: Any, device: torch.device) -> dict:
    """FileLoader's keyword arguments for worker count, pinned memory and prefetch, from the data
    option (an ImageData, or its config). A file dataset of your own without the optional keys
    (pin_memory, prefetch_factor) gets data=imagefolder's defaults. Rank 0 logs what they resolved
    to, so a run's log shows what `auto` chose."""
    pin_memory = getattr(data, "pin_memory", "auto")
    settings = dict(
        num_workers=resolve_num_workers(data.num_workers),
        pin_memory=resolve_pin_memory(pin_memory, device),
        prefetch_factor=getattr(data, "prefetch_factor", 2),
    )
    if process_info().is_main:
        log.info(settings_line(settings, data.num_workers, pin_memory))
    return settings


def settings_line(settings: dict, num_workers: int | str, pin_memory: bool | str) -> str:
    """e.g. `data: 8 workers per rank, pinned (data.num_workers=auto, data.pin_memory=auto)`."""
    workers = settings["num_workers"]
    count = f"{workers} worker{'s' * (workers != 1)} per rank" if workers else "no workers (decoded in this process)"
    pinned = "pinned" if settings["pin_memory"] else "not pinned"
    return f"data: {count}, {pinned} (data.num_workers={num_workers}, data.pin_memory={str(pin_memory).lower()})"
