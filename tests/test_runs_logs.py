"""`maxent-grpo logs RUN` (runs/logs.py): the last attempt's logs by component, named as the
launcher names them (launch/attempt.py log_path, launch/server_group.py), the failure on top."""

from __future__ import annotations

import threading
import time

import pytest

from maxent_grpo import cli
from maxent_grpo.launch.attempt import log_path
from maxent_grpo.rundir.events import emit
from maxent_grpo.runs import logs


def _attempt(logs_dir, run, job, when, texts):
    """One attempt's log files, named by the launcher's own log_path at time `when`."""
    paths = {}
    stamp = time.struct_time(time.localtime(when))
    real = time.strftime
    try:
        time.strftime = lambda fmt, t=None: real(fmt, stamp)
        for component, text in texts.items():
            role, _, suffix = component.partition("-")
            path = log_path(logs_dir, run, role, {"SLURM_JOB_ID": job})
            if suffix:  # the server group's names: a suffix on the first server's log
                path = path.with_name(f"{path.stem}-{suffix}{path.suffix}")
            path.write_text(text)
            paths[component] = path
    finally:
        time.strftime = real
    return paths


@pytest.fixture
def run_dirs(tmp_path):
    out, logs_dir = tmp_path / "outputs", tmp_path / "logs"
    logs_dir.mkdir()
    _attempt(logs_dir, "r1", "7", 1_700_000_000, {"train": "old attempt\n", "vllm": "old vllm\n"})
    last = _attempt(
        logs_dir,
        "r1",
        "8",
        1_700_000_100,
        {
            "train": "step 1\nTraceback\n",
            "vllm": "serving\n",
            "vllm-server1": "second server\n",
            "reward_model": "rm up\n",
        },
    )
    _attempt(logs_dir, "r10", "9", 1_700_000_200, {"train": "another run\n"})
    emit(out / "r1", "attempt_start", method="grpo", recipe="r.yaml", job="7", attempt=0, host="h")
    emit(out / "r1", "outcome", outcome="preempted", reason="SIGUSR1", code=3, step=1, requeue="8")
    emit(out / "r1", "attempt_start", method="grpo", recipe="r.yaml", job="8", attempt=1, host="h")
    emit(out / "r1", "outcome", outcome="crash", reason="ValueError: bad reward", code=1, step=2)
    return tmp_path, last


def test_the_last_attempt_by_component_with_the_failure_on_top(run_dirs, capsys, monkeypatch):
    root, last = run_dirs
    monkeypatch.chdir(root)
    assert cli.main(["logs", "r1"]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0] == "r1: failed (crash): ValueError: bad reward"
    # Every component of the last attempt, train first; nothing of the older attempt or of r10.
    headers = [line.split(":")[0] for line in lines if line.startswith("=====")]
    assert headers == ["===== train", "===== reward_model", "===== vllm", "===== vllm-server1"]
    assert "step 1\nTraceback" in printed and "second server" in printed
    assert "old attempt" not in printed and "another run" not in printed
    assert cli.main(["logs", "r1", "--component", "vllm-server1"]) == 0
    only = capsys.readouterr().out
    assert "second server" in only and "step 1" not in only and last["vllm-server1"].name in only


def test_a_completed_run_has_no_failure_line_and_an_unknown_component_is_one_line(run_dirs, capsys):
    root, _ = run_dirs
    emit(
        root / "outputs" / "r1",
        "attempt_start",
        method="grpo",
        recipe="r",
        job="8",
        attempt=2,
        host="h",
    )
    emit(root / "outputs" / "r1", "outcome", outcome="completed", reason="done", code=0, step=3)
    dirs = ["--dir", str(root / "outputs"), "--dir", str(root / "logs")]
    assert cli.main(["logs", "r1", *dirs, "--component", "train"]) == 0
    assert not capsys.readouterr().out.startswith("r1: failed")
    assert cli.main(["logs", "r1", *dirs, "--component", "vllm-server3"]) == 2
    err = capsys.readouterr().err
    assert "has no such log; it has: reward_model, train, vllm, vllm-server1" in err
    assert cli.main(["logs", "nope", *dirs]) == 2
    assert "no logs of run 'nope'" in capsys.readouterr().err


def test_follow_prints_what_the_log_gains_and_stops_at_the_outcome(run_dirs, capsys, monkeypatch):
    root, last = run_dirs
    out = root / "outputs" / "r1"
    emit(out, "attempt_start", method="grpo", recipe="r", job="8", attempt=2, host="h")
    monkeypatch.setattr(logs, "FOLLOW_EVERY_S", 0.05)

    def the_run_goes_on():
        time.sleep(0.3)
        with last["train"].open("a") as handle:
            handle.write("step 2\n")
        time.sleep(0.3)
        emit(out, "outcome", outcome="completed", reason="done", code=0, step=2)

    writer = threading.Thread(target=the_run_goes_on)
    writer.start()
    start = time.monotonic()
    dirs = ["--dir", str(root / "outputs"), "--dir", str(root / "logs")]
    assert cli.main(["logs", "r1", *dirs, "--component", "train", "-f"]) == 0
    writer.join()
    assert time.monotonic() - start < 10  # ended by the outcome, not the quiet bound
    printed = capsys.readouterr().out
    assert "step 2" in printed
    # The crash was the attempt before: the one followed had not failed when logs began.
    assert not printed.startswith("r1: failed"), printed
