"""The run's event log: machine-readable facts, one JSON object per line.

The launcher and the trainers append events to ``<output_dir>/events.jsonl``; `maxent-grpo runs`
and `plot` read them back. Human logs stay free-form: nothing parses them.

Each line has ``time`` (Unix seconds), ``event`` (a name from EVENTS) and the event's own
fields. Lines are written with one ``write`` on a file opened for appending, so writers on
several processes do not interleave within a line; a reader skips a torn last line.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

EVENTS_FILE = "events.jsonl"

# name -> the fields it carries (documentation and a check for writers).
EVENTS = {
    "attempt_start": "method, recipe, job, attempt, host",
    "plan": "device, train_processes, nodes, server (null or its node/port/device)",
    "step": "step, metrics (the trainer's logged scalars: reward, loss, kl, ...), max_steps",
    "checkpoint": "step, path (once the checkpoint is complete)",
    "stop_request": "reason",
    "init_from": "source (as the recipe gives it), path (the model directory it resolved to)",
    # vllm_nodes > 1 (launch/server_group.py): a server exited, and came back healthy
    "server_lost": "node, url, reason",
    "server_back": "node, url, after_s (seconds from lost to healthy again)",
    "outcome": "outcome, reason, code, step, requeue (the job a stopped attempt requeues)",
    # evaluations (maxent_grpo.rundir.ledger)
    "eval_submit": "step, checkpoint, benchmarks, job (the evaluation job queued)",
    "eval": "step, benchmark, score, metric, problems, samples, k, mean_reward, wall_s, job",
    "eval_skip": "step, checkpoint, benchmarks, reason (the checkpoint was gone), job",
    "eval_fail": "step, checkpoint, benchmarks, reason, job",
}
# Files up to this size are read whole; larger ones are mapped and searched (a long run logs
# a step event per logging step: megabytes of metrics between a handful of other events).
_READ_WHOLE_BYTES = 1024 * 1024


def events_path(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / EVENTS_FILE


def _line(event: str, fields: dict) -> str:
    return json.dumps({"time": round(time.time(), 3), "event": event, **fields}, default=str)


def _needle(event: str) -> bytes:
    """How `_line` writes an event's name: what a reader searches for."""
    return b'"event": ' + json.dumps(event).encode()


def emit(output_dir: str | os.PathLike, event: str, **fields) -> None:
    """Append one event to the run's log (creating output_dir if needed)."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}; add it to EVENTS")
    path = events_path(output_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (_line(event, fields) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            # A write cut short (a full disk) left a torn line: end it, or this event would
            # join it and be lost to every reader (found by bench/chaos.py, disk_full).
            data = b"\n" + data
        if os.write(fd, data) < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    finally:
        os.close(fd)


def _parse(line: str | bytes) -> dict | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and "event" in record else None


def read_events(output_dir: str | os.PathLike) -> Iterator[dict]:
    """Every event of a run, oldest first; a torn or foreign line is skipped."""
    path = events_path(output_dir)
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return
    for line in text.splitlines():
        if (record := _parse(line)) is not None:
            yield record


def _line_at(data, pos: int) -> tuple[int, bytes]:
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    return start, data[start : end if end >= 0 else len(data)]


def _sparse(data, last_steps: int) -> list[dict]:
    found: dict[int, bytes] = {}  # line start -> line: file order, no duplicates
    for event in EVENTS:
        needle = _needle(event)
        if event == "step":
            pos = len(data)
            for _ in range(last_steps):
                pos = data.rfind(needle, 0, pos)
                if pos < 0:
                    break
                pos, line = _line_at(data, pos)
                found[pos] = line
            continue
        pos = data.find(needle)
        while pos >= 0:
            start, line = _line_at(data, pos)
            found[start] = line
            pos = data.find(needle, start + len(line))
    records = (_parse(found[start]) for start in sorted(found))
    return [r for r in records if r is not None]


def read_sparse(output_dir: str | os.PathLike, last_steps: int = 4) -> list[dict]:
    """Every event except `step`, and the last `last_steps` step events, oldest first.

    What the runs table needs, without parsing the metrics of every logged step: the file is
    searched for the event names, so a long run's log costs a few memory scans.
    """
    try:
        with open(events_path(output_dir), "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size <= _READ_WHOLE_BYTES:
                return _sparse(file.read(), last_steps)
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _sparse(data, last_steps)
    except (FileNotFoundError, NotADirectoryError):
        return []
