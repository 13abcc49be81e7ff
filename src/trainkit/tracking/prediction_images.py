"""Predictions to look at while a run trains: after each validation, a few fixed validation images
with what the model predicts for them, for the tracker (`logger.log_predictions`: how many; W&B).
train.py calls `start_showing` (rank 0, before training: these samples and the grid of augmented samples,
trainkit.tracking.sample_grid) and `show_predictions` (after each validation) from marked lines; conf/config.yaml's
`logger._checks_.logged_images` gathers the checks of logger.log_images and logger.log_predictions here.

What a prediction looks like belongs to the task, so the loop stays the same for every task: a task that
draws its predictions (`task.pictures_for_logging`) hands the trackers images with their true and predicted class
maps (`log_masks`), which W&B draws over the image (toggled and coloured by class in its UI); a language model
hands a sample of its text (`task.sample_for_logging`). Other predictions (one class per image) are not shown: a class
is a number, and the epoch's accuracy already says more than four of them.

The same images every epoch, so the pictures show one thing changing: the model. Rank 0 alone
calls these, with the bare (or EMA) model and no collective, and draws no random number: the
training that follows is the same whether pictures are logged or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.utils._pytree import tree_map, tree_map_only

from trainkit.config.schema import Check, flag, integer
from trainkit.data.datasets import data_class
from trainkit.errors import ConfigError
from trainkit.tasks.evaluation import evaluation_outputs
from trainkit.tasks.task import Task, rows, samples
from trainkit.tracking.loggers import Loggers
from trainkit.tracking.sample_grid import log_train_samples

CONFIG_RULES: dict[str, Check] = {"logger.log_images": flag(), "logger.log_predictions": integer(minimum=0)}


def unread_settings(cfg: DictConfig) -> dict[str, str]:
    """{key: why nothing reads it}: predictions to show of data that is neither images nor token sequences
    (trainkit.config.validation.unread_settings gathers it: a warning, and a sweep searching it is refused)."""
    shows = OmegaConf.select(cfg, "logger.log_predictions", default=0)
    try:
        kind = data_class(str(cfg.data.get("_target_"))).kind
    except ConfigError:
        return {}  # the core's check of data._target_ says why
    if shows and kind not in ("image", "tokens"):
        why = f"{cfg.data.get('name')} is neither images nor token sequences, whose predictions alone are shown"
        return {"logger.log_predictions": why}
    return {}


def start_showing(run: Any) -> None:
    """Rank 0, before training (of `Run`, trainkit/run.py): the grid of augmented samples (logger.log_images), and
    run.shown, the validation samples whose predictions the trackers are shown after each validation."""
    log_train_samples(run)
    if run.cfg.logger.get("log_predictions", 0) and run.data.kind in ("image", "tokens"):  # tokens: a text sample
        run.shown = first_images(run.data.val, run.task, run.cfg.logger.log_predictions, run.device)


def show_predictions(run: Any) -> None:
    """Every rank, after each validation: rank 0 hands the trackers the predictions for run.shown, with the weights
    validation used; every rank takes part in gathering the parameters (FSDP) for it."""
    cfg = run.cfg
    with run.parallel.full_parameters(run.model, enabled=bool(cfg.logger.get("log_predictions", 0))):
        if run.shown is not None:
            log_predictions(run.loggers, run.averaged or run.model, run.shown, run.eval_transform, run.task,
                            cfg.precision.name, run.device, run.state.step)  # fmt: skip


def first_images(loader: Iterable, task: Task, count: int, device: torch.device) -> Any:
    """The first `count` samples of `loader` as one batch of its own structure (a pair, a dict, ...), as loaded
    (before the eval transform), on `device`: the samples log_predictions shows every epoch."""
    parts, found = [], 0
    for batch in loader:
        batch = task.to_device(batch, device)
        parts.append(rows(batch, torch.arange(min(count - found, samples(batch)), device=device)))
        found += samples(parts[-1])
        if found >= count:
            break
    return tree_map(lambda first, *rest: torch.cat([first, *rest]) if isinstance(first, Tensor) else first, *parts)


def log_predictions(
    loggers: Loggers,
    model: nn.Module,
    shown: Any,
    transform: Callable[[Tensor], Tensor],
    task: Task,
    precision: str,
    device: torch.device,
    step: int,
    key: str = "val/predictions",
) -> None:
    """The model's predictions for the `shown` samples (first_images), as evaluation sees them (eval mode, the
    task's transform and outputs, its test-time augmentation: trainkit.tasks.evaluation.evaluation_outputs), to the
    loggers, when the task draws them (`task.pictures_for_logging(batch, outputs, shown)`: images, true and predicted
    class maps, class names; or None) or samples its text (`task.sample_for_logging`)."""
    if callable(sample := getattr(task, "sample_for_logging", None)):  # a language model: a sample of its text
        if (logged := sample(model, shown)) is not None:
            key, text = logged
            loggers.log_text(key, text, step)
        return
    draw = getattr(task, "pictures_for_logging", None)
    if not callable(draw):  # classification, or your task's own kind: nothing to draw
        return
    model.eval()
    with torch.no_grad():
        batch, outputs = evaluation_outputs(model, shown, transform, task, precision)
    if (pictures := draw(batch, tree_map_only(Tensor, Tensor.float, outputs), shown)) is not None:
        images, true_masks, predicted_masks, class_names = pictures
        loggers.log_masks(key, images, true_masks, predicted_masks, class_names, step)
