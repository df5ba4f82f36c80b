"""`maxent-grpo runs --sweep NAME`: the points of a sweep side by side, one row each.

A row is a point's values, its state (a failed point with its failure class and reason, a
point still queued with Slurm's reason), its steps, its final and best headline metric (the
mean reward; the training loss for a run that logs no reward, e.g. SFT: runs/history.py), and
each benchmark's newest score. The headline numbers come from the point's whole history (every
`step` event, resumed attempts counted once; or its trainer state), so a sweep of a few dozen
points reads each event log once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.rundir.events import read_events
from maxent_grpo.rundir.sweeps import Point
from maxent_grpo.runs.history import HEADLINES, Summary, headline, load_history, summarize
from maxent_grpo.runs.table import REASON_CHARS, RunInfo, outcome_text

NOT_STARTED = "not queued and nothing written"


@dataclass
class PointRow:
    index: int
    point: Point
    info: RunInfo
    summary: Summary | None  # None: the sweep's headline metric not logged (yet)

    def to_dict(self, now: float | None = None) -> dict:
        """The run's row (`runs --json`) with the point's index, values and headline."""
        s = self.summary
        return {
            **self.info.to_dict(now),
            "index": self.index,
            "values": self.point.values,
            "metric": s.metric if s else None,
            "final": {"step": s.final[0], "value": s.final[1]} if s else None,
            "best": {"step": s.best[0], "value": s.best[1]} if s else None,
        }


def point_history(output_dir: str) -> list[dict]:
    """A point's logged history; empty for a point that has not logged a step."""
    if not Path(output_dir).is_dir():
        return []
    try:
        return load_history(output_dir, list(read_events(output_dir)))[0]
    except UserError:  # nothing logged yet
        return []


def point_rows(points: Sequence[Point], runs: Sequence[RunInfo]) -> list[PointRow]:
    """One row per point, in the sweep's order; every point judged by the same metric (the
    first of HEADLINES that any point logged)."""
    by_name = {run.run: run for run in runs}
    histories = [point_history(p.output_dir) for p in points]
    metric = next((m for m in map(headline, histories) if m), None)
    rows = []
    for index, (point, history) in enumerate(zip(points, histories, strict=True)):
        info = by_name.get(point.name) or RunInfo(
            run=point.name, state="not started", reason=NOT_STARTED
        )
        rows.append(PointRow(index, point, info, summarize(history, metric) if metric else None))
    return rows


def _number(value: float) -> str:
    return f"{value:.4g}"


def _cells(row: PointRow, keys: list[str], benchmarks: list[str], metric: str | None) -> list:
    info, s = row.info, row.summary
    step = "-" if info.step is None else str(info.step)
    if info.max_steps:
        step = f"{step}/{info.max_steps}"
    cells = [str(row.index), *(row.point.values.get(k, "-") for k in keys), info.state, step]
    if metric:
        cells += [_number(s.final[1]), f"{_number(s.best[1])}@{s.best[0]}"] if s else ["-", "-"]
    for name in benchmarks:
        score = info.evals.get(name)
        cells.append(f"{_number(score['score'])}@{score['step']}" if score else "-")
    detail = outcome_text(info)
    if len(detail) > REASON_CHARS:
        detail = detail[: REASON_CHARS - 3] + "..."
    return [*cells, detail]


def format_comparison(sweep: str, rows: Sequence[PointRow]) -> str:
    """The header line, then a plain-text table (no trailing spaces)."""
    keys = list(rows[0].point.values) if rows else []
    benchmarks = sorted({name for row in rows for name in row.info.evals})
    metric = next((row.summary.metric for row in rows if row.summary), None)
    head = ["#", *keys, "STATE", "STEP"]
    if metric:
        head += [metric.upper(), "BEST"]
    table = [head + benchmarks + ["DETAIL"]]
    table += [_cells(row, keys, benchmarks, metric) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(head) + len(benchmarks) + 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table]
    if metric:
        word = "highest" if dict(HEADLINES)[metric] is max else "lowest"
        note = f"{metric.upper()}: the last logged {metric}; BEST: the {word} @ its step"
    else:
        note = "no point has logged a step yet"
    return "\n".join([f"sweep {sweep}: {len(rows)} point(s); {note}", *lines])
