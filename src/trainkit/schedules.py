"""LR schedules: each a plain function of the update index and the run's totals that returns the factor the
base LR is multiplied by at that update. A resume needs nothing but the update index to land exactly.

A schedule is named by `_target_` in conf/scheduler/<name>.yaml; the file's other keys are the function's own
arguments. The template passes the rest by keyword: `updates_per_epoch` and `total_updates` (the run's length
in optimizer updates: trainer.max_epochs or trainer.max_steps). A new schedule is one function (here or in a
file of yours) and one yaml:

    def linear(update, updates_per_epoch, total_updates, min_lr_ratio=0.0):
        return max(min_lr_ratio, 1 - update / total_updates)
    linear.config_rules = {"min_lr_ratio": number(0, 1)}   # optional: what the config check holds each key to

    # conf/scheduler/linear.yaml
    _target_: my_schedules.linear
    min_lr_ratio: 0.0

Besides `config_rules` (read by the config check, as a model's are), a schedule may carry `notices`: a function
of the same keyword arguments returning lines the run logs once at its start, where the run is too short for
the settings (a warmup cut to half the run, a step drop that never comes).
"""

import functools
import logging
import math
from collections.abc import Callable, Mapping

import torch
from hydra.utils import get_object
from omegaconf import DictConfig

from trainkit.config.schema import Check, integer, number, one_of, to_dict
from trainkit.distributed.process_group import process_info

log = logging.getLogger(__name__)

WARMUP_RULES: dict[str, Check] = {
    "warmup_epochs": number(0),
    "warmup_start_factor": number(0, 1, null=True),
}


def warmup_updates(warmup_epochs: float, updates_per_epoch: int, total_updates: int) -> int:
    """The warmup in updates: warmup_epochs rounded to updates, cut to half the run so the LR reaches its peak
    and the schedule has updates left to run."""
    return min(round(warmup_epochs * updates_per_epoch), total_updates // 2)


def warmup_factor(update: int, warmup: int, start_factor: float | None) -> float:
    """The factor at `update` < `warmup`: (update + 1) / warmup, or linearly from start_factor at update 0."""
    if start_factor is None:
        return (update + 1) / warmup
    return start_factor + (1 - start_factor) * update / warmup


def warmup_notices(updates_per_epoch: int, total_updates: int, warmup_epochs: float = 0, **_: object) -> list[str]:
    wanted = round(warmup_epochs * updates_per_epoch)
    warmup = warmup_updates(warmup_epochs, updates_per_epoch, total_updates)
    if warmup >= wanted:
        return []
    return [
        f"scheduler.warmup_epochs={warmup_epochs:g} is {wanted} updates, more than half of this run's "
        f"{total_updates}: warming up over {warmup} updates instead, so the LR reaches its peak"
    ]


def _cosine(position: float, length: float, min_lr_ratio: float) -> float:
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
    return _cosine(update - warmup, total - warmup, min_lr_ratio)


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


def step(
    update: int,
    updates_per_epoch: int,
    total_updates: int,
    warmup_epochs: float = 0,
    warmup_start_factor: float | None = None,
    step_epochs: float = 10,
    gamma: float = 0.1,
) -> float:
    """After an optional warmup, the LR times gamma every step_epochs epochs (counted in updates)."""
    warmup = warmup_updates(warmup_epochs, updates_per_epoch, total_updates)
    if update < warmup:
        return warmup_factor(update, warmup, warmup_start_factor)
    return gamma ** ((update - warmup) // max(1, round(step_epochs * updates_per_epoch)))


def _step_notices(
    updates_per_epoch: int, total_updates: int, warmup_epochs: float = 0, step_epochs: float = 10, **_: object
) -> list[str]:
    length = max(1, round(step_epochs * updates_per_epoch))
    notices = warmup_notices(updates_per_epoch, total_updates, warmup_epochs)
    if warmup_updates(warmup_epochs, updates_per_epoch, total_updates) + length >= total_updates:
        notices.append(
            f"scheduler=step never lowers the LR in this run: the first drop (after scheduler.step_epochs="
            f"{step_epochs:g}, {length} updates) comes after its {total_updates} updates, so it "
            f"trains as scheduler=constant would; lower scheduler.step_epochs or train longer"
        )
    return notices


def cosine_restarts(
    update: int,
    updates_per_epoch: int,
    total_updates: int,
    warmup_epochs: float = 0,
    warmup_start_factor: float | None = None,
    cycle_epochs: float = 5,
    cycle_mult: int = 2,
    min_lr_ratio: float = 0.0,
) -> float:
    """Cosine with warm restarts (SGDR): cycles of cycle_epochs, each cycle_mult times longer than the last,
    each from 1 down to min_lr_ratio."""
    warmup = warmup_updates(warmup_epochs, updates_per_epoch, total_updates)
    if update < warmup:
        return warmup_factor(update, warmup, warmup_start_factor)
    since_warmup, length = update - warmup, max(1, round(cycle_epochs * updates_per_epoch))
    while since_warmup >= length:
        since_warmup -= length
        length *= cycle_mult
    return _cosine(since_warmup, length, min_lr_ratio)


def _restart_notices(
    updates_per_epoch: int,
    total_updates: int,
    warmup_epochs: float = 0,
    warmup_start_factor: float | None = None,
    cycle_epochs: float = 5,
    cycle_mult: int = 2,
    min_lr_ratio: float = 0.0,
) -> list[str]:
    """SGDR's LR jumps back to its peak at each restart: a run that ends early in a cycle ends at a high
    LR, and its last weights (the test's, with early stopping off) are those of a hot, noisy phase."""
    notices = warmup_notices(updates_per_epoch, total_updates, warmup_epochs)
    length = max(1, round(cycle_epochs * updates_per_epoch))
    ends = [warmup_updates(warmup_epochs, updates_per_epoch, total_updates) + length]  # the updates cycles end at
    while ends[-1] < total_updates:
        length *= cycle_mult
        ends.append(ends[-1] + length)
    final = cosine_restarts(
        total_updates - 1,
        updates_per_epoch,
        total_updates,
        warmup_epochs,
        warmup_start_factor,
        cycle_epochs,
        cycle_mult,
        min_lr_ratio,
    )
    # A first cycle longer than the run is a cosine cut short; after a restart, warn unless past mid-cycle.
    if len(ends) == 1 or final - min_lr_ratio <= 0.5 * (1 - min_lr_ratio):
        return notices
    notices.append(
        f"scheduler=cosine_restarts ends this run at {final:.0%} of the peak LR: its last cycle restarted at the "
        f"peak {total_updates - ends[-2]} updates before the end (scheduler.cycle_epochs={cycle_epochs:g}, "
        f"cycle_mult={cycle_mult:g}); end on a cycle's end, "
        f"trainer.max_epochs={' or '.join(f'{end / updates_per_epoch:g}' for end in ends[-2:])}, "
        "or use scheduler=cosine"
    )
    return notices


DECAY_SHAPES: dict[str, Callable[[float], float]] = {  # progress through the decay (0 to 1) -> its factor (1 to 0)
    "linear": lambda progress: 1 - progress,
    "cosine": lambda progress: 0.5 * (1 + math.cos(math.pi * progress)),
    "1-sqrt": lambda progress: 1 - math.sqrt(progress),
}


def wsd(
    update: int,
    updates_per_epoch: int,
    total_updates: int,
    warmup_epochs: float = 0,
    warmup_start_factor: float | None = None,
    decay_fraction: float = 0.2,
    decay_shape: str = "linear",
    min_lr_ratio: float = 0.0,
) -> float:
    """Warmup-stable-decay: a linear warmup, 1 until the last decay_fraction of the run, then a decay of
    decay_shape (linear, cosine or 1-sqrt) down to min_lr_ratio at the run's last update."""
    warmup = warmup_updates(warmup_epochs, updates_per_epoch, total_updates)
    if update < warmup:
        return warmup_factor(update, warmup, warmup_start_factor)
    total = max(total_updates, warmup + 1)
    decay = min(round(decay_fraction * total), total - warmup)
    if update < total - decay or decay == 0:
        return 1.0
    progress = min((update - (total - decay)) / decay, 1.0)
    return min_lr_ratio + (1 - min_lr_ratio) * DECAY_SHAPES[decay_shape](progress)


def _wsd_notices(
    updates_per_epoch: int,
    total_updates: int,
    warmup_epochs: float = 0,
    decay_fraction: float = 0.2,
    **_: object,
) -> list[str]:
    notices = warmup_notices(updates_per_epoch, total_updates, warmup_epochs)
    if decay_fraction > 0 and round(decay_fraction * total_updates) == 0:
        notices.append(
            f"scheduler=wsd never decays in this run: scheduler.decay_fraction={decay_fraction:g} of its "
            f"{total_updates} updates rounds to none; raise scheduler.decay_fraction or train longer"
        )
    return notices


# What the config check holds each argument to, and the lines a run logs at its start (see the module's docstring).
cosine.config_rules = {**WARMUP_RULES, "min_lr_ratio": number(0, 1)}  # type: ignore[attr-defined]
cosine.notices = warmup_notices  # type: ignore[attr-defined]
constant.config_rules = WARMUP_RULES  # type: ignore[attr-defined]
constant.notices = warmup_notices  # type: ignore[attr-defined]
step.config_rules = {**WARMUP_RULES, "step_epochs": number(above=0), "gamma": number(0, 1)}  # type: ignore[attr-defined]
step.notices = _step_notices  # type: ignore[attr-defined]
cosine_restarts.config_rules = {  # type: ignore[attr-defined]
    **WARMUP_RULES,
    "cycle_epochs": number(above=0),
    "cycle_mult": integer(1),
    "min_lr_ratio": number(0, 1),
}
cosine_restarts.notices = _restart_notices  # type: ignore[attr-defined]
wsd.config_rules = {  # type: ignore[attr-defined]
    **WARMUP_RULES,
    "decay_fraction": number(0, 1),
    "decay_shape": one_of(*DECAY_SHAPES),
    "min_lr_ratio": number(0, 1),
}
wsd.notices = _wsd_notices  # type: ignore[attr-defined]


# ---- the schedule a run steps: a LambdaLR over the function its config names ----


def lr_schedule(cfg: Mapping, updates_per_epoch: int, total_updates: int) -> tuple[Callable[[int], float], list[str]]:
    """The schedule `cfg` (conf/scheduler/*.yaml) names, as a function of the update index alone (its own
    arguments and the run's totals bound), and the notices it gives for a run of this length (its `notices`)."""
    arguments = to_dict(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    schedule = get_object(arguments.pop("_target_"))
    totals = {"updates_per_epoch": updates_per_epoch, "total_updates": total_updates}
    notices = getattr(schedule, "notices", None)
    return functools.partial(schedule, **totals, **arguments), list(notices(**totals, **arguments)) if notices else []


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: DictConfig, updates_per_epoch: int, total_updates: int, shift: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR to be stepped once per optimizer update (not per micro-batch, not per epoch).

    The multiplier goes in as a plain function, which LambdaLR leaves out of its state dict: a
    checkpoint keeps only the update count, and a resumed run rebuilds the schedule from its config.
    `shift`: the schedule's position minus the update count (0 unless a resume changed the updates an
    epoch: then the updates trained before count as the epochs they trained, see train.py).
    """
    schedule, notices = lr_schedule(cfg, updates_per_epoch, total_updates)
    for notice in notices:
        _warn_once(notice)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, (lambda update: schedule(update + shift)) if shift else schedule
    )


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """A warning from rank 0, once per process (the schedule is rebuilt after an applied LR range test)."""
    if message not in _warned and process_info().is_main:
        _warned.add(message)
        log.warning(message)
