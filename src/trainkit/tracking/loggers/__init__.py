"""Where metrics go: metrics.jsonl always (the run's record), plus the trackers chosen by `logger` (the modules beside
this one), several at once (`logger=[a,b]`).

train.py talks to one `Loggers` object: `log(metrics)` for every metrics dict (each carries `epoch` and `step`),
`log_image(key, image, step)`, `log_masks(...)` for images with their true and predicted masks
(trainkit.tracking.prediction_images), `summary(values)` for the run's headline numbers, and `finish(failed=...)` in a
`finally`. A tracker that has no use for a call ignores it. Each tracker is a module here, `<name>_logger.py`, found by
its name (logger.trackers' keys): it offers `build(cfg, run_dir, facts) -> Logger`, its config checks (`CONFIG_RULES`),
and where it keeps a file of its own that a resume trims, `trim_to_checkpoint`. It imports its library only when it is
chosen. Deleting one is deleting its module and its conf/logger file (docs/features.md). metrics.jsonl's logger is here,
with the strict JSON that it and summary.json are written in.
"""

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

__all__ = [
    "JsonlLogger",
    "Logger",
    "Loggers",
    "RunFacts",
    "build_loggers",
    "read_jsonl",
    "run_names",
    "strict_json",
    "tracker_names",
    "trackers",
    "trim_tracker_files",
]


def strict_json(value: Any, indent: int | None = None) -> str:
    """JSON that strict readers accept: null for every NaN or infinite float inside (dicts, lists), never the bare
    NaN or Infinity Python writes."""
    plain = json.loads(json.dumps(value), parse_constant=lambda constant: None)  # NaN, Infinity, -Infinity
    return json.dumps(plain, indent=indent, allow_nan=False)


class JsonlLogger(Logger):
    """metrics.jsonl, the run's record: one JSON object per line, appended and flushed as it comes, so a crashed run
    keeps its history."""

    def __init__(self, path: Path):
        # Open for the whole run (closed in finish): a line is flushed as each metric comes in.
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def log(self, metrics: dict) -> None:
        self.file.write(strict_json(metrics) + "\n")
        self.file.flush()

    def finish(self, failed: bool = False) -> None:
        self.file.close()


def read_jsonl(path: Path) -> list[dict]:
    """metrics.jsonl's objects, in order; none for a missing file; a torn last line (a kill) is left out."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


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
    """The trackers a logger config turns on: each conf/logger file adds itself to `trackers`
    (a mapping, so `logger=[a,b]` merges both). A config with `name` alone (a
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


def build_loggers(cfg: DictConfig, run_dir: Path, **facts: Any) -> Loggers:
    """metrics.jsonl plus each tracker `tracker_names(cfg)` lists, built by its module from `facts`: what a tracker
    may keep of the run (RunFacts' fields: config, provenance, run_name, group, resume_ids, resume_step). The
    config check checked the names and keys."""
    loggers: list[Logger] = [JsonlLogger(run_dir / "metrics.jsonl")]
    names = tracker_names(cfg)
    loggers += [tracker(name).build(cfg, run_dir, RunFacts(**facts)) for name in names]
    return Loggers(loggers, ["jsonl", *names])
