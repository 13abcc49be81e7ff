"""The learning-rate range test (Smith, 2015; fastai's lr_find): train briefly while the LR grows
exponentially, watch the loss, suggest the LR where it falls fastest. Everything is put back after.

    result = lr_range_test(model, optimizer, step, task, data.train, device, min_lr=1e-7, max_lr=10, num_steps=100)
    log.info(f"suggested lr {result.suggestion:.2e}")
    plot_lr_finder(result, run_dir / "lr_finder.png")     # rank 0 (trainkit.tuning.lr_finder_plot)
    set_base_lr(optimizer, result.suggestion)              # then rebuild the scheduler

train.py calls `find_lr_before_training(run, step)` (with lr_finder.enabled): `find_lr` runs the test on the run's
own model, data and optimizer with the loop's step; scripts/lr_find.py calls `find_lr` alone.

The sweep sets the *base* LR (`optimizer.lr`); each parameter group keeps its relative scale (`group_scales`). Under
DDP the loss is averaged over ranks before smoothing, so all ranks see the same curve and stop at the same step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from trainkit.checkpointing.signals import stop_signal, stopped_before_training
from trainkit.config.schema import Check, Relation, flag, integer, number
from trainkit.distributed.process_group import all_reduce_sum, is_distributed
from trainkit.run import build_lr_schedule
from trainkit.tasks.task import Task, mean_over_update_tokens
from trainkit.tuning.lr_finder_plot import plot_lr_finder
from trainkit.tuning.training_state import preserved_training_state

if TYPE_CHECKING:
    from trainkit.run import Run

log = logging.getLogger(__name__)

# The suggestion rule (see suggest_lr): skip the first 10% of the points, start where the loss has
# fallen 10% of the way to its minimum, and measure slopes over +-5% of the points.
SKIP_START = 0.1
MIN_FALL = 0.1
SLOPE_WINDOW = 0.05

Step = Callable[[Any], tuple[torch.Tensor, int | torch.Tensor]]  # a batch -> its gradients; (its loss, its weight)


@dataclass
class LRFinderResult:
    lrs: list[float] = field(default_factory=list)  # the base LR of each step
    losses: list[float] = field(default_factory=list)  # smoothed (EMA, bias-corrected), all ranks' mean
    raw_losses: list[float] = field(default_factory=list)  # each step's loss, all ranks' mean
    suggestion: float | None = None  # see suggest_lr; None when the loss never fell
    stopped_early: bool = False  # the loss diverged before num_steps
    stopped_by: str | None = None  # a stop signal ended the sweep (`should_stop`'s answer): no suggestion

    def to_dict(self) -> dict:
        return asdict(self)


def group_scales(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each group's LR relative to the base LR: its `lr_scale` key, else its initial LR over the first group's."""

    def base(group: dict) -> float:
        return group.get("initial_lr", group["lr"])

    reference = base(optimizer.param_groups[0]) or 1.0
    return [group["lr_scale"] if "lr_scale" in group else base(group) / reference for group in optimizer.param_groups]


def set_base_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Make `lr` the base LR of every group (lr and initial_lr, times its scale); rebuild the scheduler afterwards."""
    for group, scale in zip(optimizer.param_groups, group_scales(optimizer)):
        group["lr"] = group["initial_lr"] = lr * scale


def suggest_lr(
    lrs: list[float],
    losses: list[float],
    skip_start: float = SKIP_START,
    window: float = SLOPE_WINDOW,
    min_fall: float = MIN_FALL,
) -> float | None:
    """The LR at the steepest descent of the smoothed loss against log(lr). The rule, exactly:

    1. Keep the points up to the first non-finite loss: n points, x = log(lr), L = smoothed loss.
    2. Skip the start, where the EMA averages few batches: s = floor(skip_start * n).
    3. m = the index of the lowest L at or after s. The points after m (the divergence) are out.
    4. The descent starts at the first index f >= s where L has fallen by min_fall (10%) of the
       whole fall: L[f] <= L[s] - min_fall * (L[s] - L[m]). Noise on the plateau is out.
    5. Slope at i: (L[b] - L[a]) / (x[b] - x[a]) with a = max(i - h, 0), b = min(i + h, n - 1),
       h = max(1, round(window * n)): a central difference that averages out batch noise.
    6. Return lrs[i] for the most negative slope among f <= i <= m; None when there are fewer than 3 points,
       m < s + 2, or no negative slope (lower min_lr, or raise num_steps).

    On a noiseless curve this is the inflection point of the drop; the EMA's lag moves it a little toward higher LRs,
    and the one-step lag of the loss (measured before the update) a little toward lower ones.
    """
    n = 0
    while n < len(losses) and math.isfinite(losses[n]):
        n += 1
    if n < 3:
        return None
    values = np.asarray(losses[:n], dtype=np.float64)
    x = np.log(np.asarray(lrs[:n], dtype=np.float64))
    start = int(skip_start * n)
    minimum = start + int(np.argmin(values[start:]))
    if minimum - start < 2:
        return None
    threshold = values[start] - min_fall * (values[start] - values[minimum])
    first = start + int(np.argmax(values[start : minimum + 1] <= threshold))
    h = max(1, round(window * n))
    best, best_slope = None, 0.0
    for i in range(first, minimum + 1):
        a, b = max(i - h, 0), min(i + h, n - 1)
        slope = (values[b] - values[a]) / (x[b] - x[a])
        if slope < best_slope:
            best, best_slope = i, slope
    return float(lrs[best]) if best is not None else None


def _endless(batches: Iterable | Callable[[], Iterator]) -> Iterator:
    """Batches forever: a loader is iterated again (a callable called again) when it runs out."""
    while True:
        empty = True
        for batch in batches() if callable(batches) else batches:
            empty = False
            yield batch
        if empty:
            raise ValueError(
                "lr_range_test: no batches (an iterator runs out after one pass: pass a loader, "
                "a list, or a function returning a fresh iterator)"
            )


def lr_range_test(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: Step,
    task: Task,
    batches: Iterable | Callable[[], Iterator],
    device: torch.device,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    grad_scaler: torch.amp.GradScaler | None = None,
    grad_clip: float | None = None,
    min_lr: float = 1e-7,
    max_lr: float = 10.0,
    num_steps: int = 100,
    smoothing: float = 0.98,
    divergence_factor: float = 4.0,
    should_stop: Callable[[], str | None] | None = None,
) -> LRFinderResult:
    """Sweep the base LR exponentially from `min_lr` to `max_lr` over `num_steps` optimizer updates, one batch each, and
    return the curve and a suggestion (see suggest_lr).

    `batches` (an iterable, iterated again when it runs out, or a function returning a fresh iterator) are moved by
    `task.to_device`; `step(batch)` computes gradients and returns (loss, weight), as train.py's train_step. Each update
    clips at `grad_clip` and steps (through `grad_scaler`): train.py's loop without accumulation, in its modes.

    The loss is smoothed by a bias-corrected EMA; the sweep stops once it is non-finite or exceeds divergence_factor x
    its lowest so far. Loss i is measured before the update at lrs[i] (a one-step lag).

    Model (parameters, buffers, gradients, modes), optimizer, scheduler, GradScaler and every RNG are restored bit for
    bit afterwards. Every rank must call it with the same settings.

    `should_stop()`, asked after every step, names a stop signal that ends the sweep at once: the state is restored,
    `stopped_by` says why, and there is no suggestion.
    """
    world_size = torch.distributed.get_world_size() if is_distributed() else 1
    growth = (max_lr / min_lr) ** (1 / (num_steps - 1))
    scales = group_scales(optimizer)
    result = LRFinderResult()
    with preserved_training_state(model, optimizer, scheduler, grad_scaler):
        model.train()
        stream = _endless(batches)
        average, best = 0.0, math.inf
        for index in range(num_steps):
            lr = min_lr * growth**index
            for group, scale in zip(optimizer.param_groups, scales):
                group["lr"] = lr * scale
            optimizer.zero_grad(set_to_none=True)
            loss, weight = step(task.to_device(next(stream), device))
            if task.weighs == "tokens":
                mean_over_update_tokens(model, weight, world_size)
            if grad_clip:
                if grad_scaler is not None:
                    grad_scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            if grad_scaler is not None:
                grad_scaler.step(optimizer)
                grad_scaler.update()
            else:
                optimizer.step()
            value = all_reduce_sum(loss.detach().float().reshape(1).clone()).item() / world_size
            average = smoothing * average + (1 - smoothing) * value
            smoothed = average / (1 - smoothing ** (index + 1))
            result.lrs.append(lr)
            result.raw_losses.append(value)
            result.losses.append(smoothed)
            if not math.isfinite(smoothed) or smoothed > divergence_factor * best:
                result.stopped_early = index < num_steps - 1
                break
            best = min(best, smoothed)
            result.stopped_by = should_stop() if should_stop is not None else None
            if result.stopped_by:
                break
        optimizer.zero_grad(set_to_none=True)
    if result.stopped_by:
        log.info(f"lr range test: stopped by {result.stopped_by} after {len(result.lrs)} of {num_steps} steps")
        return result
    result.suggestion = suggest_lr(result.lrs, result.losses)
    stop = f"stopped early at lr {result.lrs[-1]:.2e} (loss diverged)" if result.stopped_early else "ran to max_lr"
    found = f"suggested lr {result.suggestion:.2e}" if result.suggestion else "no suggestion (the loss never fell)"
    log.info(f"lr range test: {len(result.lrs)} steps from {min_lr:.1e}, {stop}; {found}")
    return result


# ---- on the run: train.py's call and scripts/lr_find.py's ----


def find_lr_before_training(run: Run, step: Step) -> None:
    """train.py's call, before the first update: the test with lr_finder.enabled, never on a resume."""
    if run.cfg.lr_finder.enabled and not run.cfg.resume:
        find_lr(run, step)


def find_lr(run: Run, step: Step) -> LRFinderResult:
    """The range test on the run's model, data and optimizer (every rank; rank 0 plots lr_finder.png); with
    lr_finder.apply the suggestion becomes the base LR. A stop signal ends it within a step, saving nothing."""
    finder = run.cfg.lr_finder
    result = lr_range_test(
        run.trained_model, run.optimizer, step, run.task, run.data.train, run.device,
        scheduler=run.scheduler, grad_scaler=run.scaler, grad_clip=run.cfg.trainer.grad_clip,
        min_lr=finder.min_lr, max_lr=finder.max_lr, num_steps=finder.num_steps, smoothing=finder.smoothing,
        divergence_factor=finder.divergence_factor, should_stop=lambda: stop_signal(run.device, agree=True),
    )  # fmt: skip
    if result.stopped_by:  # within a step of the signal; model and optimizer are as before the finder
        raise stopped_before_training(result.stopped_by, "during the LR finder")
    if run.proc.is_main:
        run.loggers.log_image("lr_finder", plot_lr_finder(result, run.run_dir / "lr_finder.png"), run.state.step)
    if finder.apply and result.suggestion:
        set_base_lr(run.optimizer, result.suggestion)  # each parameter group keeps its lr_scale
        run.scheduler = build_lr_schedule(run)
    return result


# ---- its config checks (gathered by the config check: conf/config.yaml's lr_finder._checks_) ----

CONFIG_RULES: dict[str, Check] = {
    "lr_finder.enabled": flag(),
    "lr_finder.apply": flag(),
    "lr_finder.min_lr": number(above=0),
    "lr_finder.max_lr": number(above=0),
    "lr_finder.num_steps": integer(2),
    "lr_finder.smoothing": number(0, below=1),
    "lr_finder.divergence_factor": number(above=1),
}


def _a_range_to_sweep(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    if cfg.lr_finder.max_lr <= cfg.lr_finder.min_lr:
        yield "lr_finder.max_lr", f"must be > lr_finder.min_lr={cfg.lr_finder.min_lr}, got {cfg.lr_finder.max_lr}"


CONFIG_RELATIONS = (Relation(("lr_finder",), _a_range_to_sweep),)


def ignored_settings(cfg: DictConfig) -> Iterator[str]:
    if cfg.lr_finder.apply and not cfg.lr_finder.enabled:
        yield "lr_finder.apply=true is ignored while lr_finder.enabled=false; enable the test to apply it"
