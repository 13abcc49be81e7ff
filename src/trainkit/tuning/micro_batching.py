"""trainer.micro_batch_size=auto: the largest micro-batch size whose forward and backward fit in memory.

    trainer.micro_batch_size: auto     # conf/config.yaml; trainer.micro_batch_memory_cap_mb: a cap of its own

A fixed size N is the core's (trainkit.tasks.task.micro_batches). `auto` tries the first batch whole, then in halves,
quarters, ... until one part's forward and backward fit on every rank. The size is set in the run's config, so a resume
reuses it. Deleting this module (docs/features.md) leaves N and null.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from trainkit.checkpointing.files import read_checkpoint
from trainkit.config.schema import Check, Relation, auto_or, integer, number
from trainkit.distributed.process_group import any_rank
from trainkit.errors import ConfigError
from trainkit.tasks.task import Task, first_tensor, samples
from trainkit.tuning.step_memory import training_step_probe, try_size

log = logging.getLogger(__name__)


def find_micro_batch_size(
    try_step: Callable[[int], None],
    batch_size: int,
    device: torch.device,
    memory_cap_bytes: int | None = None,
    smallest: int = 1,
) -> int:
    """The largest of batch_size, ceil(batch_size / 2), ceil(batch_size / 4), ... down to `smallest` (one
    sample: 1, or a sequence's tokens for token data, whose smaller parts are still one sequence) for which
    `try_step(size)` (one forward and backward of a part of that size) fits on every rank.

    "Does not fit": as trainkit.tuning.step_memory says. Each try ends with one all-reduce of a did-not-fit flag, so
    all ranks halve together. Any other error re-raises."""
    size = batch_size
    while True:
        reason, _ = try_size(try_step, size, device, memory_cap_bytes)
        if not any_rank(reason is not None, device):
            log.info(f"trainer.micro_batch_size=auto: {size} fits (batch of {batch_size})")
            return size
        log.info(f"trainer.micro_batch_size=auto: {size} does not fit ({reason or 'on another rank'}); halving")
        if size <= smallest:
            one = "1 sample" if smallest == 1 else f"1 sequence ({smallest} tokens)"
            shorter = "smaller images" if smallest == 1 else "shorter sequences"
            raise ConfigError(
                "trainer.micro_batch_size",
                f"is auto, but even a micro-batch of {one} does not fit in memory; make the step smaller "
                f"({shorter}, precision=bf16, a smaller model) or raise trainer.micro_batch_memory_cap_mb",
            )
        size = max(smallest, math.ceil(size / 2))


def micro_batch_size_that_fits(
    model: nn.Module,
    step: Callable[[Any], object],
    task: Task,
    loader: Iterable,
    device: torch.device,
    *,
    unit: str | None,
    memory_cap_mb: float | None,
) -> int:
    """trainer.micro_batch_size=auto: searched on `loader`'s first batch with `step(part)` (forward and backward, no
    update); the probe puts everything back as it was. `unit` (Data.size_unit, e.g. tokens): sizes count units, and a
    part of N units holds N // T items (T: the first tensor's padded length)."""
    batch = task.to_device(next(iter(loader)), device)
    per_sample = first_tensor(batch)[0].numel() if unit else 1
    probe = training_step_probe(model, batch, step)
    cap = None if memory_cap_mb is None else int(memory_cap_mb * 2**20)
    total = samples(batch) * per_sample
    found = find_micro_batch_size(lambda size: probe(max(1, size // per_sample)), total, device, cap, per_sample)
    held = f" {unit} ({max(1, found // per_sample)} of the first batch's items a part)" if unit else ""
    log.info(f"trainer.micro_batch_size=auto: training in micro-batches of {found}{held}")
    return found


def searched_micro_batch_size(
    cfg: DictConfig, run: Any, step: Callable[[Any], object], data: Any, device: torch.device
) -> dict[str, int]:
    """train.py's call: {"trainer.micro_batch_size": the size} for `auto`, searched, or on a resume the checkpoint's
    (a new search could settle elsewhere); nothing for a size or null."""
    if cfg.trainer.micro_batch_size != "auto":
        return {}
    if cfg.resume:
        saved = read_checkpoint(Path(cfg.resume), mmap=True)["config"]["trainer"]
        return {"trainer.micro_batch_size": saved["micro_batch_size"]}
    cap = cfg.trainer.micro_batch_memory_cap_mb
    found = micro_batch_size_that_fits(
        run.model, step, run.task, data.train, device, unit=data.size_unit, memory_cap_mb=cap
    )
    return {"trainer.micro_batch_size": found}


# ---- its config checks (gathered by the config check: conf/config.yaml's trainer._checks_) ----

CONFIG_RULES: dict[str, Check] = {
    "trainer.micro_batch_size": auto_or(integer(1, null=True)),  # the core's rule (a size or null), and auto
    "trainer.micro_batch_memory_cap_mb": number(above=0, null=True),
}


def _a_cap_for_auto(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    micro = cfg.trainer.micro_batch_size
    if cfg.trainer.micro_batch_memory_cap_mb is not None and micro != "auto":
        yield (
            "trainer.micro_batch_memory_cap_mb",
            f"is set, but trainer.micro_batch_size is {'null' if micro is None else micro}, not auto: the cap is only "
            f"used by auto's search; "
            f"set trainer.micro_batch_size=auto or the cap to null",
        )


CONFIG_RELATIONS = (Relation(("trainer.micro_batch_size", "trainer.micro_batch_memory_cap_mb"), _a_cap_for_auto),)
