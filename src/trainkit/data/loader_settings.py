"""How a file loader is set up (data.num_workers, data.pin_memory, data.prefetch_factor), by the loader rules of
the articles this template grew from: docs/speed.md#the-loader-rules. In-memory data ignores these keys.
"""

import logging
import os
from typing import Any

import torch

from trainkit.distributed.process_group import process_info

log = logging.getLogger(__name__)

RAISE = 1.5
MAX_WORKERS_PER_CORE = 2


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask, since the machine's count over-counts on shared nodes."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS and Windows have no affinity mask


def cores_per_rank(cores: int, local_ranks: int = 1) -> int:
    """A rank's share of `cores` when `local_ranks` ranks run on this node, at least 1."""
    return max(1, cores // max(local_ranks, 1))


def this_rank_cores() -> int:
    """The cores this rank may use: its affinity mask shared among the ranks of this node."""
    return cores_per_rank(available_cores(), process_info().local_world_size)


def resolve_num_workers(value: int | str) -> int:
    """`auto`: the cores this rank may use; a number is used as given."""
    return this_rank_cores() if value == "auto" else int(value)


def resolve_pin_memory(value: bool | str, device: torch.device) -> bool:
    """`auto`: pinned on CUDA, where non_blocking copies then overlap compute; elsewhere pinning buys nothing."""
    return device.type == "cuda" if value == "auto" else bool(value)


def file_loader_settings(data: Any, device: torch.device) -> dict:
    """FileLoader's worker count, pinning and prefetch from the data option (an image folder's defaults for keys it
    lacks); rank 0 logs what `auto` chose."""
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
