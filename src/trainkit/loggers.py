"""Where metrics go: metrics.jsonl always (the run's record), plus the tracker chosen by `logger`."""
import csv
import json
import math
from pathlib import Path

from omegaconf import DictConfig

from trainkit.errors import ConfigError

LOGGERS = ("none", "csv")


class JsonlLogger:
    """One JSON object a line, appended and flushed as it comes, so a crashed run keeps its history."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def log(self, metrics: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()

    def finish(self) -> None:
        self.file.close()


class CsvLogger:
    """A table with one column per metric. Columns appear as metrics do, so the file is rewritten
    on each log; runs log at most a few thousand rows, which keeps that cheap."""

    def __init__(self, path: Path):
        self.path, self.rows, self.columns = path, [], []

    def log(self, metrics: dict) -> None:
        self.rows.append(metrics)
        self.columns += [k for k in metrics if k not in self.columns]
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(self.rows)

    def finish(self) -> None:
        pass


class Loggers:
    """Fans every call out to each logger, so train.py logs once."""

    def __init__(self, loggers: list):
        self.loggers = loggers

    def log(self, metrics: dict) -> None:
        for logger in self.loggers:
            logger.log(metrics)

    def finish(self) -> None:
        for logger in self.loggers:
            logger.finish()


def build_loggers(cfg: DictConfig, run_dir: Path) -> Loggers:
    if cfg.name not in LOGGERS:
        raise ConfigError("logger.name", f"unknown logger '{cfg.name}'; choose one of {', '.join(LOGGERS)}")
    loggers = [JsonlLogger(run_dir / "metrics.jsonl")]
    if cfg.name == "csv":
        loggers.append(CsvLogger(run_dir / cfg.get("filename", "metrics.csv")))
    return Loggers(loggers)
