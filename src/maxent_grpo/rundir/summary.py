"""The one line a run ends with: steps, the headline metric first -> last, checkpoint, time.

    summary: 8 steps, reward 0.125 -> 0.750, checkpoint outputs/r/checkpoint-8, 1m35s

Pure: read from the run's events (rundir/events.py) by the launcher when the run completes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

# What a run is judged by, in order: GRPO's mean reward, else SFT's training loss.
METRICS = ("reward", "loss")


def _duration(seconds: float) -> str:
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _series(events: Sequence[dict], metric: str) -> list[float]:
    values = []
    for event in events:
        value = (event.get("metrics") or {}).get(metric) if event.get("event") == "step" else None
        if isinstance(value, (int, float)) and not math.isnan(value):
            values.append(float(value))
    return values


def run_summary(events: Sequence[dict], checkpoint: str | Path | None) -> str:
    """The line, from the run's events (every attempt: time from its first event to its last)
    and the checkpoint it ends with (None: none saved)."""
    steps = [
        e["step"] for e in events if e.get("event") == "step" and isinstance(e.get("step"), int)
    ]
    parts = [f"{max(steps)} steps" if steps else "no step logged"]
    for metric in METRICS:
        values = _series(events, metric)
        if values:
            parts.append(f"{metric} {values[0]:.3f} -> {values[-1]:.3f}")
            break
    parts.append(f"checkpoint {checkpoint}" if checkpoint else "no checkpoint")
    times = [e["time"] for e in events if isinstance(e.get("time"), (int, float))]
    if times:
        parts.append(_duration(max(times) - min(times)))
    return "summary: " + ", ".join(parts)
