"""LR schedules: each a plain function of the update index and the run's totals (`updates_per_epoch`, `total_updates`,
by keyword) giving the factor of the base LR at that update, so a resume needs only the update index. A yaml of
conf/scheduler/ names one by `_target_` with its other arguments; a new one: CONTRIBUTING.md's "Add an LR schedule"."""

import functools
import logging
import math
from collections.abc import Callable, Mapping

import torch
from hydra.utils import get_object
from omegaconf import DictConfig
from torch.optim.lr_scheduler import LambdaLR

from trainkit.config.schema import Check, number, to_dict
from trainkit.distributed.process_group import process_info

log = logging.getLogger(__name__)

WARMUP_RULES: dict[str, Check] = {"warmup_epochs": number(0), "warmup_start_factor": number(0, 1, null=True)}


def warmup_updates(warmup_epochs: float, updates_per_epoch: int, total_updates: int) -> int:
    """The warmup in updates: warmup_epochs rounded to updates, cut to half the run."""
    return min(round(warmup_epochs * updates_per_epoch), total_updates // 2)


def warmup_factor(update: int, warmup: int, start_factor: float | None) -> float:
    """The factor at `update` < `warmup`: (update + 1) / warmup, or linearly from start_factor at update 0."""
    return (update + 1) / warmup if start_factor is None else start_factor + (1 - start_factor) * update / warmup


def warmup_notices(updates_per_epoch: int, total_updates: int, warmup_epochs: float = 0, **_: object) -> list[str]:
    wanted = round(warmup_epochs * updates_per_epoch)
    warmup = warmup_updates(warmup_epochs, updates_per_epoch, total_updates)
    if warmup >= wanted:
        return []
    return [
        f"scheduler.warmup_epochs={warmup_epochs:g} is {wanted} updates, more than half of this run's "
        f"{total_updates}: warming up over {warmup} updates instead, so the LR reaches its peak"
    ]


def cosine_fall(position: float, length: float, min_lr_ratio: float) -> float:
    progress = min(position / length, 1.0)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def cosine(
    update: int,
    updates_per_epoch: int,
    total_updates: int,
    warmup_epochs: float = 1,
    warmup_start_factor: float | None = None,
    min_lr_ratio: float = 0.0,
) -> float:
    """Linear warmup, then a cosine from 1 down to min_lr_ratio at the run's last update."""
    warmup = warmup_updates(warmup_epochs, updates_per_epoch, total_updates)
    if update < warmup:
        return warmup_factor(update, warmup, warmup_start_factor)
    total = max(total_updates, warmup + 1)
    return cosine_fall(update - warmup, total - warmup, min_lr_ratio)


def constant(
    update: int,
    updates_per_epoch: int,
    total_updates: int,
    warmup_epochs: float = 0,
    warmup_start_factor: float | None = None,
) -> float:
    """1 after an optional linear warmup."""
    warmup = warmup_updates(warmup_epochs, updates_per_epoch, total_updates)
    return warmup_factor(update, warmup, warmup_start_factor) if update < warmup else 1.0


# What the config check holds each argument to, and the lines a run logs at its start (CONTRIBUTING.md).
cosine.config_rules = {**WARMUP_RULES, "min_lr_ratio": number(0, 1)}  # type: ignore[attr-defined]
cosine.notices = warmup_notices  # type: ignore[attr-defined]
constant.config_rules = WARMUP_RULES  # type: ignore[attr-defined]
constant.notices = warmup_notices  # type: ignore[attr-defined]


def lr_schedule(cfg: Mapping, updates_per_epoch: int, total_updates: int) -> tuple[Callable[[int], float], list[str]]:
    """The schedule `cfg` names as a function of the update index alone, and its notices for a run of this length."""
    arguments = to_dict(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    schedule = get_object(arguments.pop("_target_"))
    totals = {"updates_per_epoch": updates_per_epoch, "total_updates": total_updates}
    notices = getattr(schedule, "notices", None)
    return functools.partial(schedule, **totals, **arguments), list(notices(**totals, **arguments)) if notices else []


_warned: set[str] = set()  # the notices warned in this process: a run rebuilds its schedule (a resume, an LR test)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: DictConfig, updates_per_epoch: int, total_updates: int, shift: int = 0
) -> LambdaLR:
    """A LambdaLR to be stepped once per optimizer update (not per micro-batch, not per epoch), rebuilt from the config
    on a resume; its notices are warned by rank 0. `shift`: the schedule's position minus the update count
    (trainkit.run.build_lr_schedule)."""
    schedule, notices = lr_schedule(cfg, updates_per_epoch, total_updates)
    for notice in notices:
        if notice not in _warned and process_info().is_main:
            _warned.add(notice)
            log.warning(notice)
    return LambdaLR(optimizer, (lambda update: schedule(update + shift)) if shift else schedule)
