"""Read the records of a W&B offline run (its `run-<id>.wandb` file), for tests.

The file is wandb's transaction log: a 7-byte header, then LevelDB-log records (32 KiB
blocks; 7-byte record headers: crc32, length, type FULL/FIRST/MIDDLE/LAST), each a
`wandb.proto.wandb_internal_pb2.Record` (the installed wandb's own schema).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    """Every Record in a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    pos, chunks = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left  # block trailer: padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0:
            pos += left  # zero-filled rest of a block
            continue
        chunks += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def run_id(run_dir: Path) -> str:
    (path,) = Path(run_dir).glob("run-*.wandb")
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run.run_id
    raise AssertionError(f"no run record in {path}")


def history(run_dir: Path) -> list[dict]:
    """The history rows (wandb.log calls) of an offline run directory, values decoded."""
    (path,) = Path(run_dir).glob("run-*.wandb")
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in items
                }
            )
    return rows
