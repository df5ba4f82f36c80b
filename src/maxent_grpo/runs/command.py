"""`maxent-grpo runs`: the runs found on disk, the toolkit's jobs in the Slurm queue, and, with
`--sweep NAME`, the points of one sweep side by side (runs/compare.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.rundir.sweeps import POINTS_SUFFIX, Point, find_points, read_points
from maxent_grpo.runs.compare import PointRow, format_comparison, point_rows
from maxent_grpo.runs.queue import merge_queue, read_queue
from maxent_grpo.runs.table import ACTIVE_WITHIN_S, collect_runs, format_table

DEFAULT_DIRS = ("outputs", "logs")


def sweep_of(sweep: str, dirs: Sequence[str]) -> list[Point]:
    """The points of sweep NAME, from NAME.sweep.json in one of `dirs`."""
    path = find_points(sweep, list(dirs))
    if path is None:
        raise UserError(
            f"runs --sweep {sweep}: no {sweep}{POINTS_SUFFIX} under {', '.join(dirs)}; "
            "give --dir with the folder that holds the sweep's runs"
        )
    return read_points(path)[1]


def main(
    dirs: Sequence[str] | None = None,
    as_json: bool = False,
    active_within: float = ACTIVE_WITHIN_S,
    sweep: str | None = None,
) -> int:
    now = time.time()
    dirs = list(dirs or DEFAULT_DIRS)
    points = sweep_of(sweep, dirs) if sweep else None
    for parent in dict.fromkeys(str(Path(p.output_dir).parent) for p in points or []):
        if parent not in dirs:
            dirs.append(parent)  # the points' runs, wherever the sweep put them
    runs = collect_runs(dirs, now=now, active_within=active_within)
    jobs, note = read_queue()
    if note:
        print(note, file=sys.stderr)
    runs = merge_queue(runs, jobs)
    if points is not None:
        return _show_sweep(sweep, point_rows(points, runs), as_json, now)
    if as_json:
        print(json.dumps([r.to_dict(now) for r in runs], indent=2))
    elif not runs:
        print(f"no runs found under {', '.join(dirs)} and none queued")
    else:
        _print(format_table(runs, now))
    return 0


def _show_sweep(sweep: str, rows: list[PointRow], as_json: bool, now: float) -> int:
    """The points of one sweep, side by side (runs/compare.py)."""
    if as_json:
        print(json.dumps([row.to_dict(now) for row in rows], indent=2))
    else:
        _print(format_comparison(sweep, rows))
    return 0


def _print(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `maxent-grpo runs | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
