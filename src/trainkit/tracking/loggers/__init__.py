"""Where metrics go: metrics.jsonl always (the run's record, in strict JSON), plus the trackers `logger` chooses,
several at once (`logger=[a,b]`). train.py talks to one `Loggers`, which passes each call to every logger (base.Logger
says what a logger answers). A tracker is a module here, `<name>_logger.py`, found by its name (logger.trackers' keys):
its `build(cfg, run_dir, facts) -> Logger`, its config checks (`CONFIG_RULES`) and, where it keeps a file of its own
that a resume trims, `trim_to_checkpoint`. It imports its library only when chosen (docs/features.md)."""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from trainkit.tracking.loggers.base import Logger, RunFacts, run_names

if TYPE_CHECKING:
    from torch import Tensor


def strict_json(value: Any, indent: int | None = None) -> str:
    """JSON that strict readers accept: null for every NaN or infinite float inside, never Python's bare NaN."""
    plain = json.loads(json.dumps(value), parse_constant=lambda constant: None)  # NaN, Infinity, -Infinity
    return json.dumps(plain, indent=indent, allow_nan=False)


class JsonlLogger(Logger):
    """metrics.jsonl: one JSON object per line, appended and flushed as it comes, so a crashed run keeps its history."""

    def __init__(self, path: Path):
        # Open for the whole run (closed in finish): a line is flushed as each metric comes in.
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def log(self, metrics: dict) -> None:
        self.file.write(strict_json(metrics) + "\n")
        self.file.flush()

    def finish(self, failed: bool = False) -> None:
        self.file.close()


def trackers() -> list[str]:
    """The trackers there are: the `<name>_logger` modules beside this one."""
    names = [module.name for module in pkgutil.iter_modules(__path__)]
    return [name.removesuffix("_logger") for name in names if name.endswith("_logger")]


def tracker(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}_logger")


def trim_tracker_files(cfg: DictConfig, run_dir: Path, written_after: Callable[[dict], bool]) -> None:
    """A resume: each chosen tracker that keeps a file of its own in the run directory drops what was written
    after the checkpoint (`written_after(record)`), as metrics.jsonl does."""
    for name in tracker_names(cfg):
        trim = getattr(tracker(name), "trim_to_checkpoint", None)
        if trim is not None:
            trim(cfg, run_dir, written_after)


def tracker_names(cfg: DictConfig | Mapping) -> list[str]:
    """The trackers a logger config turns on: each conf/logger file adds itself to the mapping `trackers`, so
    `logger=[a,b]` merges both. A config with `name` alone (a checkpoint's from before `trackers`) names one."""
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
        """{tracker: its run id} for the trackers that have one, which checkpoints keep for a resume to continue."""
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


def build_loggers(cfg: DictConfig, run_dir: Path, **facts: Any) -> Loggers:
    """metrics.jsonl plus each tracker `tracker_names(cfg)` lists, built by its module from `facts` (RunFacts'
    fields). The config check checked the names and keys."""
    names = tracker_names(cfg)
    built = [tracker(name).build(cfg, run_dir, RunFacts(**facts)) for name in names]
    return Loggers([JsonlLogger(run_dir / "metrics.jsonl"), *built], ["jsonl", *names])


def recorded_origin(run_dir: Path) -> dict:
    """provenance.json's facts (where trainkit.tracking.provenance wrote them before the run was built), or {}."""
    path = run_dir / "provenance.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def start_logging(run: Any) -> None:
    """Rank 0: run.loggers, given the config and provenance.json's facts; a resume continues the trackers' runs."""
    run_name, group = run_names(run_dir=run.run_dir)
    run.loggers = build_loggers(
        run.cfg.logger,
        run.run_dir,
        config=run.resolved_config,
        run_name=run_name,
        group=group,
        resume_ids=run.state.tracker_run_ids,
        provenance=recorded_origin(run.run_dir),
        resume_step=run.state.step if run.cfg.resume else None,
    )
