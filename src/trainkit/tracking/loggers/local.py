"""metrics.jsonl: the run's record, always written (the trackers are the modules beside this one), and the strict JSON
it and summary.json are written in."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trainkit.tracking.loggers.base import Logger


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinite float inside (dicts, lists) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


def strict_json(value: Any, indent: int | None = None) -> str:
    """JSON that strict readers accept: null, never the bare NaN or Infinity Python writes."""
    return json.dumps(finite_or_null(value), indent=indent, allow_nan=False)


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
