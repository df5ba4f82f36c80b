"""The chaos campaign's invariant checker (helpers/chaos_checks.py) on runs broken on purpose.

Pure cases first (event logs written by hand: they run in `make test`); then real trials
(marker chaos, `make test-chaos`) whose recovery is broken between the fault and the rerun: a
resume that skips a step, a partial checkpoint picked, an orphaned server. Each must fail the
check that names it, and the same trial left alone must pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.chaos_checks import TrialFacts, check_trial, file_intact
from helpers.chaos_trial import Kind, Trial, run_trial
from maxent_grpo.rundir.checkpoints import CHECKPOINT_MARKER, mark_checkpoint_complete

CHAOS = pytest.mark.skipif(
    os.environ.get("MAXENT_GRPO_CHAOS_TESTS") != "1",
    reason="real chaos trials: make test-chaos (MAXENT_GRPO_CHAOS_TESTS=1; root)",
)


def events(out: Path, *attempts: tuple[list[int], str | None]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for steps, outcome in attempts:
        lines.append({"event": "attempt_start"})
        lines += [{"event": "step", "step": s} for s in steps]
        if outcome:
            lines.append({"event": "outcome", "outcome": outcome})
    (out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    history = sorted({s for steps, _ in attempts for s in steps})
    state = {"log_history": [{"step": s, "loss": 0.0} for s in history]}
    (out / "trainer_state.json").write_text(json.dumps(state))


def facts(out: Path, **keys) -> TrialFacts:
    return TrialFacts(out=out, max_steps=6, completed=True, **keys)


def test_a_sound_kill_and_resume_passes(tmp_path):
    events(tmp_path, ([1, 2, 3], "crash"), ([3, 4, 5, 6], "completed"))
    assert check_trial(facts(tmp_path, resumable=[2])) == []


def test_a_resume_that_skips_a_step_is_caught(tmp_path):
    events(tmp_path, ([1, 2, 3], "crash"), ([4, 5, 6], "completed"))
    problems = check_trial(facts(tmp_path, resumable=[2]))
    assert any("past the newest complete checkpoint (2)" in p for p in problems), problems


def test_a_lost_step_and_a_step_twice_in_the_state_are_caught(tmp_path):
    events(tmp_path, ([1, 2], "stopped"), ([4, 5, 6], "completed"))
    problems = check_trial(facts(tmp_path, resumable=[3], expected_outcomes=("stopped",)))
    assert "steps never logged by any attempt (lost): [3]" in problems, problems
    (tmp_path / "trainer_state.json").write_text(
        json.dumps({"log_history": [{"step": s, "loss": 0} for s in (1, 2, 2, 3, 4, 5, 6)]})
    )
    assert any("trainer_state.json logs steps" in p for p in check_trial(facts(tmp_path)))


def test_a_redo_after_a_graceful_stop_an_old_checkpoint_and_a_wrong_class_are_caught(tmp_path):
    events(tmp_path, ([1, 2, 3, 4], "crash"), ([3, 4, 5, 6], "completed"))
    problems = check_trial(facts(tmp_path, resumable=[4], graceful=True))
    assert any("not from the newest complete checkpoint-4" in p for p in problems), problems
    assert any("a graceful stop, yet steps were done again" in p for p in problems)
    wrong = check_trial(facts(tmp_path, resumable=[2], expected_outcomes=("hang",)))
    assert any("outcome 'crash', expected one of ('hang',)" in p for p in wrong), wrong


def test_steps_done_after_the_launcher_or_the_job_ended_are_caught(tmp_path):
    """Seeds 3242996796, 2909567359, 3843838547: a SIGKILLed launcher's one rank, outside its
    job, trained to the run's end; ending the step its stop asks for is right."""
    events(tmp_path, ([1, 2, 3, 4, 5, 6], None))
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    for line in lines:
        line["time"] = line.get("step", 0)  # step s ends at time s
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    killed = facts(tmp_path, expected_outcomes=(None,), ended_at=2.5, last_step_after_end=3)
    problems = check_trial(killed)
    assert any(p.startswith("steps [4, 5, 6] done after the attempt's launcher") for p in problems)
    killed.ended_at = 5.5  # killed during step 6, the stop's step
    killed.last_step_after_end = 6
    assert check_trial(killed) == []
    killed.stop_heard = False  # the trainers' logs never said they got the SIGTERM
    assert any("never heard their launcher's death" in p for p in check_trial(killed))


def test_corruption_orphans_weights_and_a_silent_full_disk_are_caught(tmp_path):
    events(tmp_path, ([1, 2], "crash"), ([3, 4, 5, 6], "completed"))
    found = facts(
        tmp_path,
        resumable=[2],
        files_before={"checkpoint-2/model.safetensors": "a"},
        files_after={"checkpoint-2/model.safetensors": "b"},
        left_processes=["123 [S] vllm serve"],
        weights_equal=False,
        disk_path="/mnt/x",
        disk_output="OSError: [Errno 28] No space left on device\n",
    )
    problems = check_trial(found)
    for words in ("complete file changed", "orphans", "final weights differ", "/mnt/x"):
        assert any(words in p for p in problems), (words, problems)


def test_the_checker_reads_a_truncated_file_as_not_whole(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(64)}, str(path))
    assert file_intact(path)
    os.truncate(path, path.stat().st_size - 10)
    assert not file_intact(path)


# --- real trials, broken on purpose ---------------------------------------------------------


def skip_a_step(out: Path) -> None:
    """Renumber the newest complete checkpoint one step on, marked again (sizes and all): the
    resume skips that step."""
    newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    step = int(newest.name.split("-")[1]) + 1
    state = json.loads((newest / "trainer_state.json").read_text())
    state["global_step"] = step
    (newest / "trainer_state.json").write_text(json.dumps(state))
    newest.rename(out / f"checkpoint-{step}")
    mark_checkpoint_complete(out / f"checkpoint-{step}", step)


def mark_the_partial(out: Path) -> None:
    """Give the checkpoint the kill left half written a marker: a partial one is picked."""
    for path in out.glob("checkpoint-*"):
        if not (path / CHECKPOINT_MARKER).exists():
            (path / CHECKPOINT_MARKER).write_text(json.dumps({"step": 4}))


def orphan_a_server(out: Path) -> None:
    """A process of the run's (its output_dir on its command line) that nothing stops."""
    # One process whose command line keeps the folder (bash -c would exec sleep, losing it).
    subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", f"server-of-{out}"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


BROKEN = [
    # steps 1-3 logged, checkpoint-2 renumbered 3: step 3 is never trained into the state
    ("scoring", 4, "sigkill_trainer", skip_a_step, "trainer_state.json logs steps [1, 2, 4"),
    # the resume from it may then fail before a step: its "Resuming from" line is the proof
    ("checkpoint_write", 4, "sigkill_trainer", mark_the_partial, "resumed from"),
    ("optimizer_step", 3, "sigkill_trainer", orphan_a_server, "orphans"),
]


@CHAOS
@pytest.mark.chaos
@pytest.mark.parametrize(
    "moment, step, fault, tamper, words", BROKEN, ids=[b[3].__name__ for b in BROKEN]
)
def test_a_real_trial_broken_on_purpose_fails_its_check(
    tmp_path, moment, step, fault, tamper, words
):
    trial = Trial(seed=5, kind=Kind("grpo", 1), moment=moment, step=step, fault=fault)
    row = run_trial(trial, tmp_path / "t", tamper=tamper)
    assert row["reached"] and row["applied"], row
    assert any(words in p for p in row["problems"]), row["problems"]
