"""The run's event log: machine-readable facts, one JSON object per line.

The launcher and the trainers append events to ``<output_dir>/events.jsonl``; `maxent-grpo runs`
and `plot` read them back. Human logs stay free-form: nothing parses them.

Each line has ``time`` (Unix seconds), ``event`` (a name from EVENTS) and the event's own
fields. Lines are written with one ``write`` on a file opened for appending, so writers on
several processes do not interleave within a line; a reader skips a torn last line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

EVENTS_FILE = "events.jsonl"

# name -> the fields it carries (documentation and a check for writers).
EVENTS = {
    "attempt_start": "method, recipe, job, attempt, host",
    "plan": "device, train_processes, nodes, server (null or its node/port/device)",
    "step": "step, metrics (the trainer's logged scalars: reward, loss, kl, ...)",
    "checkpoint": "step, path",
    "stop_request": "reason",
    "outcome": "outcome, reason, code, step",
}


def events_path(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / EVENTS_FILE


def emit(output_dir: str | os.PathLike, event: str, **fields) -> None:
    """Append one event to the run's log (creating output_dir if needed)."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}; add it to EVENTS")
    path = events_path(output_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": round(time.time(), 3), "event": event, **fields}, default=str)
    with open(path, "a") as file:
        file.write(line + "\n")


def read_events(output_dir: str | os.PathLike) -> Iterator[dict]:
    """Every event of a run, oldest first; a torn or foreign line is skipped."""
    path = events_path(output_dir)
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "event" in record:
            yield record
