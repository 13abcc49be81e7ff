"""metrics.jsonl: the run's record, always written (the trackers are the modules beside this one)."""

from __future__ import annotations

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
