"""Proof that an attempt resumed from a checkpoint rather than starting again (imported as
`helpers.resume`).

CPU training here is deterministic: a "resume" that ignored the checkpoint and trained from
step 0 would log the same numbers. What tells them apart is which steps the attempt ran, read
from the `step` events the trainer appends to events.jsonl (one per logged step):

    before = event_count(out)                     # before the attempt that should resume
    ... run it ...
    assert_resumed_from(out, before, checkpoint=3, max_steps=6, log=proc.stderr)

A fresh start would log steps 1..max_steps again (its first step would be 1, not 4).
"""

from __future__ import annotations

from pathlib import Path

from maxent_grpo.rundir.checkpoints import mark_checkpoint_complete
from maxent_grpo.rundir.events import read_events


def mark_tampered(checkpoint: Path) -> None:
    """A checkpoint a test rewrote on purpose, marked complete again: the marker records each
    file's size, and a file changed after it makes the checkpoint damaged (rundir/
    checkpoints.py), which a resume passes over."""
    mark_checkpoint_complete(checkpoint, int(checkpoint.name.rsplit("-", 1)[1]))


def event_count(output_dir: Path) -> int:
    """How many events the run has logged so far (the next attempt's events come after)."""
    return sum(1 for _ in read_events(output_dir))


def attempt_steps(output_dir: Path, since: int) -> list[int]:
    """The steps logged by what ran after the first `since` events, in order, without the
    repeated last step of the end-of-training summary log."""
    events = list(read_events(output_dir))[since:]
    steps = [int(e["step"]) for e in events if e["event"] == "step"]
    return [s for i, s in enumerate(steps) if i == 0 or s != steps[i - 1]]


def assert_resumed_from(
    output_dir: Path, since: int, checkpoint: int, max_steps: int, log: str | None = None
) -> list[int]:
    """The attempt after the first `since` events started at `checkpoint` (0: from scratch):
    it logged exactly steps checkpoint+1 .. max_steps (logging_steps 1), and, when its log is
    given, said which checkpoint it resumed from. Returns those steps."""
    steps = attempt_steps(output_dir, since)
    expected = list(range(checkpoint + 1, max_steps + 1))
    assert steps == expected, (
        f"the attempt should have resumed from checkpoint-{checkpoint} and run steps "
        f"{expected}; it logged steps {steps}"
    )
    if log is not None:
        wanted = f"Resuming from {Path(output_dir) / f'checkpoint-{checkpoint}'}"
        if checkpoint:
            assert wanted in log, f"no '{wanted}' in the attempt's log:\n{log[-2000:]}"
        else:
            assert "Resuming from" not in log, log[-2000:]
    return steps


def saved_ahead(piece: dict) -> list[tuple[int, int, list | None]]:
    """A checkpoint's async_generation piece (train/async_generation.py `_state`): per step
    generated ahead, (step, policy version pushed before it, its completions' token ids, or
    None on a process other than the main one)."""
    return [
        (
            item["step"],
            item["version"],
            None
            if item["groups"] is None
            else [s["tokens"] for g in item["groups"] for s in g["samples"]],
        )
        for item in piece["items"]
    ]
