"""The rules behind the failure classes and the hang watchdog, as pure functions and small
real files (fast; the real processes are in test_failure_classes.py, test_hang_watchdog.py,
test_graceful_stop.py and tests/slurm/test_preemption_training.py)."""

from __future__ import annotations

import json
import os
import time

import pytest

from helpers.procs import LOADED_MARGIN
from maxent_grpo.launch.hang import AUTO_FLOOR_S, AUTO_STARTUP_S, WARMUP_S, limit_for
from maxent_grpo.launch.outcomes import (
    classify,
    crash_outcome,
    from_exit_reports,
    from_log,
    is_permanent,
    node_failed,
    stop_outcome,
)
from maxent_grpo.launch.watch import Watched
from maxent_grpo.launch.watchdog import Watchdog
from maxent_grpo.rundir.heartbeat import Heartbeat, exit_kind
from maxent_grpo.runs.state import Attempt, decide_state
from maxent_grpo.runs.table import RunInfo, detail_text


def test_stop_classes_from_the_signal_and_slurms_record_of_the_job():
    assert stop_outcome("SIGTERM received", "SIGTERM", None).kind == "stopped"  # not Slurm
    preempted = {"JobState": "RUNNING", "PreemptTime": "2026-11-24T08:00:00"}
    assert stop_outcome("SIGTERM received", "SIGTERM", preempted).kind == "preempted"
    running = {"JobState": "RUNNING", "PreemptTime": "None"}
    assert stop_outcome("SIGUSR1 received", "SIGUSR1", running).kind == "time_limit"
    assert stop_outcome("x", "SIGTERM", {"JobState": "TIMEOUT"}).kind == "time_limit"
    assert stop_outcome("x", "SIGTERM", {"JobState": "CANCELLED"}).kind == "stopped"
    assert stop_outcome("x", "SIGTERM", {"JobState": "NODE_FAIL"}).kind == "node_failure"
    assert stop_outcome("x", None, running).code == 85
    # The end of a preemption's grace time: Slurm requeues the job itself before our SIGTERM.
    ending = {"JobState": "COMPLETING", "Restarts": "1", "Reason": "None"}
    requeued = stop_outcome("SIGTERM received", "SIGTERM", ending, restarts=0)
    assert requeued.kind == "preempted" and requeued.requeued_by_slurm
    assert stop_outcome("x", "SIGTERM", ending, restarts=1).kind == "stopped"


def test_a_failed_node_is_seen_in_sruns_line_or_in_slurms_record_of_the_job():
    """What makes the launcher stop at once on Slurm's SIGTERM instead of waiting for a
    checkpoint that a rank without its peer cannot make (launch/attempt.py)."""
    running = {"JobState": "RUNNING", "Reason": "None"}
    assert node_failed("srun: error: Node failure on node2", running)
    assert node_failed("", {"JobState": "NODE_FAIL", "Reason": "None"})
    assert node_failed("", {"JobState": "PENDING", "Reason": "NodeDown"})
    assert not node_failed("step 11", running)
    assert not node_failed("step 11", None)  # not under Slurm


def test_a_node_failure_is_named_by_sruns_line_though_slurmstepds_comes_after(tmp_path):
    from maxent_grpo.launch.outcomes import classify
    from maxent_grpo.launch.watch import Watched

    log = tmp_path / "train.log"
    log.write_text(
        "srun: error: Node failure on node2\n"
        "slurmstepd-node1: error: *** STEP 4.0 ON node1 CANCELLED DUE TO NODE FAILURE ***\n"
    )
    found = classify(tmp_path, Watched(None), None, None, log)
    assert (found.kind, found.reason) == ("node_failure", "srun: error: Node failure on node2")


def test_the_same_crash_twice_is_permanent_whatever_the_numbers():
    first = crash_outcome("rank 1: RuntimeError: NCCL error at 0x7f00aa port 29500", None)
    assert first.kind == "crash" and not is_permanent(first) and first.code == 1
    previous = {"outcome": "crash", "reason": first.reason}
    again = crash_outcome("rank 0: RuntimeError: NCCL error at 0x7f11bb port 29512", previous)
    assert is_permanent(again) and again.reason.startswith("the same error twice: ")
    repeated = {"outcome": "crash", "reason": again.reason}
    third = crash_outcome(again.reason.removeprefix("the same error twice: "), repeated)
    assert is_permanent(third)  # still the same error: still permanent
    other = crash_outcome("rank 0: ValueError: bad data", previous)
    assert not is_permanent(other)


def test_a_vllm_server_lost_mid_run_is_a_crash_though_the_trainers_recorded_a_stop(tmp_path):
    """The launcher stops the trainers with SIGTERM once every vLLM server is gone, and they
    record that as a stop: without a signal to the launcher it is still the server's crash
    (transient, permanent when repeated), not `stopped`; a signal to us (preemption) wins."""
    line = "every vLLM server is lost: 127.0.0.1:8000 exited with code 1 after 1 restarts"
    watched = Watched(-15, server_died=f"{line}\n(its log's last lines)")
    trainers_stop = ("SIGTERM received by the training processes", None, None, 0)
    found = classify(tmp_path, watched, trainers_stop, None, tmp_path / "train.log")
    assert (found.kind, found.reason, found.code) == ("crash", line, 1)
    again = classify(tmp_path, watched, trainers_stop, {"outcome": "crash", "reason": line}, "x")
    assert is_permanent(again)
    preempted = ("SIGTERM received", "SIGTERM", None, 0)
    assert classify(tmp_path, watched, preempted, None, "x").kind == "stopped"


def test_classes_from_exit_reports_and_log_lines():
    oom = {"rank": 1, "kind": "oom", "type": "OutOfMemoryError", "message": "CUDA", "time": 2}
    crash = {"rank": 0, "kind": "error", "type": "RuntimeError", "message": "gloo", "time": 3}
    found = from_exit_reports([crash, oom], None)  # the earliest report is the cause
    assert found.kind == "oom" and "rank 1" in found.reason and is_permanent(found)
    assert from_exit_reports([], None) is None
    assert from_log("error: r.yaml: key 'lr': bad", 2, None).kind == "user_error"
    line = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert from_log(f"Traceback\n{line}\n", 1, None).kind == "oom"
    crashed = from_log("Traceback (most recent call last):\nKeyError: 'x'\n", 1, None)
    assert (crashed.kind, crashed.reason) == ("crash", "KeyError: 'x'")
    assert from_log("", -9, None).reason == "training killed by signal 9"


# What the first node's rank said when the test cluster's node2 was killed (gloo, CPU; NCCL
# says "remote process exited or there was a network error").
PEER_LOST = "[pair.cc:553] Connection closed by peer [10.1.0.2]:42650. This is typically caused"
SRUN_END = "srun: error: node1: task 0: Exited with exit code 1"


def _beat(rank: int, host: str) -> dict:
    return {"rank": rank, "host": host, "phase": "generate_done", "step": 15}


def test_a_rank_that_lost_its_peer_names_the_host_that_went_silent():
    lost = {"rank": 0, "host": "node1", "kind": "error", "type": "RuntimeError", "time": 3}
    lost["message"] = PEER_LOST
    beats = [_beat(0, "node1"), _beat(1, "node2.cluster.example"), _beat(2, "node2")]
    found = from_exit_reports([lost], None, beats, f"Traceback\n{SRUN_END}\n")
    assert found.kind == "node_failure" and not is_permanent(found), found
    assert found.reason.startswith("node2 went silent") and "rank 0: RuntimeError" in found.reason
    assert found.silent_hosts == ("node2",)  # what the launcher waits for Slurm to mark down
    # node2's tasks ended (a process was killed there, its node is alive): a crash of rank 0's
    killed = f"{SRUN_END}\nsrun: error: node2: tasks 1-2: Killed"
    assert from_exit_reports([lost], None, beats, killed).kind == "crash"
    # one host: the silent rank was a process, not a node
    assert from_exit_reports([lost], None, [_beat(0, "node1"), _beat(1, "node1")]).kind == "crash"
    # a rank's own error is its own, whoever else is silent
    own = {**lost, "message": "shape mismatch"}
    assert from_exit_reports([own], None, beats, SRUN_END).kind == "crash"


def test_classify_reads_the_node_failure_line_the_reports_and_the_heartbeats(tmp_path):
    from maxent_grpo.launch.outcomes import classify
    from maxent_grpo.launch.watch import Watched

    beats = tmp_path / ".heartbeat"
    beats.mkdir()
    report = {"rank": 0, "host": "node1", "kind": "error", "type": "RuntimeError", "time": 3}
    (beats / "rank-0.exit.json").write_text(json.dumps({**report, "message": PEER_LOST}))
    log = tmp_path / "train.log"
    log.write_text(f"step 3\n{SRUN_END}\n")
    assert classify(tmp_path, Watched(1), None, None, log).kind == "crash"  # nobody silent
    for rank, host in ((0, "node1"), (1, "node2")):
        (beats / f"rank-{rank}.json").write_text(json.dumps(_beat(rank, host)) + " " * 100)
    found = classify(tmp_path, Watched(1), None, None, log)
    assert found.kind == "node_failure" and found.reason.startswith("node2 went silent"), found
    # Slurm's own word for it outranks the ranks' errors
    log.write_text(f"step 3\nsrun: error: Node failure on node-2\n{SRUN_END}\n")
    found = classify(tmp_path, Watched(1), None, None, log)
    assert (found.kind, found.reason) == ("node_failure", "srun: error: Node failure on node-2")


def test_exit_kind_follows_the_cause_chain():
    import torch

    from maxent_grpo.errors import UserError

    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as exc:
            raise RuntimeError("step failed") from exc
    except RuntimeError as exc:
        assert exit_kind(exc) == "oom"
    assert exit_kind(UserError("x")) == "user_error"
    assert exit_kind(ValueError("x")) == "error"


def test_hang_limits():
    assert limit_for(60, "step_end", 500.0) == 60  # explicit: every phase after the first step
    assert limit_for(60, "save", 500.0) == 60
    # explicit, before the first step ends: the steady-state limit plus the warm-up allowance
    assert limit_for(60, None, 0.0) == 60 + WARMUP_S  # a process still importing
    assert limit_for(60, "generate", 0.0) == 60 + WARMUP_S  # the first generation compiles
    assert limit_for(None, None, 0.0) == AUTO_STARTUP_S
    assert limit_for(None, "saved", 10.0) == AUTO_STARTUP_S  # a big checkpoint takes long
    assert limit_for(None, "generate", 1.0) == AUTO_FLOOR_S  # the CPU smoke never trips it
    assert limit_for(None, "step_end", 300.0) == 1500.0  # 5 x the slowest step


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_explicit_hang_timeout_allows_the_first_step_its_warm_up(tmp_path):
    """CI: vLLM's CPU build compiled its first generation for longer than hang_timeout 15 and
    the watchdog called a hang at step 0. The first step gets WARMUP_S more; later steps not."""
    beat = Heartbeat(tmp_path, 0)
    clock = FakeClock()
    watchdog = Watchdog(tmp_path / ".heartbeat", 1, timeout=15, clock=clock)
    beat.beat("built", 0)
    beat.beat("generate", 0)  # then silent: compiling the first generation
    assert watchdog.poll() is None
    clock.now += 15 + WARMUP_S - 1
    assert watchdog.poll() is None
    clock.now += 2  # a first step silent past its allowance is still a hang
    hang = watchdog.poll()
    assert hang is not None and f"(hang_timeout {15 + WARMUP_S:g}s)" in hang.reason, hang

    beat.step_done(1)  # warmed up: the steady-state limit from here on
    watchdog = Watchdog(tmp_path / ".heartbeat", 1, timeout=15, clock=clock)
    beat.beat("generate", 1)
    assert watchdog.poll() is None
    clock.now += 16
    hang = watchdog.poll()
    assert hang is not None and "(hang_timeout 15s); last: generate at step 1" in hang.reason


def test_watchdog_names_the_rank_that_stopped_beating(tmp_path):
    beats = [Heartbeat(tmp_path, rank) for rank in range(2)]
    for beat in beats:
        beat.beat("train_begin", 0)
    # 3 s: each round of beats below takes ~0.2 s, and up to seconds on a loaded machine.
    watchdog = Watchdog(tmp_path / ".heartbeat", 2, timeout=3)
    for step in range(1, 4):  # both ranks progress
        for beat in beats:
            beat.step_done(step)
        assert watchdog.poll() is None
        time.sleep(0.2)
    deadline = time.monotonic() + 3 + LOADED_MARGIN
    hang = None
    while hang is None and time.monotonic() < deadline:
        beats[0].step_done(9)  # rank 0 goes on, rank 1 is silent
        hang = watchdog.poll()
        time.sleep(0.1)
    assert hang is not None and hang.reason.startswith("no progress from rank 1 for ")
    assert f"pid {os.getpid()}" in hang.reason and not hang.server
    assert sorted(hang.beats) == [0, 1]
    data = json.loads((tmp_path / ".heartbeat" / "rank-1.json").read_text())
    assert data["phase"] == "step_end" and data["step"] == 3 and data["slowest_step_s"] > 0


def test_a_shorter_beat_overwrites_a_longer_one_whole(tmp_path):
    # Beats rewrite the file in place (no rename): what is left must still be one JSON object.
    beat = Heartbeat(tmp_path, 0)
    beat.beat("x" * 700, 10**12)  # longer than the padding width
    beat.beat("built", 1)
    data = json.loads((tmp_path / ".heartbeat" / "rank-0.json").read_text())
    assert (data["phase"], data["step"], data["count"]) == ("built", 1, 2)


def test_a_server_that_does_not_answer_is_a_hang(tmp_path):
    # Nothing listens on this port: /health never answers.
    watchdog = Watchdog(tmp_path, 0, timeout=0.5, health_url="http://127.0.0.1:9/health")
    time.sleep(0.7)
    hang = watchdog.poll()
    assert hang is not None and hang.server
    assert hang.reason.startswith("the vLLM server did not answer http://127.0.0.1:9/health")


def test_runs_shows_class_reason_and_attempts_per_class():
    requeued = {"outcome": "hang", "reason": "no progress from rank 1", "requeue": "7"}
    state, detail = decide_state(
        marker=False,
        attempt=Attempt({"event": "attempt_start"}, [{"event": "outcome", **requeued}]),
        live=None,
        age=1.0,
        active_within=60,
        stop_requested=False,
    )
    assert (state, detail) == ("requeued", "hang: no progress from rank 1; requeueing 7")
    preempted = {"outcome": "preempted", "reason": "SIGTERM received", "requeue": None}
    state, detail = decide_state(
        marker=False,
        attempt=Attempt({"event": "attempt_start"}, [{"event": "outcome", **preempted}]),
        live=None,
        age=1.0,
        active_within=60,
        stop_requested=False,
    )
    assert (state, detail) == ("stopped", "SIGTERM received")
    run = RunInfo(run="r", reason=detail, outcome="preempted", attempts=3)
    run.outcomes = {"preempted": 2, "hang": 1}
    assert detail_text(run) == "preempted: SIGTERM received (attempts: 2 preempted, 1 hang)"


def test_after_a_node_loss_the_launcher_waits_for_slurm_to_requeue_within_its_timeout():
    from maxent_grpo.launch.slurm import node_down_wait_s, slurm_verdict

    # Slurm pings every SlurmdTimeout/3: one round and 30 s of messages beyond the timeout
    assert node_down_wait_s(300) == 430 and node_down_wait_s(20) == pytest.approx(56.67, 0.01)
    assert node_down_wait_s(0) == 0  # SlurmdTimeout=0: Slurm never marks a silent node down
    running = {"JobState": "RUNNING", "Restarts": "2"}
    assert slurm_verdict(running, 2) is None and slurm_verdict(None, 2) is None
    # what `scontrol show job` said once Slurm had marked node2 down (test cluster, 22.05)
    assert slurm_verdict({"JobState": "COMPLETING", "Restarts": "3"}, 2) == "requeued"
    assert slurm_verdict({"JobState": "PENDING", "Restarts": "3"}, 2) == "requeued"
    ended = slurm_verdict({"JobState": "CANCELLED", "Restarts": "2"}, 2)
    assert ended == "ended the job (CANCELLED)"  # scancel: never requeued behind the user


def test_an_scontrol_record_line_reads_as_a_dict():
    from maxent_grpo.launch.slurm import parse_record

    line = "JobId=12 JobName=training.sh JobState=RUNNING Reason=None Restarts=1 Comment=a=b x"
    record = parse_record(line)
    assert record["JobId"] == "12" and record["JobState"] == "RUNNING"
    assert record["Restarts"] == "1" and record["Comment"] == "a=b"  # split at the first '='
    assert "x" not in record


def test_crash_grace_comes_from_the_environment_or_one_clear_line():
    from maxent_grpo.errors import UserError
    from maxent_grpo.launch.watch import CRASH_GRACE_S, crash_grace_s

    assert crash_grace_s({}) == CRASH_GRACE_S == 30
    assert crash_grace_s({"MAXENT_GRPO_CRASH_GRACE_S": "7.5"}) == 7.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(UserError, match=f"MAXENT_GRPO_CRASH_GRACE_S='{bad}' is not a"):
            crash_grace_s({"MAXENT_GRPO_CRASH_GRACE_S": bad})


@pytest.mark.parametrize(
    "state, requeued", [("RUNNING", True), ("CANCELLED", False), ("COMPLETING", False)]
)
def test_a_stopped_job_is_requeued_unless_slurm_ended_it(monkeypatch, tmp_path, state, requeued):
    """A stop while the job runs (the stop file, a signal of the user's) requeues it; a
    scancel (Slurm marks the job CANCELLED before it signals) is the user's: not requeued."""
    import subprocess

    from maxent_grpo.launch import finish
    from maxent_grpo.launch.outcomes import Outcome
    from maxent_grpo.launch.slurm import SlurmJob
    from maxent_grpo.rundir.events import read_events

    asked = []
    monkeypatch.setattr(finish, "job_record", lambda job: {"JobState": state, "Restarts": "0"})
    monkeypatch.setattr(
        finish, "requeue", lambda job: asked.append(job) or subprocess.CompletedProcess([], 0)
    )
    ending = finish.Ending(SlurmJob("7", None, None, 0), tmp_path, True, lambda: None)
    ending._requeue(Outcome("stopped", "SIGTERM received", 85, False), max_requeues=3)
    assert bool(asked) == requeued and ending.requeued == requeued
    (outcome,) = [e for e in read_events(tmp_path) if e["event"] == "outcome"]
    assert outcome["requeue"] == ("7" if requeued else None)
