"""The chaos campaign's invariants (bench/chaos.py), checked on what a trial left on disk.

Pure functions of facts the campaign collected: the run's event log split into attempts,
the trainer state, the checkpoints seen complete before the fault and before each recovery,
the processes left, the launcher's output. Each returns a list of violations (one line each);
an empty list is a pass. `check_trial` runs them all.

    facts = TrialFacts(out=..., max_steps=6, graceful=False, ...)
    problems = check_trial(facts)

Written to fail: tests/chaos/test_chaos_checks.py breaks runs on purpose (a resume that
skips a step, a partial checkpoint picked, an orphaned server) and sees each caught.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from maxent_grpo.rundir.checkpoints import list_checkpoints
from maxent_grpo.rundir.events import read_events


def file_digest(path: Path) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def complete_files(out: Path, skip: Sequence[str] = ()) -> dict[str, str]:
    """Every file of every complete checkpoint (its marker written) and of a completed run's
    final model, relative to `out`, with its digest: what no later fault may change."""
    found = {}
    for checkpoint in list_checkpoints(out):
        if not checkpoint.complete or checkpoint.path.name in skip:
            continue
        for path in sorted(checkpoint.path.rglob("*")):
            if path.is_file():
                found[str(path.relative_to(out))] = file_digest(path)
    return found


# What a complete checkpoint of a full (not LoRA) run holds, besides the marker.
CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json")


def file_intact(path: Path) -> bool:
    """The file is all there: a safetensors file as long as its header says, a torch zip
    archive whose members all read back, JSON that parses. The checker's own judgement,
    independent of the product's marker."""
    import zipfile

    try:
        if path.suffix == ".safetensors":
            with open(path, "rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                header = json.loads(handle.read(size))
            ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
            return path.stat().st_size == 8 + size + max(ends, default=0)
        if path.suffix in (".pt", ".pth", ".bin"):
            with zipfile.ZipFile(path) as archive:
                return archive.testzip() is None
        if path.suffix == ".json":
            json.loads(path.read_text())
        return True
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return False


def intact_steps(out: Path) -> list[int]:
    """Steps of the checkpoints a resume may pick: marked complete, and every file there and
    whole by the checker's own reading."""
    steps = []
    for checkpoint in list_checkpoints(out):
        files = [checkpoint.path / name for name in CHECKPOINT_FILES]
        if checkpoint.complete and all(f.is_file() and file_intact(f) for f in files):
            steps.append(checkpoint.step)
    return steps


RESUMED = re.compile(r"Resuming from (\S+)")  # the trainers' line (train/entry.py)


def resumed_from(folder: Path, before: set[Path]) -> str:
    """The checkpoint an attempt's train logs (those not in `before`) say it resumed from,
    '' for none: seen also when the attempt then failed before its first step."""
    new = set(folder.glob("logs/*_train.log")) - before
    return next(iter(RESUMED.findall("".join(p.read_text(errors="replace") for p in new))), "")


def same_weights(out: Path, reference: Path) -> bool:
    from safetensors.torch import load_file

    mine, theirs = load_file(str(out / "model.safetensors")), load_file(str(reference))
    return mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)


def attempts(out: Path) -> list[list[dict]]:
    """The run's events, one list per attempt (each starts at an attempt_start event)."""
    split: list[list[dict]] = []
    for event in read_events(out):
        if event["event"] == "attempt_start" or not split:
            split.append([])
        split[-1].append(event)
    return split


def attempt_steps(events: list[dict]) -> list[int]:
    """Steps an attempt logged, the end-of-training summary's repeat of the last left out."""
    steps = [int(e["step"]) for e in events if e["event"] == "step"]
    return [s for i, s in enumerate(steps) if i == 0 or s != steps[i - 1]]


def outcome_of(events: list[dict]) -> str | None:
    found = [e["outcome"] for e in events if e["event"] == "outcome"]
    return found[-1] if found else None


@dataclass
class TrialFacts:
    out: Path
    max_steps: int
    # the fault let the run save at a step boundary first (a SIGTERM, a stop): nothing redone
    graceful: bool = False
    # attempt index of the faulted attempt in attempts(out) (the ones after it recover)
    faulted: int = 0
    # complete checkpoint files (complete_files) when the fault came, and after recovery
    files_before: dict[str, str] = field(default_factory=dict)
    files_after: dict[str, str] = field(default_factory=dict)
    # the newest checkpoint a resume may pick, seen before each recovery attempt (None: none)
    resumable: list[int | None] = field(default_factory=list)
    # what the recovery attempts' train logs said they resumed from (the "Resuming from" path)
    resumed_logs: list[str] = field(default_factory=list)
    expected_outcomes: tuple[str | None, ...] = ("crash",)
    left_processes: list[str] = field(default_factory=list)
    # the final model's weights equal the uninterrupted run's (None: not compared)
    weights_equal: bool | None = None
    # a full disk: the launcher's and the trainers' output, the filesystem's path
    disk_path: str | None = None
    disk_output: str = ""
    # the class the faulted attempt's launcher printed (when a full disk kept it from the log)
    printed_outcome: str | None = None
    completed: bool = True
    # when the faulted attempt's launcher (a SIGKILL) or its Slurm job was seen ended (epoch
    # s), and the last step its trainers may still end after that (a stop's step)
    ended_at: float | None = None
    last_step_after_end: int = 0
    # a SIGKILLed launcher mid-run: whether its trainers said they got the SIGTERM of its
    # death ("SIGTERM received by rank"; None: not asked)
    stop_heard: bool | None = None


def check_steps(facts: TrialFacts) -> list[str]:
    """Every step logged once per attempt, all of 1..max_steps in the union, each once in the
    final trainer state; only the steps a resume had to redo are repeated."""
    problems, runs = [], attempts(facts.out)
    wanted = list(range(1, facts.max_steps + 1))
    seen: set[int] = set()
    for index, events in enumerate(runs):
        steps = attempt_steps(events)
        if steps != sorted(set(steps)):
            problems.append(f"attempt {index + 1} logged steps out of order or twice: {steps}")
        seen.update(steps)
    lost = sorted(set(wanted) - seen)
    if facts.completed and lost:
        problems.append(f"steps never logged by any attempt (lost): {lost}")
    state = facts.out / "trainer_state.json"
    if facts.completed and state.is_file():
        history = json.loads(state.read_text())["log_history"]
        logged = [int(e["step"]) for e in history if "loss" in e]
        if logged != wanted:
            problems.append(f"trainer_state.json logs steps {logged}, not each of {wanted} once")
    elif facts.completed:
        problems.append("no trainer_state.json beside the final model")
    return problems


def redone_steps(facts: TrialFacts) -> list[int]:
    """Per recovery attempt, how many steps it did again that an earlier attempt had done."""
    runs, done, redone = attempts(facts.out), set(), []
    for index, events in enumerate(runs):
        steps = attempt_steps(events)
        if index > facts.faulted:
            redone.append(len([s for s in steps if s in done]))
        done.update(steps)
    return redone


def check_resumes(facts: TrialFacts) -> list[str]:
    """Each recovery attempt resumed from the newest checkpoint that was complete before it
    (never an incomplete one, never an older one), and redid nothing after a graceful stop."""
    problems, runs = [], attempts(facts.out)
    for offset, events in enumerate(runs[facts.faulted + 1 :]):
        steps = attempt_steps(events)
        if offset >= len(facts.resumable) or not steps:
            continue  # nothing left to train (the run was complete), or not watched
        newest = facts.resumable[offset] or 0
        start = steps[0] - 1
        if start > newest:
            problems.append(
                f"recovery attempt {offset + 1} started after step {start}, past the newest "
                f"complete checkpoint ({newest}): it resumed from a partial checkpoint or "
                "skipped steps"
            )
        elif start < newest:
            problems.append(
                f"recovery attempt {offset + 1} started after step {start}, not from the newest "
                f"complete checkpoint-{newest}: steps {start + 1}..{newest} done again"
            )
    for offset, log in enumerate(facts.resumed_logs):
        if log and offset < len(facts.resumable):
            step = int(log.rsplit("-", 1)[1])
            if step != (facts.resumable[offset] or 0):
                problems.append(f"recovery attempt {offset + 1} resumed from {log}")
    if facts.graceful and any(redone_steps(facts)):
        problems.append(f"a graceful stop, yet steps were done again: {redone_steps(facts)}")
    return problems


def check_after_end(facts: TrialFacts) -> list[str]:
    """Once the faulted attempt's launcher or job has ended, its trainers may finish the step
    a stop asks them to end at, no more: they do not train on outside it (seeds 3242996796,
    2909567359, 3843838547: a SIGKILLed launcher's one rank trained to the run's end)."""
    runs = attempts(facts.out)
    if facts.stop_heard is False:
        return ["the trainers never heard their launcher's death (no 'SIGTERM received by rank')"]
    if facts.ended_at is None or facts.faulted >= len(runs):
        return []
    events = runs[facts.faulted]
    after = [
        int(e["step"]) for e in events if e["event"] == "step" and e.get("time", 0) > facts.ended_at
    ]
    late = sorted({s for s in after if s > facts.last_step_after_end})
    if late:
        return [
            f"steps {late} done after the attempt's launcher or job had ended (outside it; "
            f"a stop's step {facts.last_step_after_end} at most)"
        ]
    return []


def check_outputs(facts: TrialFacts) -> list[str]:
    """Nothing that was complete when the fault came was changed (rotation may delete it)."""
    changed = [
        name
        for name, digest in facts.files_before.items()
        if name in facts.files_after and facts.files_after[name] != digest
    ]
    return [f"complete file changed after the fault: {name}" for name in changed]


def check_outcome(facts: TrialFacts) -> list[str]:
    runs = attempts(facts.out)
    got = outcome_of(runs[facts.faulted]) if facts.faulted < len(runs) else None
    if got is None and facts.disk_path is not None:
        got = facts.printed_outcome
    if got not in facts.expected_outcomes:
        return [f"faulted attempt's outcome {got!r}, expected one of {facts.expected_outcomes}"]
    if facts.completed and len(runs) > facts.faulted + 1 and outcome_of(runs[-1]) != "completed":
        return [f"the last attempt's outcome is {outcome_of(runs[-1])!r}, not 'completed'"]
    return []


def check_disk(facts: TrialFacts) -> list[str]:
    """A full filesystem: one line names the path and says it is full; the last checkpoint
    that was complete before it is still there and complete."""
    if facts.disk_path is None:
        return []
    problems, runs = [], attempts(facts.out)
    if runs and outcome_of(runs[facts.faulted]) == "completed":
        return []  # nothing more was written after the disk filled: nothing to say
    lines = [
        line
        for line in facts.disk_output.splitlines()
        if line.startswith("crash: ") and facts.disk_path in line and "No space left" in line
    ]
    if not lines:
        problems.append(f"no 'crash: ' line names the full filesystem {facts.disk_path}")
    # The newest checkpoint complete before the fault is the one the first rerun found whole
    # (later, rotation may delete it: that is no loss).
    before = [int(name.split("/")[0].split("-")[1]) for name in facts.files_before]
    if before and facts.resumable[:1] != [max(before)]:
        problems.append(f"checkpoint-{max(before)}, the last good checkpoint, was not kept")
    return problems


OUTCOME_LINE = re.compile(r"^(?:(model): |(stopped) \(|(\w+): )")


def printed_outcome(launcher_output: str) -> str | None:
    """The class of the launcher's last outcome line (`crash: ...`, `stopped (...)`,
    `model: ...` for a completed run)."""
    found = None
    for line in launcher_output.splitlines():
        match = OUTCOME_LINE.match(line)
        if match and (match.group(3) in CLASSES or match.group(1) or match.group(2)):
            found = "completed" if match.group(1) else match.group(2) or match.group(3)
    return found


CLASSES = ("crash", "hang", "oom", "user_error", "node_failure", "reward_server_lost")


def check_trial(facts: TrialFacts) -> list[str]:
    problems = []
    checks = (check_steps, check_resumes, check_outputs, check_outcome, check_disk)
    for check in (*checks, check_after_end):
        problems += check(facts)
    if facts.left_processes:
        problems.append(f"processes left (orphans): {facts.left_processes[:3]}")
    if facts.weights_equal is False:
        problems.append("final weights differ from the uninterrupted seeded run's")
    if not facts.completed:
        problems.append("the run did not complete after recovery")
    return problems
