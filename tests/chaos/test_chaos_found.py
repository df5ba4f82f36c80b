"""What the chaos campaign found, each fixed and kept fixed (pure: files and logs written
here). Each test fails with the code before its fix; the seed that found it is named."""

from __future__ import annotations

from maxent_grpo.launch.outcomes import classify
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


def test_an_event_after_a_torn_line_is_not_lost(tmp_path):
    """Seed 1155794471: a write cut short by the full disk left half a line; the next
    attempt's attempt_start joined it and no reader saw that attempt begin."""
    emit(tmp_path, "stop_request", reason="first")
    with open(events_path(tmp_path), "a") as handle:
        handle.write('{"time": 1, "event": "outcome", "outc')  # the disk filled here
    emit(tmp_path, "attempt_start", method="grpo", recipe="r", job=None, attempt=2, host="h")
    assert [e["event"] for e in read_events(tmp_path)] == ["stop_request", "attempt_start"]
