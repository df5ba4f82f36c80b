"""The hang watchdog with real processes: a training rank stopped with SIGSTOP (a rank that
makes no progress, as a wedged collective or a stuck file system would leave it).

The launcher must notice within hang_timeout + 30 s, put every rank's Python stacks into the
train log, stop every process, keep the last complete checkpoint and record a `hang` outcome.
(The same with a stopped vLLM server: tests/vllm_server/test_vllm_hang.py.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from helpers.launched import Launched, outcomes
from helpers.procs import wait_until_gone
from helpers.recipes import write_recipe
from maxent_grpo.rundir.checkpoints import last_complete_checkpoint
from maxent_grpo.rundir.heartbeat import heartbeat_dir

pytestmark = pytest.mark.integration

# Far above the longest silence of a healthy rank here (0.3 s between two heartbeats, the
# first generation included, on 2 loaded CPUs; until its first step ends a rank gets 300 s
# more, watchdog.WARMUP_S, so the stop comes after step 3): every second of it is waited out
# after the SIGSTOP.
HANG_TIMEOUT = 5


def rank_pid(output_dir: Path, rank: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    path = heartbeat_dir(output_dir) / f"rank-{rank}.json"
    while time.monotonic() < deadline:
        try:
            return int(json.loads(path.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise AssertionError(f"no heartbeat from rank {rank}")


def stop_rank_and_wait(run: Launched, out: Path, rank: int = 1) -> tuple[int, float]:
    """SIGSTOP one rank once training runs; returns (exit code, seconds until the exit)."""
    run.wait_for_step(out, 3)
    pid = rank_pid(out, rank)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        code = run.wait(timeout=HANG_TIMEOUT + 120)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)  # in case the launcher left it (the test then fails)
        except ProcessLookupError:
            pass
    return code, time.monotonic() - stopped


def assert_hang_reported(run: Launched, out: Path, ranks: int = 2) -> None:
    logs = run.logs()
    assert re.search(r"hang: no progress from rank \d for \d+s \(hang_timeout", logs), logs[-3000:]
    # faulthandler's dump of every thread of each rank, with the training loop in it.
    sections = re.split(r"stacks of rank (\d) \(pid \d+", logs)[1:]
    dumped = {int(rank): text for rank, text in zip(sections[::2], sections[1::2])}
    assert sorted(dumped) == list(range(ranks)), logs[-4000:]
    for text in dumped.values():
        assert "(most recent call first)" in text and "in _inner_training_loop" in text, text
    (outcome,) = outcomes(out)
    assert outcome["outcome"] == "hang" and outcome["reason"].startswith("no progress from rank")


def test_a_stopped_rank_is_a_hang_with_stacks_and_nothing_left(tmp_path, tiny_model):
    out = tmp_path / "out"
    path = write_recipe(
        tmp_path,
        model_name_or_path=str(tiny_model),
        dataset_num_rows=128,
        max_completion_length=12,
        max_steps=2000,
        save_steps=2,
        hang_timeout=HANG_TIMEOUT,
    )
    run = Launched(tmp_path, path)
    code, took = stop_rank_and_wait(run, out)
    print(f"\nMEASURED stopped rank -> launcher exit: {took:.1f}s (hang_timeout {HANG_TIMEOUT})")
    assert code == 1, run.text[-3000:]
    assert took <= HANG_TIMEOUT + 30, took
    assert_hang_reported(run, out)
    # The stopped rank is the one named, with what /proc says about it.
    (outcome,) = outcomes(out)
    assert outcome["reason"].startswith("no progress from rank 1 for "), outcome
    assert "process stopped (SIGSTOP?)" in outcome["reason"]
    assert last_complete_checkpoint(out) is not None
    left, _ = wait_until_gone(marker=str(tmp_path), timeout=20)
    assert not left, left


def test_training_sh_with_a_stopped_rank_exits_by_itself(tmp_path, tiny_model):
    """`bash training.sh --run-name x -- --hang_timeout N`, one rank stopped: it exits by itself
    within N + 30 s and its log names the hang."""
    name = f"hang-test-{uuid.uuid4().hex[:8]}"
    out = tmp_path / name  # the name marks every process of the run (wait_until_gone)
    args = ["bash", "training.sh", "--run-name", name, "--logs-dir", str(tmp_path / "logs")]
    args += ["--", "--output_dir", str(out)]
    args += ["--hang_timeout", str(HANG_TIMEOUT), "--max_steps", "2000"]
    args += ["--save_steps", "1000", "--model_name_or_path", str(tiny_model)]
    run = Launched(tmp_path, args=args)
    code, took = stop_rank_and_wait(run, out)
    took_text = f"{took:.1f}s (hang_timeout {HANG_TIMEOUT})"
    print(f"\nMEASURED training.sh, stopped rank -> exit: {took_text}")
    assert code != 0 and took <= HANG_TIMEOUT + 30, (code, took, run.text[-3000:])
    assert_hang_reported(run, out)
    left, _ = wait_until_gone(marker=name, timeout=20)
    assert not left, left
