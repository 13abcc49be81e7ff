"""logger=csv: metrics.csv beside metrics.jsonl, one column per metric, one row per logged line."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from trainkit.config.schema import string
from trainkit.tracking.loggers.base import Logger, RunFacts

CONFIG_RULES = {"logger.filename": string()}  # gathered by the config check: conf/logger/csv.yaml's _checks_


def build(cfg: DictConfig, run_dir: Path, facts: RunFacts) -> Logger:
    return CsvLogger(run_dir / cfg.get("filename", "metrics.csv"))


class CsvLogger(Logger):
    """A table with one column per metric. Columns appear as metrics do, so the file is rewritten
    on each log; runs log at most a few thousand rows, which keeps that cheap. Appended to, as
    metrics.jsonl is: a resume keeps the rows before it (resume trims those written after its checkpoint)."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict] = []
        self.columns: list[str] = []
        if path.is_file():  # the cells come back as text, and are written back unchanged
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                self.columns, self.rows = list(reader.fieldnames or []), list(reader)

    def log(self, metrics: dict) -> None:
        self.rows.append(metrics)
        self.columns += [k for k in metrics if k not in self.columns]
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(self.rows)


def trim_to_checkpoint(cfg: DictConfig, run_dir: Path, written_after: Callable[[dict], bool]) -> None:
    """A resume: the table drops the rows written after the checkpoint, as metrics.jsonl does (a row for each
    of its lines, an empty cell where a line has no such metric)."""
    path = run_dir / cfg.get("filename", "metrics.csv")
    if not path.is_file():
        return
    with open(path, newline="", encoding="utf-8") as file:
        reader = csv.DictReader(file)
        columns, rows = list(reader.fieldnames or []), list(reader)
    kept = []
    for row in rows:
        record: dict = {key: value for key, value in row.items() if value != ""}
        for key in ("epoch", "step"):  # the two the rule compares; the rest only count by name
            if key in record:
                record[key] = int(record[key])
        if not written_after(record):
            kept.append(row)
    if len(kept) != len(rows):
        with open(path, "w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, fieldnames=columns)
            writer.writeheader()
            writer.writerows(kept)
