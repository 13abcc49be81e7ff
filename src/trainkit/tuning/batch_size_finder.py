"""Find the largest batch size whose training step fits in memory: double until it does not fit, binary-search between
the last fit and the first failure, keep a safety margin (none when even `max_batch_size` fits: then the cap, not
memory, stopped the search).

    probe = training_step_probe(model, batch, step)     # step(batch): forward and backward (train.py's)
    batch_size = find_batch_size(probe, start=2, max_batch_size=4096, safety_margin=0.9, device=device)

"Does not fit": an out-of-memory error, or measured memory above `memory_cap_bytes` (trainkit.tuning.step_memory). On a
CPU set a cap or max_batch_size: Linux kills a process that asks for too much memory rather than raising an error.
The safety margin covers what the probe's peak leaves out: optimizer state, DDP's buckets, fragmentation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from trainkit.config.schema import Check, Relation, flag, integer, number
from trainkit.data.loaders import ShardedLoader
from trainkit.distributed.process_group import is_distributed
from trainkit.errors import ConfigError
from trainkit.tasks.task import Task
from trainkit.tuning.step_memory import readable_size, training_step_probe, try_size

log = logging.getLogger(__name__)


def find_batch_size(
    try_step: Callable[[int], None],
    *,
    start: int = 2,
    max_batch_size: int = 4096,
    safety_margin: float = 0.9,
    memory_cap_bytes: int | None = None,
    device: torch.device | str | None = None,
    max_batch_size_from: str = "batch_size_finder.max_batch_size",
) -> int:
    """The largest batch size for which `try_step(batch_size)` fits, times `safety_margin`, rounded down (at least 1);
    or `max_batch_size` itself when that fits (the search stopped at the cap, not at memory, so no margin is taken; the
    log line names the cap: `max_batch_size_from`).

    `try_step` runs one training step at that batch size and should leave the model as it found it. A start that does
    not fit is a ConfigError.
    """

    def fits(batch_size: int) -> bool:
        reason, peak_bytes = try_size(try_step, batch_size, device, memory_cap_bytes)
        if reason is None:
            log.info(f"batch size {batch_size}: fits ({_gib(peak_bytes)} measured)")
        else:
            log.info(f"batch size {batch_size}: does not fit ({reason})")
        return reason is None

    if not fits(start):
        raise ConfigError(
            "batch_size_finder.start",
            f"batch size {start} already does not fit in memory; lower "
            "batch_size_finder.start (1 is the least), raise the memory cap, or "
            "make the step smaller (smaller inputs, precision=bf16, a smaller model)",
        )
    good, bad = start, None
    while good < max_batch_size:
        candidate = min(good * 2, max_batch_size)
        if fits(candidate):
            good = candidate
        else:
            bad = candidate
            break
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    if bad is None:
        # Stopped at the user's cap, not at memory: the margin is for memory, so it does not apply.
        log.info(f"largest batch size searched ({max_batch_size}, {max_batch_size_from}) fits; using it")
        return good
    result = max(1, math.floor(good * safety_margin))
    log.info(f"largest batch size that fits: {good}; using {result} (x{safety_margin} safety margin)")
    return result


def _gib(size: int | None) -> str:
    return "n/a" if size is None else readable_size(size)


def batch_size_that_fits(
    model: nn.Module,
    step: Callable[[Any], object],
    task: Task,
    loader: ShardedLoader,
    device: torch.device,
    *,
    start: int,
    max_batch_size: int,
    safety_margin: float,
    memory_cap_gb: float | None,
) -> int:
    """The per-process batch size to train with, searched with `step(batch)` on `loader`'s first batch, repeated: the
    smallest any rank found, and at most this rank's share of the training split."""
    probe = training_step_probe(model, task.to_device(next(iter(loader)), device), step)
    cap = None if memory_cap_gb is None else int(memory_cap_gb * 2**30)
    max_batch_size_from = "batch_size_finder.max_batch_size"
    share = len(loader.sampler)  # this rank's training samples an epoch: the split / the number of processes
    if share < max_batch_size:
        max_batch_size = share
        max_batch_size_from = f"the training split per process: {share:,} of its {loader.sampler.size:,} samples"
    found = find_batch_size(
        probe,
        start=min(start, max_batch_size),
        max_batch_size=max_batch_size,
        safety_margin=safety_margin,
        memory_cap_bytes=cap,
        device=device,
        max_batch_size_from=max_batch_size_from,
    )
    found = min_across_ranks(found, device)  # each rank searched on its own device
    updates = math.ceil(share / found)  # drop_last aside: what the size leaves of an epoch's updates
    log.info(f"batch size finder: data.batch_size={found} per process, {updates:,} batches an epoch of {share:,}")
    if found >= share:
        log.warning(
            f"batch size finder: data.batch_size={found} is the whole training split per process: one update an "
            f"epoch; set batch_size_finder.max_batch_size to a fraction of {share:,} for more updates"
        )
    return found


def searched_batch_size(
    cfg: DictConfig, run: Any, step: Callable[[Any], object], loader: Any, device: torch.device
) -> dict[str, int]:
    """train.py's call: {"data.batch_size": the size found} with batch_size_finder.enabled; nothing on a resume."""
    finder = cfg.batch_size_finder
    if not finder.enabled or cfg.resume:
        return {}
    settings = {key: finder[key] for key in ("start", "max_batch_size", "safety_margin", "memory_cap_gb")}
    return {"data.batch_size": batch_size_that_fits(run.model, step, run.task, loader, device, **settings)}


# ---- its config checks (gathered by the config check: conf/config.yaml's batch_size_finder._checks_) ----

CONFIG_RULES: dict[str, Check] = {
    "batch_size_finder.enabled": flag(),
    "batch_size_finder.start": integer(1),
    "batch_size_finder.max_batch_size": integer(1),
    "batch_size_finder.safety_margin": number(above=0, maximum=1),
    "batch_size_finder.memory_cap_gb": number(above=0, null=True),
}


def _a_range_to_search(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    finder = cfg.batch_size_finder
    if finder.max_batch_size < finder.start:
        yield (
            "batch_size_finder.max_batch_size",
            f"must be >= batch_size_finder.start={finder.start}, got {finder.max_batch_size}",
        )


def searched_keys(cfg: DictConfig) -> tuple[str, ...]:
    """data.batch_size while the search is on: the configured size is not the one trained with."""
    return ("data.batch_size",) if cfg.batch_size_finder.get("enabled") is True else ()


CONFIG_RELATIONS = (Relation(("batch_size_finder",), _a_range_to_search),)


def min_across_ranks(value: int, device: torch.device) -> int:
    """The smallest value any rank has: a batch size every rank can fit."""
    if not is_distributed():
        return value
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())
