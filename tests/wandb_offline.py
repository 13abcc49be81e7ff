"""W&B offline runs read back from their `.wandb` files, for logger=wandb's tests (tests/unit/tracking/
test_wandb_logger.py, tests/e2e/test_wandb_runs.py): deleting the tracker deletes this file with them.

The LevelDB log format: 32 KiB blocks of checksummed chunks, each a protobuf `Record` (or a part of one).
Decoded here independently of trainkit.tracking.loggers.wandb_files, so the tests do not trust the code.
wandb 0.31 writes no files/config.yaml or files/wandb-summary.json for an offline run: all of it lives in the
run's `.wandb` file, which OfflineRun decodes, as `wandb sync` would.
"""

import json
import struct
import time
from pathlib import Path

import pytest


def local_wandb(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """W&B as on a machine with no account: silent, no API key, its settings and caches in `home`."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(home))


def read_records(path: Path):
    """The protobuf records of a `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, pending = path.read_bytes(), 32768, 7, b""
    if not data:  # created, nothing written yet: a service killed at once
        return
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a chunk header is zero padding
            position += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 and length == 0:
            position += left
            continue
        if position + 7 + length > len(data):  # still being written
            return
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def unflatten(items) -> dict:
    """Record items ({key or nested_key path, value_json}) -> a nested dict."""
    result = {}
    for item in items:
        *parents, last = [item.key] if item.key else list(item.nested_key)
        target = result
        for name in parents:
            target = target.setdefault(name, {})
        target[last] = json.loads(item.value_json)
    return result


class OfflineRun:
    """What an offline run directory holds: config, history rows, final summary, exit code."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.config, self.history, self.summary, self.exit_code, self.run_id = {}, [], {}, None, None
        file = next(directory.glob("run-*.wandb"), None)  # none at all when its service was killed before writing
        for record in read_records(file) if file else []:
            kind = record.WhichOneof("record_type")
            if kind == "run":
                self.run_id = record.run.run_id
                self.display_name, self.group = record.run.display_name, record.run.run_group
                self.tags = list(record.run.tags)
                self.config.update(unflatten(record.run.config.update))
            elif kind == "config":
                self.config.update(unflatten(record.config.update))
            elif kind == "history":
                self.history.append(unflatten(record.history.item))
            elif kind == "summary":
                self.summary.update(unflatten(record.summary.update))
            elif kind == "exit":
                self.exit_code = record.exit.exit_code

    def rows_with(self, key: str) -> list[dict]:
        return [row for row in self.history if key in row]


def offline_run(run_dir: Path, timeout: float = 20.0) -> OfflineRun:
    """The finished offline run in `run_dir`. `run.finish()` returns once wandb-core has handled
    the exit record, but the core writes the `.wandb` file a moment later (at the latest when the
    process exits), so wait for the exit record to land."""
    directories = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(directories) == 1, directories
    deadline = time.monotonic() + timeout
    while (run := OfflineRun(directories[0])).exit_code is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return run
