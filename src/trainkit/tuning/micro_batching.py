"""trainer.micro_batch_size: one batch trained as several smaller forward/backward passes, one update.

    for part, share in micro_batches(batch, trainer.micro_batch_size):   # any batch: a pair, a dict, ...
        loss, outputs = task.step(model, part)
        (loss * share / group_size).backward()     # share: this part's samples / the batch's (trainkit.tasks.weighting)

A batch of B samples is cut into parts of N (the last may be smaller). The task's loss is a mean over
its samples, so weighing each part's mean by its share of the batch and summing the gradients gives
the gradient of the whole batch's mean: the same update, the same number of updates and the same LR
schedule as without the split (unlike trainer.accumulate_grad_batches, which adds batches to an
update). What differs: BatchNorm normalizes each part with that part's statistics (N samples, not
B), and a part's activations are freed before the next part runs, which is the point (peak
activation memory ~N/B of the whole batch's). Token data ([B, T] sequences) is split by tokens: N
counts tokens, a part holds N // T sequences, and a task that weighs tokens weighs each part by its
real tokens (trainkit.tasks.weighting), so the update is the same however the batch is cut.

`auto` (micro_batch_size_that_fits): before training, the first batch is tried whole, then in
halves, quarters, ... (of its tokens, for token data) until one part's forward and backward (train.py's
step) fit in memory; every rank agrees at each
try, so all ranks settle on the same size. The size found replaces `auto` in the run's config (and so
in every checkpoint's config): a resume reuses it without searching again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from trainkit.config.schema import Check, Relation, auto_or, integer, number
from trainkit.data.datasets import data_class
from trainkit.distributed.process_group import any_rank
from trainkit.errors import ConfigError
from trainkit.tasks import batches
from trainkit.tasks.task import Task
from trainkit.tuning.batch_size_finder import (
    free_memory,
    is_out_of_memory,
    measure_step_memory,
    readable_size,
    training_step_probe,
)

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

    "Does not fit": an out-of-memory error (CUDA's, the CPU allocator's "can't allocate memory"; see
    batch_size_finder.is_out_of_memory) or, with `memory_cap_bytes`, a measured step memory above the
    cap (batch_size_finder.measure_step_memory: CUDA's allocator peak; on a CPU the activations
    autograd saves). Each try ends with one all-reduce of a did-not-fit flag (any_rank), so a rank
    that ran out of memory and one that did not both halve: nobody waits alone in a collective. Any
    other error re-raises."""
    size = batch_size
    while True:
        reason = _does_not_fit(try_step, size, device, memory_cap_bytes)
        if not any_rank(reason is not None, device):
            log.info(f"trainer.micro_batch_size=auto: {size} fits (batch of {batch_size})")
            return size
        log.info(f"trainer.micro_batch_size=auto: {size} does not fit ({reason or 'on another rank'}); halving")
        if size <= smallest:
            one, shorter = (
                ("1 sample", "finetune.input_size")
                if smallest == 1
                else (f"1 sequence ({smallest} tokens)", "shorter sequences")
            )
            raise ConfigError(
                "trainer.micro_batch_size",
                f"is auto, but even a micro-batch of {one} does not fit in memory; make the step smaller "
                f"({shorter}, precision=bf16, a smaller model) or raise trainer.micro_batch_memory_cap_mb",
            )
        size = max(smallest, math.ceil(size / 2))


def _does_not_fit(try_step: Callable[[int], None], size: int, device: torch.device, cap: int | None) -> str | None:
    """Why `try_step(size)` did not fit on this rank, or None when it did."""
    reason = None
    try:
        with measure_step_memory(device) as measurement:
            try_step(size)
        if cap is not None and measurement.peak_bytes is not None and measurement.peak_bytes > cap:
            reason = f"{readable_size(measurement.peak_bytes)} measured, above the cap of {readable_size(cap)}"
    except Exception as error:  # out of memory is expected here; anything else is a real error
        if not is_out_of_memory(error):
            raise
        reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
    if reason is not None:
        free_memory(device)  # outside the except block: the traceback's frames (and tensors) are gone
    return reason


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
    """trainer.micro_batch_size=auto for train.py: searched (find_micro_batch_size) on `loader`'s first batch,
    moved to `device` (task.to_device), with `step(part)`, the forward and backward of a part (train.py's: its
    batch transform, task.step; no update). The probe puts gradients, BatchNorm statistics, modes and RNG
    streams back as they were, so the failed tries leave nothing behind and training starts as it would have.
    `unit` (Data.size_unit, items of many sizes: tokens): sizes count units, and a part of N units holds
    N // T of the batch's items (T: the first tensor's padded length).
    Not in a part's measured memory: the optimizer's state and DDP's buckets, as for the batch-size finder
    (trainkit.tuning.batch_size_finder)."""
    batch = task.to_device(next(iter(loader)), device)
    per_sample = batches.first_tensor(batch)[0].numel() if unit else 1
    probe = training_step_probe(model, batch, step)
    cap = None if memory_cap_mb is None else int(memory_cap_mb * 2**20)
    total = batches.samples(batch) * per_sample
    found = find_micro_batch_size(lambda size: probe(max(1, size // per_sample)), total, device, cap, per_sample)
    held = f" {unit} ({max(1, found // per_sample)} of the first batch's items a part)" if unit else ""
    log.info(f"trainer.micro_batch_size=auto: training in micro-batches of {found}{held}")
    return found


# ---- their config checks (gathered by the config check: conf/config.yaml's trainer._checks_) ----

CONFIG_RULES: dict[str, Check] = {
    "trainer.micro_batch_size": auto_or(integer(1, null=True)),
    "trainer.micro_batch_memory_cap_mb": number(above=0, null=True),
}


def _a_size_below_the_batch(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    micro, batch_size = cfg.trainer.micro_batch_size, cfg.data.batch_size
    try:  # a micro-batch of sized data counts units (tokens), not items (a data._target_ that does not import: its own)
        sized = data_class(str(cfg.data.get("_target_"))).size_unit is not None
    except ConfigError:
        sized = False
    # Larger than the batch would be no split at all: say so rather than train whole batches silently.
    # (With the batch-size finder, data.batch_size is only known later; a larger N is then one part.)
    searched = OmegaConf.select(cfg, "batch_size_finder.enabled", default=False)
    if isinstance(micro, int) and micro > batch_size and not searched and not sized:
        yield (
            "trainer.micro_batch_size",
            f"is {micro}, larger than data.batch_size={batch_size}: nothing to split; set it to at most {batch_size}",
        )


def _a_cap_for_auto(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    micro = cfg.trainer.micro_batch_size
    if cfg.trainer.micro_batch_memory_cap_mb is not None and micro != "auto":
        yield (
            "trainer.micro_batch_memory_cap_mb",
            f"is set, but trainer.micro_batch_size is {'null' if micro is None else micro}, not auto: the cap is only "
            f"used by auto's search; "
            f"set trainer.micro_batch_size=auto or the cap to null",
        )


CONFIG_RELATIONS = (
    Relation(
        ("trainer.micro_batch_size", "data.batch_size", "batch_size_finder.enabled"),
        _a_size_below_the_batch,
    ),
    Relation(("trainer.micro_batch_size", "trainer.micro_batch_memory_cap_mb"), _a_cap_for_auto),
)
