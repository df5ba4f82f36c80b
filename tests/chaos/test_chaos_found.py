"""What the chaos campaign found, each fixed and kept fixed (pure: files and logs written
here). Each test fails with the code before its fix; the seed that found it is named."""

from __future__ import annotations

from maxent_grpo.launch.outcomes import classify, filesystem_full, full_disk
from maxent_grpo.launch.watch import Watched
from maxent_grpo.rundir.checkpoints import mark_checkpoint_complete
from maxent_grpo.rundir.events import emit, events_path, read_events

TORCHRUN_TAIL = """
[rank0]: RuntimeError: Connection closed by peer [127.0.0.1]:4844.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 2499
torch.distributed.elastic.multiprocessing.api.SignalException: Process 2106 got signal: 15
"""


def test_ranks_killed_under_torchrun_are_a_crash_not_a_stop(tmp_path):
    """Seed 903915971: both ranks SIGKILLed (a node dying mid-write); torchrun's SIGTERM to
    the group left the trainers' stop record, and the attempt read 'stopped'."""
    log = tmp_path / "train.log"
    log.write_text(TORCHRUN_TAIL)
    trainers_stop = ("SIGTERM received by the training processes", None, None, 0)
    found = classify(tmp_path, Watched(-9), trainers_stop, None, log)
    assert (found.kind, found.reason) == (
        "crash",
        "a training process was killed by SIGKILL (pid 2499)",
    )
    # Without a killed rank the trainers' record is still a stop, and a signal of ours wins.
    log.write_text("SIGTERM received by rank 0: checkpointing at the next step boundary\n")
    assert classify(tmp_path, Watched(85), trainers_stop, None, log).kind == "stopped"
    log.write_text(TORCHRUN_TAIL)
    ours = ("SIGTERM received", "SIGTERM", None, 0)
    assert classify(tmp_path, Watched(85), ours, None, log).kind == "stopped"


def test_a_full_disk_is_one_line_naming_the_path_and_the_resume_point(tmp_path):
    """Seed 1155794471: the line was 'OSError: [Errno 28] No space left on device'."""
    out = tmp_path / "out"
    (out / "checkpoint-4").mkdir(parents=True)
    mark_checkpoint_complete(out / "checkpoint-4", 4)
    log = tmp_path / "train.log"
    log.write_text(
        "Traceback (most recent call last):\nOSError: [Errno 28] No space left on device\n"
    )
    found = classify(out, Watched(1), None, None, log)
    assert found.kind == "crash" and "\n" not in found.reason
    assert found.reason == (
        f"OSError: [Errno 28] No space left on device: the filesystem of {out} is full or over "
        f"its quota; make room and run the same command again: it resumes from "
        f"{out / 'checkpoint-4'}"
    )


TORCH_FULL = """[rank0]: RuntimeError: basic_ios::clear: iostream error
[rank0]: RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0
"""


def test_a_full_disk_is_named_when_torch_does_not_say_so(tmp_path):
    """Seed 1775321084: two ranks' torch.save on a full disk said only 'unexpected pos 64 vs
    0'; the filesystem is full when the crash is classified, and that is what the line says."""
    out, log = tmp_path / "out", tmp_path / "train.log"
    out.mkdir()
    log.write_text(TORCH_FULL)
    plain = classify(out, Watched(1), None, None, log)
    assert (
        plain.reason
        == "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"
    )
    assert not filesystem_full(out)  # this test's own filesystem has room
    found = full_disk(plain, out, is_full=lambda path: path == out)
    assert found.kind == "crash" and found.reason == (
        f"{plain.reason} (No space left on device: the filesystem is full after the crash): the "
        f"filesystem of {out} is full or over its quota; make room and run the same command "
        "again: it starts again (no checkpoint)"
    )
    assert full_disk(plain, out, is_full=lambda path: False) == plain


def test_output_dir_not_writable_for_lack_of_space_is_a_crash_not_a_user_error(tmp_path):
    """Seed 1476428528: the disk filled while the reward server started; the trainers' check
    of output_dir said 'not writable (No space left on device); choose another directory', a
    permanent user_error: the same command never ran again, though it works once there is
    room."""
    out, log = tmp_path / "out", tmp_path / "train.log"
    check = f"output_dir: '{out}' is not writable (No space left on device)"
    log.write_text(f"error: recipe.yaml: {check}; choose another directory\n")
    found = classify(out, Watched(1), None, None, log)
    assert (found.kind, found.code, found.permanent) == ("crash", 1, False)
    assert found.reason == (
        f"recipe.yaml: {check}: the filesystem of {out} is full or over its quota; make room "
        "and run the same command again: it starts again (no checkpoint)"
    )
    log.write_text(f"error: recipe.yaml: output_dir: '{out}' is not writable (Permission denied)\n")
    assert classify(out, Watched(1), None, None, log).kind == "user_error"  # the recipe's to fix


def test_an_event_after_a_torn_line_is_not_lost(tmp_path):
    """Seed 1155794471: a write cut short by the full disk left half a line; the next
    attempt's attempt_start joined it and no reader saw that attempt begin."""
    emit(tmp_path, "stop_request", reason="first")
    with open(events_path(tmp_path), "a") as handle:
        handle.write('{"time": 1, "event": "outcome", "outc')  # the disk filled here
    emit(tmp_path, "attempt_start", method="grpo", recipe="r", job=None, attempt=2, host="h")
    assert [e["event"] for e in read_events(tmp_path)] == ["stop_request", "attempt_start"]
