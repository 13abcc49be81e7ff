"""What a W&B offline run's earlier parts hold on disk, read from their `.wandb` files.

W&B writes an offline run through its service process (wandb-core), into `run-<id>.wandb`: LevelDB's log format (32 KiB
blocks of chunks, each a CRC-32 of its type and payload, a length, a type; a record is one chunk or several) whose
records are the protobuf `Record`s of wandb.proto. The service buffers the file and writes it out every
x_transaction_log_flush_interval seconds (15), when a buffer fills, and when the run finishes: a process killed with
SIGKILL (the OOM killer, a lost node) leaves what was buffered unwritten, often everything (a 7-byte file, its header
alone). So a resume reads what each earlier part holds instead of trusting it: the reading stops at the first chunk that
is torn or fails its checksum, as `wandb sync` would.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
CHUNK_HEADER = 7  # checksum (uint32), length (uint16), type (uint8)
FILE_HEADER = 7  # ":W&B", a 2-byte magic number, the format version
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def record_payloads(path: Path) -> Iterator[bytes]:
    """The serialized records of a `.wandb` file, in order, up to the first torn or corrupt chunk."""
    data = path.read_bytes() if path.is_file() else b""
    if data[:4] != b":W&B":
        return
    position, pending = FILE_HEADER, b""
    while position + CHUNK_HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < CHUNK_HEADER:  # a block's tail too short for a chunk header is padding
            position += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position : position + CHUNK_HEADER])
        if checksum == length == kind == 0:  # the zeroed rest of a block
            position += left
            continue
        payload = data[position + CHUNK_HEADER : position + CHUNK_HEADER + length]
        if len(payload) < length or zlib.crc32(bytes([kind]) + payload) != checksum:
            return  # torn by a kill, or not what W&B wrote
        position += CHUNK_HEADER + length
        pending = payload if kind in (FULL, FIRST) else pending + payload
        if kind in (FULL, LAST):
            yield pending
            pending = b""


def run_file(part: Path) -> Path | None:
    """The `.wandb` file of an offline run folder (`offline-run-<time>-<id>/run-<id>.wandb`)."""
    return next(iter(sorted(part.glob("run-*.wandb"))), None)


def holds_records(part: Path) -> bool:
    """Whether an offline run folder holds any record worth syncing (not a header alone)."""
    file = run_file(part)
    return file is not None and next(record_payloads(file), None) is not None


def held_history(parts: Iterable[Path]) -> dict[int, set[str]]:
    """{step: the metric names logged at it} over the history records of `parts` (offline run folders)."""
    from wandb.proto import wandb_internal_pb2

    held: dict[int, set[str]] = {}
    for part in parts:
        file = run_file(part)
        for payload in record_payloads(file) if file else []:
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated: no stubs
            record.ParseFromString(payload)
            if record.WhichOneof("record_type") != "history":
                continue
            row = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            step = _number(row.get("step"))
            if isinstance(step, (int, float)):
                held.setdefault(int(step), set()).update(row)
    return held


def _number(value_json: str | None) -> Any:
    try:
        return json.loads(value_json) if value_json is not None else None
    except ValueError:
        return None
