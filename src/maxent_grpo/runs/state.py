"""A run's state from its events, and what the disk adds when the events stop short.

Functions over the events (`rundir.events`) and a few facts found on disk
(`runs.sources`); the rules are in `decide_state` and in docs/runs.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from maxent_grpo.runs.sources import OutputDir, method_from_training_args

# An outcome class (launch/outcomes.py) -> the run's state; every other class (user_error,
# oom, hang, crash, node_failure, failed, and the classes later writers add) is a failure
# whose `reason` says why. Any class whose outcome names the job it requeued is requeued.
OUTCOME_STATES = {
    "completed": "completed",
    "stopped": "stopped",
    "preempted": "stopped",
    "time_limit": "stopped",
}
KILLED = "killed: no outcome and no live process (SIGKILL, out of memory, node lost?)"
NO_EVENTS = "no events (a run from before the event log, or started another way)"


@dataclass
class Attempt:
    """One attempt: its `attempt_start` (None for events written before any, e.g. by a trainer
    started by hand) and the events that followed it."""

    start: dict | None
    events: list[dict] = field(default_factory=list)

    def last(self, event: str) -> dict | None:
        return next((e for e in reversed(self.events) if e["event"] == event), None)

    @property
    def outcome(self) -> dict | None:
        return self.last("outcome")

    @property
    def job(self) -> str | None:
        job = (self.start or {}).get("job")
        return None if job in (None, "") else str(job)


def split_attempts(events: Sequence[dict]) -> list[Attempt]:
    """The events grouped by attempt, oldest first (empty without events)."""
    attempts: list[Attempt] = []
    for event in events:
        if event["event"] == "attempt_start":
            attempts.append(Attempt(event))
        elif not attempts:
            attempts.append(Attempt(None, [event]))
        else:
            attempts[-1].events.append(event)
    return attempts


def resume_points(events: Sequence[dict]) -> list[int]:
    """The step each attempt resumed from: the last complete checkpoint (a `checkpoint` event,
    or an outcome's `step`) written before its `attempt_start`; attempts that started from
    scratch are left out."""
    points, last = [], None
    for event in events:
        step = event.get("step")
        if event["event"] in ("checkpoint", "outcome") and isinstance(step, int):
            last = step if last is None else max(last, step)
        elif event["event"] == "attempt_start" and last:
            points.append(last)
    return points


def detect_method(
    marker: dict | None, attempt: Attempt | None, steps: Sequence[dict], out: OutputDir | None
) -> str | None:
    """Most reliable first: the completion marker, the launcher's attempt_start, the config
    class in training_args.bin (read only when needed), the metric names of the steps."""
    for found in ((marker or {}).get("method"), ((attempt and attempt.start) or {}).get("method")):
        if found:
            return str(found)
    if out is not None and (found := method_from_training_args(out)):
        return found
    keys = {key for step in steps for key in step.get("metrics") or {}}
    if any(key.startswith("maxent/") for key in keys):
        return "maxent"
    if "reward" in keys:
        return "grpo"
    return "sft" if "mean_token_accuracy" in keys else None  # TRL's SFTTrainer logs it


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}m"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def decide_state(
    *,
    marker: bool,
    attempt: Attempt | None,
    live: bool | None,
    age: float | None,
    active_within: float,
    stop_requested: bool,
) -> tuple[str, str]:
    """(state, detail) of a run, from its latest attempt. The rules, in order:

    1. completed: the completion marker is in the output directory.
    2. The latest attempt's `outcome` event: its class names the state (OUTCOME_STATES; any
       other class is failed) and its reason the detail; an attempt that requeued its job is
       requeued (a failure's class and reason come first in its detail).
    3. No outcome: running while a live process holds the attempt's train log (live=True),
       or, where that cannot be seen from here (a Slurm attempt on another node, no /proc:
       live=None), while its events or log were written within `active_within` seconds.
    4. Not running and no outcome: failed as killed (SIGKILL, out of memory and a lost node
       leave no outcome), unless there are no events at all (unknown) or no launcher attempt
       and the stop-request file is there (stopped).
    """
    if marker:
        return "completed", ""
    outcome = attempt.outcome if attempt is not None else None
    if outcome is not None:
        kind = str(outcome.get("outcome"))
        reason = " ".join(str(outcome.get("reason") or "").split())  # one line
        state = OUTCOME_STATES.get(kind, "failed")
        if state != "completed" and outcome.get("requeue"):
            why = f"{kind}: {reason}; " if state == "failed" else ""
            return "requeued", f"{why}requeueing {outcome['requeue']}"
        return state, reason or (kind if state == "failed" else "")
    if live or (live is None and age is not None and age <= active_within):
        detail = "" if live else f"last written {age_text(age)} ago"
        return "running", "stop requested" if stop_requested else detail
    if attempt is None or attempt.start is None:
        if stop_requested:
            return "stopped", "stop requested; no launcher attempt recorded an outcome"
        if attempt is None:
            return "unknown", NO_EVENTS
    return "failed", KILLED
