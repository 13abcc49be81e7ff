"""The LR schedules beyond the core's cosine and constant (trainkit.schedules): step, cosine with warm restarts
(SGDR) and warmup-stable-decay, each a plain function of the update index and the run's totals, with its
config_rules and notices beside it. `python scripts/trim.py --drop more_schedules` removes this module and its yamls.
"""

import math
from collections.abc import Callable

from trainkit.config.schema import integer, number, one_of
from trainkit.schedules import WARMUP_RULES, cosine_fall, warmup_factor, warmup_notices, warmup_updates


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
    return cosine_fall(since_warmup, length, min_lr_ratio)


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
    updates_per_epoch: int, total_updates: int, warmup_epochs: float = 0, decay_fraction: float = 0.2, **_: object
) -> list[str]:
    notices = warmup_notices(updates_per_epoch, total_updates, warmup_epochs)
    if decay_fraction > 0 and round(decay_fraction * total_updates) == 0:
        notices.append(
            f"scheduler=wsd never decays in this run: scheduler.decay_fraction={decay_fraction:g} of its "
            f"{total_updates} updates rounds to none; raise scheduler.decay_fraction or train longer"
        )
    return notices


# What the config check holds each argument to, and the lines a run logs at its start (see trainkit.schedules).
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
