"""The loggers that write plain files into the run directory: metrics.jsonl (always) and logger=csv's table."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from trainkit.tracking.loggers.base import Logger, strict_json


class JsonlLogger(Logger):
    """One JSON object a line, appended and flushed as it comes, so a crashed run keeps its history."""

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
