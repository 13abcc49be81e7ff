"""Where metrics go: metrics.jsonl always (the run's record), plus the trackers chosen by `logger`:
csv, wandb, tensorboard, mlflow, several at once (`logger=[wandb,tensorboard]`).

train.py talks to one `Loggers` object: `log(metrics)` for every metrics dict (each carries
`epoch` and `step`), `log_image(key, image, step)`, `log_masks(...)` for images with their true and
predicted masks (trainkit.tracking.prediction_images), `summary(values)` for the run's headline
numbers, and `finish(failed=...)` in a `finally`. A tracker that has no use for a call ignores it.
Each tracker is a module here, and imports its library only when it is chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from trainkit.tracking.loggers.base import Logger, finite_or_null, strict_json
from trainkit.tracking.loggers.local import CsvLogger, JsonlLogger, read_jsonl
from trainkit.tracking.loggers.mlflow_logger import MlflowLogger
from trainkit.tracking.loggers.tensorboard_logger import TensorBoardLogger
from trainkit.tracking.loggers.wandb_logger import WANDB_MODES, WandbLogger, wandb_names

if TYPE_CHECKING:
    from torch import Tensor

LOGGERS = ("none", "csv", "wandb", "tensorboard", "mlflow")

__all__ = [
    "LOGGERS",
    "WANDB_MODES",
    "CsvLogger",
    "JsonlLogger",
    "Logger",
    "Loggers",
    "MlflowLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "build_loggers",
    "finite_or_null",
    "strict_json",
    "tracker_names",
    "wandb_names",
]


def tracker_names(cfg: DictConfig | Mapping) -> list[str]:
    """The trackers a logger config turns on: each conf/logger file adds itself to `trackers`
    (a mapping, so `logger=[wandb,tensorboard]` merges both). A config with `name` alone (a
    checkpoint's from before `trackers`, one written by hand) names one."""
    trackers = cfg.get("trackers")
    if trackers is None:
        return [name for name in [cfg.get("name", "none")] if name != "none"]
    return [name for name, on in trackers.items() if on and name != "none"]


class Loggers:
    """Fans every call out to each logger, so train.py logs once."""

    def __init__(self, loggers: list, names: list[str] | None = None):
        self.loggers = loggers
        self.names = names or [type(logger).__name__ for logger in loggers]

    @property
    def run_ids(self) -> dict[str, str]:
        """{tracker: its run id} for the trackers that have one: train.py keeps them in checkpoints
        so that a resume continues the same runs."""
        return {
            name: logger.run_id for name, logger in zip(self.names, self.loggers) if getattr(logger, "run_id", None)
        }

    def log(self, metrics: dict) -> None:
        for logger in self.loggers:
            logger.log(metrics)

    def log_image(self, key: str, image: object, step: int) -> None:
        for logger in self.loggers:
            logger.log_image(key, image, step)

    def log_masks(
        self, key: str, images: Tensor, true_masks: Tensor, predicted_masks: Tensor, class_names: list[str], step: int
    ) -> None:
        for logger in self.loggers:
            logger.log_masks(key, images, true_masks, predicted_masks, class_names, step)

    def log_text(self, key: str, text: str, step: int) -> None:
        for logger in self.loggers:
            logger.log_text(key, text, step)

    def summary(self, values: dict) -> None:
        for logger in self.loggers:
            logger.summary(values)

    def finish(self, failed: bool = False) -> None:
        for logger in self.loggers:
            logger.finish(failed=failed)


def build_loggers(
    cfg: DictConfig,
    run_dir: Path,
    config: dict | None = None,
    run_name: str | None = None,
    group: str | None = None,
    resume_ids: Mapping[str, str | None] | None = None,
    provenance: dict | None = None,
    resume_step: int | None = None,
) -> Loggers:
    """metrics.jsonl plus each tracker `tracker_names(cfg)` lists. `config` (a plain dict: the resolved
    run config), `provenance` (provenance.json's facts), `run_name` and `group` (see `wandb_names`) go to the
    trackers that keep them; `resume_ids` ({tracker: run id}, from the checkpoint) and `resume_step` (the
    checkpoint's step) continue a resumed run's. trainkit.config.rules checked the names and keys."""
    resume_ids = resume_ids or {}
    loggers: list[Logger] = [JsonlLogger(run_dir / "metrics.jsonl")]
    names = ["jsonl"]
    for name in tracker_names(cfg):
        if name == "csv":
            loggers.append(CsvLogger(run_dir / cfg.get("filename", "metrics.csv")))
        elif name == "wandb":
            w_config = {**(config or {}), "provenance": provenance} if provenance else config
            resume_id = resume_ids.get(name)
            history = read_jsonl(run_dir / "metrics.jsonl") if resume_id else None  # trimmed to the checkpoint
            loggers.append(WandbLogger(cfg, run_dir, w_config, run_name, group, resume_id, history))
        elif name == "tensorboard":
            loggers.append(TensorBoardLogger(cfg, run_dir, config, provenance, resume_step))
        elif name == "mlflow":
            loggers.append(MlflowLogger(cfg, run_dir, config, provenance, run_name, resume_ids.get(name), resume_step))
        names.append(name)
    return Loggers(loggers, names)
