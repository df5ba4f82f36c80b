"""A run's logged history: its `step` events (or, for a run without them, the trainer state's
log_history), with benchmark scores beside them, and the one number a run is judged by.

Shared by `maxent-grpo plot` (runs/plot.py, runs/overlay.py) and the sweep table
(runs/compare.py). No matplotlib here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.rundir.events import events_path
from maxent_grpo.rundir.ledger import score_series
from maxent_grpo.runs.sources import read_output_dir

EVAL_PREFIX = "eval/"  # a benchmark's score in the history: eval/<benchmark>
# What a run is judged by, first found wins: GRPO and MaxEnt log a mean reward (higher is
# better); a run without one (SFT: TRL's SFTTrainer logs loss and mean_token_accuracy) is
# judged by its training loss (lower is better).
HEADLINES = (("reward", max), ("loss", min))


def history_from_events(events: Sequence[dict]) -> list[dict]:
    """The step events as log_history entries ({**metrics, "step": N}), oldest first.

    What an attempt logged after the checkpoint the next attempt resumed from is dropped (the
    resumed attempt logs those steps again), as in the trainer's own state; so is what a
    trainer restarted by hand logged past the step it started again at.
    """
    history: list[dict] = []
    checkpoint = 0
    for event in events:
        step = event.get("step")
        if event["event"] == "attempt_start":
            history = [entry for entry in history if entry["step"] <= checkpoint]
        elif not isinstance(step, int):
            continue
        elif event["event"] in ("checkpoint", "outcome"):
            checkpoint = max(checkpoint, step)
        elif event["event"] == "step":
            if history and step < history[-1]["step"]:
                history = [entry for entry in history if entry["step"] < step]
            history.append({**(event.get("metrics") or {}), "step": step})
    return history


def with_scores(history: Sequence[dict], events: Sequence[dict]) -> list[dict]:
    """The history with each benchmark's score (`eval` events, rundir/ledger.py) as
    `eval/<benchmark>` at its step: beside that step's metrics, or an entry of its own."""
    series = score_series(events)
    if not series:
        return list(history)
    entries = [dict(entry) for entry in history]
    by_step = {entry["step"]: entry for entry in entries if "step" in entry}
    for name, points in series.items():
        for step, score in points:
            if step not in by_step:
                by_step[step] = {"step": step}
                entries.append(by_step[step])
            by_step[step][EVAL_PREFIX + name] = score
    return sorted(entries, key=lambda entry: entry.get("step", 0))


def _state_history(output_dir: Path) -> tuple[list[dict], Path] | None:
    """The longest log_history of the run: its final trainer_state.json, else the newest
    complete checkpoint's (a run in progress is plotted up to its last checkpoint)."""
    out = read_output_dir(output_dir)
    candidates = [out.path / "trainer_state.json"]
    candidates += [
        out.path / f"checkpoint-{step}" / "trainer_state.json"
        for step, complete, _ in reversed(out.checkpoints)
        if complete
    ]
    best: tuple[int, list[dict], Path] | None = None
    for path in candidates:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        step = state.get("global_step") or 0
        if best is None or step > best[0]:
            best = (step, state.get("log_history") or [], path)
    return None if best is None else (best[1], best[2])


def load_history(output_dir: str | os.PathLike, events: Sequence[dict]) -> tuple[list[dict], Path]:
    """(history, its file): the step events, else (a run without them) the trainer state."""
    if history := history_from_events(events):
        return history, events_path(output_dir)
    found = _state_history(Path(output_dir))
    if found is None:
        raise UserError(
            f"{output_dir}: nothing to plot yet: no step events, no trainer_state.json "
            "and no complete checkpoint"
        )
    return found


def headline(history: Sequence[dict]) -> str | None:
    """The metric a run is judged by (HEADLINES), or None when it logged neither."""
    present = {key for entry in history for key in entry}
    return next((name for name, _ in HEADLINES if name in present), None)


@dataclass(frozen=True)
class Summary:
    """A run's headline metric: its last logged value and its best, each with its step."""

    metric: str
    final: tuple[int, float]
    best: tuple[int, float]


def summarize(history: Sequence[dict], metric: str | None = None) -> Summary | None:
    """The final and best value of `metric` (default: the history's headline); NaNs are
    skipped; None when the metric was never logged."""
    metric = metric or headline(history)
    pick = dict(HEADLINES).get(metric or "", max)
    values = [
        (int(e["step"]), float(e[metric]))
        for e in history
        if metric in e and isinstance(e[metric], (int, float)) and "step" in e
    ]
    values = [(step, value) for step, value in values if not math.isnan(value)]
    if not values:
        return None
    best = pick(values, key=lambda item: (item[1], -item[0]) if pick is max else (item[1], item[0]))
    return Summary(metric, values[-1], best)
