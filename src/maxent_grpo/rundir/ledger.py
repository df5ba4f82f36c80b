"""What the event log says about evaluations: which checkpoints are due, which are handled.

Pure functions over the run's events (rundir/events.py); cheap to import (no torch, no TRL),
so `maxent-grpo runs` and `plot` use them too. The events of an evaluation:

- `eval_submit`: an evaluation job was queued for a step's checkpoint (`job`, `benchmarks`);
- `eval`: one benchmark's score at one step;
- `eval_skip`: the checkpoint was gone (save_total_limit) before its evaluation started;
- `eval_fail`: the evaluation could not be queued or failed (`reason`).

A requeued training job reads them before queueing anything, and an evaluation job before
scoring: a checkpoint is evaluated once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

EVAL_EVENTS = ("eval_submit", "eval", "eval_skip", "eval_fail")


def checkpoint_steps(events: Iterable[dict]) -> list[int]:
    """The steps of the run's complete checkpoints, oldest first, each once."""
    steps = {
        e["step"] for e in events if e["event"] == "checkpoint" and isinstance(e.get("step"), int)
    }
    return sorted(steps)


def due_steps(events: Iterable[dict], every: int) -> list[int]:
    """The checkpoints to evaluate: every `every`-th saved one (none when every is 0)."""
    if every < 1:
        return []
    return checkpoint_steps(events)[every - 1 :: every]


def _names(event: dict) -> list[str]:
    if "benchmark" in event:
        return [event["benchmark"]]
    return list(event.get("benchmarks") or [])


def handled(events: Iterable[dict], kinds: Sequence[str] = EVAL_EVENTS) -> dict[int, set[str]]:
    """step -> the benchmarks for which an event of `kinds` was written at that step."""
    done: dict[int, set[str]] = {}
    for event in events:
        if event["event"] in kinds and isinstance(event.get("step"), int):
            done.setdefault(event["step"], set()).update(_names(event))
    return done


def missing(
    events: Iterable[dict], step: int, names: Sequence[str], kinds: Sequence[str] = EVAL_EVENTS
) -> list[str]:
    """The benchmarks of `names` with no event of `kinds` at `step`, in order."""
    done = handled(events, kinds).get(step, set())
    return [name for name in names if name not in done]


def score_series(events: Iterable[dict]) -> dict[str, list[tuple[int, float]]]:
    """benchmark -> [(step, score)], by step; a step scored twice keeps its latest score."""
    latest: dict[str, dict[int, float]] = {}
    for event in events:
        score, step = event.get("score"), event.get("step")
        if event["event"] == "eval" and isinstance(score, (int, float)) and isinstance(step, int):
            latest.setdefault(str(event.get("benchmark")), {})[step] = float(score)
    return {name: sorted(points.items()) for name, points in latest.items()}


def latest_scores(events: Iterable[dict]) -> dict[str, tuple[int, float]]:
    """benchmark -> (step, score) of its newest step."""
    return {name: points[-1] for name, points in score_series(events).items() if points}


def pending(events: Iterable[dict]) -> int:
    """Benchmark evaluations queued and not yet scored, skipped or failed."""
    events = list(events)
    submitted = handled(events, ("eval_submit",))
    finished = handled(events, ("eval", "eval_skip", "eval_fail"))
    return sum(len(names - finished.get(step, set())) for step, names in submitted.items())
