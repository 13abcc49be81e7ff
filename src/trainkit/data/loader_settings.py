"""How a file loader is set up: `auto` worker counts and pinned memory, resolved for this process.

    data.num_workers: auto    # the CPU cores this process may use, shared among the ranks of this node
    data.pin_memory: auto     # on when training on CUDA (page-locked batches copy asynchronously)
    data.prefetch_factor: 2   # batches each worker keeps ready; only meaningful with workers

Explicit values are used as given. Only file-backed data (image folders) has worker processes;
in-memory data slices batches from a tensor on the device and ignores these keys.
"""

import os
from typing import Any

import torch

from trainkit.distributed.process_group import process_info

# Beyond about 8 decoding processes per rank, samples/s rarely grows while memory (each worker
# holds prefetched batches) and start-up time do; measure with scripts/benchmark_dataloader.py to go higher.
MAX_AUTO_WORKERS = 8


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask (taskset, SLURM, containers set it),
    not the machine's count, which over-counts on shared nodes."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS and Windows have no affinity mask


def auto_num_workers(cores: int, local_ranks: int = 1, cap: int = MAX_AUTO_WORKERS) -> int:
    """Workers for each rank: its share of the cores, less one for the training process itself,
    at least 1 (decoding then overlaps the step) and at most `cap`."""
    share = cores // max(local_ranks, 1)
    return min(cap, max(1, share - 1))


def resolve_num_workers(value: int | str, local_ranks: int | None = None, cores: int | None = None) -> int:
    if value != "auto":
        return int(value)
    local_ranks = process_info().local_world_size if local_ranks is None else local_ranks
    return auto_num_workers(available_cores() if cores is None else cores, local_ranks)


def resolve_pin_memory(value: bool | str, device: torch.device) -> bool:
    """`auto`: pinned on CUDA, where page-locked batches let `.to(device, non_blocking=True)`
    overlap the copy with compute; elsewhere pinning buys nothing."""
    return device.type == "cuda" if value == "auto" else bool(value)


def file_loader_settings(data: Any, device: torch.device) -> dict:
    """FileLoader's keyword arguments for worker count, pinned memory and prefetch, from the data
    option (an ImageData, or its config). A file dataset of your own without the optional keys
    (pin_memory, prefetch_factor) gets data=imagefolder's defaults."""
    return dict(
        num_workers=resolve_num_workers(data.num_workers),
        pin_memory=resolve_pin_memory(getattr(data, "pin_memory", "auto"), device),
        prefetch_factor=getattr(data, "prefetch_factor", 2),
    )
