"""`maxent-grpo runs` and `maxent-grpo plot`: states from event logs written with `emit` (fast,
synthetic runs). Runs made for real on the tiny model: tests/test_runs_real.py."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import socket
import time
from pathlib import Path

import pytest

from helpers.runs import REPO
from maxent_grpo.rundir import events as events_module
from maxent_grpo.rundir.checkpoints import CHECKPOINT_MARKER, RUN_MARKER, request_stop
from maxent_grpo.rundir.events import EVENTS_FILE, emit, events_path, read_events, read_sparse
from maxent_grpo.runs import KILLED, NO_EVENTS, collect_runs, format_table
from maxent_grpo.runs.plot import history_from_events
from maxent_grpo.runs.sources import RunLog, open_run_logs, parse_log_name, read_trainer_state
from maxent_grpo.runs.state import Attempt, decide_state, resume_points
from maxent_grpo.runs.table import Processes

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOST = socket.gethostname()

# ----------------------------------------------------------------------------- the event log


def test_events_round_trip_and_a_torn_line_is_skipped(tmp_path):
    emit(tmp_path, "attempt_start", method="grpo", recipe="r.yaml", job=None, attempt=1, host="h")
    emit(tmp_path, "step", step=1, metrics={"reward": 0.25, "loss": float("nan")})
    with open(events_path(tmp_path), "a") as file:
        file.write('{"time": 1, "event": "outcome", "outc')  # a writer killed mid-line
    first, second = read_events(tmp_path)
    assert (first["event"], first["method"], first["job"]) == ("attempt_start", "grpo", None)
    assert second["metrics"]["reward"] == 0.25 and second["metrics"]["loss"] != 0
    assert abs(second["time"] - time.time()) < 60
    with pytest.raises(ValueError, match="unknown event"):
        emit(tmp_path, "stepp", step=2)
    assert list(read_events(tmp_path / "nowhere")) == read_sparse(tmp_path / "nowhere") == []


@pytest.mark.parametrize("mapped", [False, True])
def test_read_sparse_keeps_every_other_event_and_the_last_steps(tmp_path, monkeypatch, mapped):
    if mapped:  # the path long runs take: the file is mapped and searched, not parsed
        monkeypatch.setattr(events_module, "_READ_WHOLE_BYTES", 64)
    emit(tmp_path, "attempt_start", method="grpo", recipe="r", job="7", attempt=1, host="h")
    for step in range(1, 30):
        emit(tmp_path, "step", step=step, metrics={"reward": step / 10, "note": '"event": "x"'})
        if step % 10 == 0:
            emit(tmp_path, "checkpoint", step=step, path=f"out/checkpoint-{step}")
    emit(tmp_path, "stop_request", reason="SIGUSR1 received")
    emit(tmp_path, "outcome", outcome="stopped", reason="SIGUSR1 received", code=85, step=20)
    found = read_sparse(tmp_path, last_steps=3)
    everything = list(read_events(tmp_path))
    assert [e for e in everything if e in found] == found  # in file order
    assert [e.get("step") for e in found if e["event"] == "step"] == [27, 28, 29]
    assert [e["event"] for e in found if e["event"] != "step"] == [
        "attempt_start",
        "checkpoint",
        "checkpoint",
        "stop_request",
        "outcome",
    ]


def test_parse_log_name():
    assert parse_log_name("my_run_job123_20261122-121844_train.log") == (
        "my_run",
        "123",
        "20261122-121844",
        "train",
    )
    assert parse_log_name("smoke-grpo_20261122-121844_vllm.log")[1::2] == (None, "vllm")
    assert parse_log_name("slurm_123.out") is None
    assert parse_log_name("notes_train.log") is None


def test_trainer_state_summary_reads_head_and_tail_of_big_files_alike(tmp_path):
    history = [{"loss": 0.1, "reward": 0.1 * s, "step": s, "zz": "x" * 2000} for s in range(1, 40)]
    history.append({"step": 39, "train_loss": 0.1, "train_runtime": 3.0})
    state = {"global_step": 39, "log_history": history, "max_steps": 100, "epoch": 0.5}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state, indent=2, sort_keys=True))  # as HF writes it
    assert path.stat().st_size > 64 * 1024
    big = read_trainer_state(path)
    path.write_text(json.dumps({**state, "log_history": history[-3:]}, indent=2, sort_keys=True))
    small = read_trainer_state(path)
    for found in (big, small):
        assert (found.global_step, found.max_steps) == (39, 100)
        assert found.reward == pytest.approx(3.9)


# ----------------------------------------------------------------------------- runs on disk


def _start(out: Path, job: str | None = None, host: str = HOST, method: str = "grpo", n: int = 1):
    emit(out, "attempt_start", method=method, recipe="r.yaml", job=job, attempt=n, host=host)
    emit(out, "plan", device="cpu", train_processes=1, nodes=1, server=None)


def _steps(out: Path, first: int, last: int, reward: float = 0.25, checkpoints=()) -> None:
    for step in range(first, last + 1):
        emit(out, "step", step=step, metrics={"loss": 0.01, "reward": reward, "entropy": 5.8})
        if step in checkpoints:
            _checkpoint(out, step)
            emit(out, "checkpoint", step=step, path=str(out / f"checkpoint-{step}"))


def _checkpoint(out: Path, step: int, complete: bool = True, total: int = 20, method="grpo"):
    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    history = [{"loss": 0.0, "reward": 0.1, "step": s} for s in range(1, step + 1)]
    state = {"global_step": step, "max_steps": total, "log_history": history}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    cls = b"maxent_grpo.maxent.config\nMaxEntConfig" if method == "maxent" else b"GRPOConfig"
    (ckpt / "training_args.bin").write_bytes(b"PK\x03\x04\x00" + cls + b"\x00")
    if complete:
        (ckpt / CHECKPOINT_MARKER).write_text(json.dumps({"step": step}))


def _log(logs: Path, run: str, job: str | None = None, age_s: float = 0.0) -> Path:
    """An attempt's (empty) train log, named as the launcher names it, made now."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = logs / (f"{run}_job{job}_{stamp}_train.log" if job else f"{run}_{stamp}_train.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("free-form text that nothing parses\n")
    _age(path, age_s)
    return path


def _age(path: Path, age_s: float) -> None:
    when = time.time() - age_s
    os.utime(path, (when, when))


def _rows(tmp_path: Path, **kwargs) -> dict:
    dirs = [tmp_path / "outputs", tmp_path / "logs"]
    return {r.run: r for r in collect_runs(dirs, **kwargs)}


def _make_runs(outputs: Path, logs: Path) -> Path:
    """One run per state; returns the log a live process would hold open."""
    done = outputs / "done"  # completed: the marker decides, and records the method
    _start(done, method="maxent")
    _steps(done, 1, 20, checkpoints=(10, 20))
    (done / RUN_MARKER).write_text(json.dumps({"method": "maxent", "global_step": 20}))
    emit(done, "outcome", outcome="completed", reason="", code=0, step=20)
    # Slurm, running on another node: recent events, no outcome
    live = outputs / "slurm-live"
    _start(live, job="41", host="node-7")
    _steps(live, 1, 13, reward=0.75, checkpoints=(10,))
    _checkpoint(live, 12, complete=False)  # a save in progress
    _age(events_path(live), 30)
    dead = outputs / "slurm-dead"  # the same, silent for 2 hours
    _start(dead, job="42", host="node-8")
    _steps(dead, 1, 13, checkpoints=(10,))
    _age(events_path(dead), 7200)
    requeued = outputs / "requeued"
    _start(requeued, job="43", host="node-9")
    _steps(requeued, 1, 6, checkpoints=(6,))
    emit(requeued, "stop_request", reason="SIGUSR1 received")
    emit(requeued, "outcome", outcome="stopped", reason="SIGUSR1 received", code=85, step=6)
    emit(requeued, "outcome", outcome="stopped", reason="SIGUSR1", code=85, step=6, requeue="43")
    stopped = outputs / "stopped"  # locally, with the stop-request file
    _start(stopped)
    _steps(stopped, 1, 4, checkpoints=(4,))
    request_stop(stopped, "test")
    emit(stopped, "outcome", outcome="stopped", reason="stop file", code=85, step=4)
    failed = outputs / "failed"  # two attempts, two jobs: the latest decides
    _start(failed, job="44", host="node-1")
    emit(failed, "outcome", outcome="stopped", reason="SIGUSR1", code=85, step=0, requeue="44")
    _start(failed, job="45", host="node-2", n=2)
    emit(failed, "outcome", outcome="failed", reason="RuntimeError: rank 0\n saw it", code=1)
    _start(outputs / "oom")  # an outcome class this reader has no rule for
    emit(outputs / "oom", "outcome", outcome="oom", reason="CUDA out of memory", code=1, step=0)
    _start(outputs / "bad")
    emit(outputs / "bad", "outcome", outcome="user_error", reason="error: r.yaml: lr", code=2)
    # local attempts (this host), fresh: alive only while a process holds their log
    for name in ("local-dead", "local-live"):
        _start(outputs / name)
        _steps(outputs / name, 1, 3, checkpoints=(2,))
    _log(logs, "local-dead")
    _age(events_path(outputs / "local-live"), 5000)
    held = _log(logs, "local-live", age_s=5000)
    # a trainer started by hand (no launcher attempt) whose output goes to a log
    _steps(outputs / "by-hand", 1, 2)
    _log(logs, "by-hand")
    _checkpoint(outputs / "old", 2)  # a run from before the event log
    return held


def test_states_from_event_logs(tmp_path):
    outputs, logs = tmp_path / "outputs", tmp_path / "logs"
    held = _make_runs(outputs, logs)
    (outputs / "empty").mkdir()  # not runs: an empty dir, a stray file
    (logs / "notes.txt").write_text("hello")

    rows = _rows(tmp_path, open_logs={os.path.realpath(held)})
    assert {name: (row.state, row.outcome) for name, row in rows.items()} == {
        "done": ("completed", "completed"),
        "slurm-live": ("running", None),
        "slurm-dead": ("failed", None),
        "requeued": ("requeued", "stopped"),
        "stopped": ("stopped", "stopped"),
        "failed": ("failed", "failed"),
        "oom": ("failed", "oom"),
        "bad": ("failed", "user_error"),
        "local-dead": ("failed", None),
        "local-live": ("running", None),
        "by-hand": ("failed", None),
        "old": ("unknown", None),
    }
    done = rows["done"]
    assert (done.method, done.step, done.max_steps, done.checkpoint, done.reward) == (
        *("maxent", 20, 20, "checkpoint-20", 0.25),
    )
    live = rows["slurm-live"]
    assert (live.step, live.reward, live.checkpoint) == (13, 0.75, "checkpoint-10")
    assert live.jobs == ["41"]
    assert live.reason.startswith("last written") and live.max_steps == 20
    assert rows["slurm-dead"].reason == rows["local-dead"].reason == KILLED
    assert rows["by-hand"].reason == KILLED and rows["by-hand"].attempts == 1
    assert rows["requeued"].reason == "requeueing 43"
    assert rows["stopped"].reason == "stop file" and rows["stopped"].resumed_from == []
    failed = rows["failed"]
    assert failed.reason == "RuntimeError: rank 0 saw it"  # one line
    assert (failed.attempts, failed.jobs) == (2, ["44", "45"])
    assert rows["oom"].reason == "CUDA out of memory"
    assert rows["bad"].reason == "error: r.yaml: lr" and rows["bad"].method == "grpo"
    assert (rows["local-live"].reason, rows["local-live"].method) == ("", "grpo")
    old = rows["old"]
    assert (old.reason, old.method, old.checkpoint, old.step) == (
        *(NO_EVENTS, "grpo", "checkpoint-2", 2),
    )

    # Without process information, the time of the last write decides for local runs too.
    rows = _rows(tmp_path, open_logs=None)
    assert rows["local-dead"].state == "running" and rows["local-live"].state == "failed"
    assert rows["slurm-live"].state == "running"
    assert _rows(tmp_path, open_logs=None, active_within=10)["slurm-live"].state == "failed"


def test_table_format(tmp_path):
    _make_runs(tmp_path / "outputs", tmp_path / "logs")
    header, *lines = format_table(list(_rows(tmp_path, open_logs=set()).values())).splitlines()
    assert header.split() == [
        *("RUN", "METHOD", "STATE", "JOB", "ATT", "STEP"),
        *("REWARD", "CHECKPOINT", "EVAL", "AGE", "DETAIL"),
    ]
    assert len(lines) == 12 and all(line == line.rstrip() for line in lines)
    done_line = next(line for line in lines if line.startswith("done "))
    assert done_line.split()[:8] == [
        *("done", "MaxEnt", "completed", "-", "1", "20/20", "0.25", "checkpoint-20"),
    ]
    failed_line = next(line for line in lines if line.startswith("failed "))
    assert failed_line.split()[2:5] == ["failed", "44,45", "2"]


def _attempt(outcome: dict | None = None, launcher: bool = True) -> Attempt:
    start = {"event": "attempt_start", "host": HOST} if launcher else None
    events = [{"event": "outcome", **outcome}] if outcome else []
    return Attempt(start, events)


STOPPED = {"outcome": "stopped", "reason": "SIGUSR1 received"}
REQUEUED = {**STOPPED, "requeue": "7_1"}
BY_HAND = _attempt(launcher=False)
STOPPED_BY_HAND = "stop requested; no launcher attempt recorded an outcome"


@pytest.mark.parametrize(
    ("marker", "attempt", "live", "age", "stop", "expected"),
    [
        # the marker beats everything, even a later failure
        (True, _attempt({"outcome": "failed", "reason": "x"}), None, 9e9, False, ("completed", "")),
        # an outcome beats a live process (the launcher writes it as its last act)
        (False, _attempt(STOPPED), True, 0, True, ("stopped", "SIGUSR1 received")),
        (False, _attempt(REQUEUED), None, 0, False, ("requeued", "requeueing 7_1")),
        (False, _attempt({"outcome": "hang", "reason": ""}), None, 0, False, ("failed", "hang")),
        (False, _attempt(), True, 9e9, True, ("running", "stop requested")),
        (False, _attempt(), None, 61, False, ("failed", KILLED)),
        (False, _attempt(), False, 0, False, ("failed", KILLED)),
        (False, None, None, None, False, ("unknown", NO_EVENTS)),
        (False, BY_HAND, False, 0, True, ("stopped", STOPPED_BY_HAND)),
    ],
)
def test_state_rules(marker, attempt, live, age, stop, expected):
    state = decide_state(
        marker=marker, attempt=attempt, live=live, age=age, active_within=60, stop_requested=stop
    )
    assert state == expected


@pytest.mark.parametrize(
    ("host", "job", "held", "expected"),
    [
        (HOST, None, True, True),  # this machine: a holder means alive...
        (HOST, None, False, False),  # ...and none means dead
        ("node-7", "41", False, None),  # another node: cannot be seen from here
        (None, None, False, False),  # no attempt_start (a trainer by hand): local unless
        (None, "41", False, None),  # its log is named after a Slurm job
    ],
)
def test_liveness_is_known_only_for_attempts_on_this_machine(tmp_path, host, job, held, expected):
    log = _log(tmp_path, "r", job=job)
    attempt = Attempt({"event": "attempt_start", "host": host} if host else None)
    logs = [RunLog(log, "r", job, "20260101-000000", "train", 0.0)]
    processes = Processes({os.path.realpath(log)} if held else set())
    assert processes.live(logs, attempt) is expected
    assert Processes(None).live(logs, attempt) is None  # no /proc: nothing is known


def test_a_new_attempt_starting_its_server_is_running_not_killed(tmp_path):
    # Attempt 2 has started (its vLLM server loads) but has no log yet: attempt 1's log, which
    # no process holds any more, says nothing about it.
    out = tmp_path / "outputs" / "r"
    _start(out)
    _steps(out, 1, 4, checkpoints=(4,))
    emit(out, "outcome", outcome="stopped", reason="stop file", code=85, step=4)
    old_log = _log(tmp_path / "logs", "r")
    _age(old_log, 60)
    time.sleep(1.1)  # the next attempt starts in a later second than the old log's name
    _start(out, n=2)
    (row,) = collect_runs([tmp_path / "outputs", tmp_path / "logs"], open_logs=set())
    assert (row.state, row.attempts, row.resumed_from) == ("running", 2, [4])
    new_log = _log(tmp_path / "logs", "r", age_s=600)
    _age(events_path(out), 600)
    (row,) = collect_runs([tmp_path / "outputs", tmp_path / "logs"], open_logs=set())
    assert (row.state, row.reason) == ("failed", KILLED)
    (row,) = collect_runs(
        [tmp_path / "outputs", tmp_path / "logs"], open_logs={os.path.realpath(new_log)}
    )
    assert (row.state, row.log) == ("running", str(new_log))


def test_no_launcher_and_the_stop_file_is_stopped(tmp_path):
    out = tmp_path / "r"
    _steps(out, 1, 3)
    request_stop(out, "test")
    _age(events_path(out), 3600)
    (row,) = collect_runs([out], open_logs=set())
    assert (row.run, row.state, row.step, row.reward) == ("r", "stopped", 3, 0.25)


def test_resume_points_and_history_from_events(tmp_path):
    out = tmp_path / "r"
    _start(out)
    _steps(out, 1, 5, reward=1.0, checkpoints=(4,))  # killed after step 5, resumed from 4
    _start(out, n=2)
    _steps(out, 5, 6, reward=2.0, checkpoints=(6,))
    emit(out, "outcome", outcome="stopped", reason="stop file", code=85, step=6)
    _start(out, n=3)
    _steps(out, 7, 8, reward=3.0)
    events = list(read_events(out))
    assert resume_points(events) == [4, 6]
    history = history_from_events(events)
    assert [(e["step"], e["reward"]) for e in history] == [
        *((1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0)),
        *((5, 2.0), (6, 2.0), (7, 3.0), (8, 3.0)),
    ]
    (row,) = collect_runs([out], open_logs=set())
    assert (row.resumed_from, row.attempts, row.step, row.reward) == ([4, 6], 3, 8, 3.0)


def test_runs_cli_table_and_json(tmp_path, capsys):
    from maxent_grpo.cli import main

    out = tmp_path / "outputs" / "a"
    _start(out)
    _steps(out, 1, 3, checkpoints=(2,))
    emit(out, "outcome", outcome="failed", reason="ValueError: boom", code=1, step=2)
    dirs = ["--dir", str(tmp_path / "outputs"), "--dir", str(tmp_path / "logs")]
    assert main(["runs", *dirs]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:3] == ["a", "GRPO", "failed"]
    assert main(["runs", *dirs, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["state"], row["outcome"], row["reason"]) == ("failed", "failed", "ValueError: boom")
    assert row["step"] == 3 and row["age_s"] >= 0
    assert main(["runs", "--dir", str(tmp_path / "nothing")]) == 0
    assert "no runs found" in capsys.readouterr().out


def test_open_run_logs_sees_this_process(tmp_path):
    path = tmp_path / "x_20260101-000000_train.log"
    with open(path, "w"):
        assert os.path.realpath(path) in open_run_logs()
    assert os.path.realpath(path) not in open_run_logs()


def test_fake_runs_of_the_benchmark_are_all_read_right(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # bench scripts import benchlib beside them
    spec = importlib.util.spec_from_file_location("bench_runs", REPO / "bench" / "bench_runs.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    expected = bench.make_fake_runs(tmp_path, count=42, steps=30, big=2, big_steps=3000)
    rows = _rows(tmp_path)
    assert {name: row.state for name, row in rows.items()} == expected
    assert {row.method for row in rows.values()} == {"grpo", "maxent"}
    assert all(row.step for row in rows.values())


# ----------------------------------------------------------------------------- plot (synthetic)


def _history(steps: int) -> list[dict]:
    return [
        {
            "step": s,
            "loss": 0.1,
            "reward": 0.1 * s + 1e-13,
            "rewards/acc/mean": 1 / 3 * s,
            "kl": 0.001 * s,
            "entropy": 5.851006984710693 - s / 7,
            "completions/mean_length": 27.5,
            "completions/min_length": 3.0,
            "completions/max_length": 32.0,
            "maxent/weight_entropy": 1.3862938708375079,
            "maxent/ess": 3.999995582127538,
            "maxent/beta": 0.05 * 0.99**s,
            "maxent/tau": 1.0 - s / 100,
        }
        for s in range(1, steps + 1)
    ]


PLOTTED = [
    *("step", "reward", "rewards/acc/mean", "kl", "entropy", "completions/mean_length"),
    *("completions/min_length", "completions/max_length", "maxent/weight_entropy"),
    *("maxent/ess", "maxent/beta", "maxent/tau"),
]


def _csv_matches(table: Path, history: list[dict]) -> None:
    with open(table) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == PLOTTED and len(rows) == len(history)
    for row, entry in zip(rows, history, strict=True):
        for key, text in row.items():
            assert float(text) == entry[key], key


def test_plot_from_step_events_with_resume_points(tmp_path):
    from maxent_grpo.runs.plot import plot_run

    out = tmp_path / "outputs" / "m"
    history = _history(10)
    _start(out, method="maxent")
    for entry in history[:5]:  # killed after step 5; checkpoint-4 was complete
        metrics = {k: v for k, v in entry.items() if k != "step"}
        emit(out, "step", step=entry["step"], metrics={**metrics, "reward": -1.0})
        if entry["step"] == 4:
            emit(out, "checkpoint", step=4, path="x")
    _start(out, method="maxent", n=2)
    for entry in history[4:]:
        metrics = {k: v for k, v in entry.items() if k != "step"}
        emit(out, "step", step=entry["step"], metrics=metrics)
    emit(out, "step", step=10, metrics={"train_runtime": 3.0, "train_loss": 0.1})
    png, table, info = plot_run("m", tmp_path / "p" / "m.png", outputs=tmp_path / "outputs")
    assert table == tmp_path / "p" / "m.csv" and info["source"] == str(events_path(out))
    assert info["resumed_from"] == [4] and info["rows"] == 10
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and 10_000 < len(data) < 300_000
    assert "MaxEnt beta and tau" in info["panels"] and len(info["panels"]) == 7
    with open(table) as handle:
        rewards = [float(row["reward"]) for row in csv.DictReader(handle)]
    assert rewards[:4] == [-1.0] * 4  # steps 1-4 of the first attempt, kept
    history[:4] = [{**e, "reward": -1.0} for e in history[:4]]
    _csv_matches(table, history)


def test_plot_of_a_run_without_events_reads_its_trainer_state(tmp_path):
    from maxent_grpo.runs.plot import plot_run

    out = tmp_path / "outputs" / "m"
    out.mkdir(parents=True)
    history = [*_history(10), {"step": 10, "train_loss": 0.1, "train_runtime": 3.0}]
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 10, "log_history": history}))
    png, table, info = plot_run("m", tmp_path / "p" / "m.png", outputs=tmp_path / "outputs")
    assert png.read_bytes().startswith(PNG_SIGNATURE) and info["resumed_from"] == []
    assert info["source"] == str(out / "trainer_state.json")
    _csv_matches(table, history[:-1])


def test_plot_says_what_is_missing(tmp_path):
    from maxent_grpo.errors import UserError
    from maxent_grpo.runs.plot import plot_run

    with pytest.raises(UserError, match="no such run"):
        plot_run("nope", outputs=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="nothing to plot yet"):
        plot_run("empty", outputs=tmp_path)
    (tmp_path / "started").mkdir()
    emit(tmp_path / "started", "attempt_start", method="grpo", recipe="r", job=None, attempt=1)
    with pytest.raises(UserError, match="no step events"):
        plot_run("started", outputs=tmp_path)
    assert (tmp_path / "started" / EVENTS_FILE).is_file()


# ----------------------------------------------------------------------------- the Slurm queue
# The `squeue` here is a script on PATH printing what squeue prints for the format
# runs/queue.py asks; Slurm's own squeue is tested in tests/slurm/test_sweep_slurm.py.


def fake_squeue(tmp_path: Path, monkeypatch, lines: str, code: int = 0, err: str = "") -> None:
    script = tmp_path / "bin" / "squeue"
    script.parent.mkdir(exist_ok=True)
    (tmp_path / "squeue.out").write_text(lines)
    script.write_text(f"#!/bin/sh\ncat {tmp_path}/squeue.out\necho '{err}' >&2\nexit {code}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}/usr/bin{os.pathsep}/bin")


def test_queued_jobs_appear_before_they_write_and_a_pending_run_says_why(
    tmp_path, monkeypatch, capsys
):
    from maxent_grpo import cli
    from maxent_grpo.rundir.sweeps import Point, write_points

    out = tmp_path / "out"
    emit(out / "old", "attempt_start", method="grpo", recipe="r", job="5", attempt=0, host=HOST)
    emit(out / "old", "outcome", outcome="time_limit", reason="USR1", code=85, step=2)
    points = [Point(f"sw-seed={s}", str(out / f"sw-seed={s}"), {"seed": str(s)}) for s in (1, 2)]
    write_points(out / "sw.sweep.json", {"sweep": "sw"}, points)
    fake_squeue(
        tmp_path,
        monkeypatch,
        "7|maxent-grpo:old|PENDING|BeginTime|(null)\n"
        "8|maxent-grpo:fresh|PENDING|JobHeldUser|(null)\n"
        f"9_1|maxent-grpo-sweep:sw|PENDING|JobArrayTaskLimit|{out}/sw.sweep.json\n"
        "10|maxent-grpo|RUNNING|None|(null)\n"
        "11|someone-else|PENDING|Priority|(null)\n",
    )
    assert cli.main(["runs", "--json", "--dir", str(out)]) == 0
    rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"old", "fresh", "sw-seed=2", "job 10"}  # not someone else's job
    assert (rows["fresh"]["state"], rows["fresh"]["reason"]) == (
        "pending",
        "queued (JobHeldUser)",
    )
    assert rows["old"]["state"] == "pending" and rows["old"]["jobs"] == ["5", "7"]
    assert rows["old"]["reason"] == "queued (BeginTime); last attempt: stopped"
    assert rows["sw-seed=2"]["reason"] == "queued (JobArrayTaskLimit)"
    assert rows["job 10"]["state"] == "running" and rows["job 10"]["jobs"] == ["10"]

    assert cli.main(["runs", "--dir", str(out), "--sweep", "sw"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[:4] for line in table[2:]] == [
        ["0", "1", "not", "started"],
        ["1", "2", "pending", "-"],
    ]


def test_without_slurm_runs_lists_local_runs_only(tmp_path, monkeypatch, capsys):
    from maxent_grpo import cli

    emit(tmp_path / "out" / "r", "attempt_start", method="grpo", recipe="r", job=None,
         attempt=0, host=HOST)  # fmt: skip
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)  # no squeue at all
    assert cli.main(["runs", "--json", "--dir", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert [r["run"] for r in json.loads(captured.out)] == ["r"] and captured.err == ""
    monkeypatch.undo()  # squeue there, its controller not answering: one note, no error
    fake_squeue(tmp_path, monkeypatch, "", 1, "squeue: error: Unable to contact slurm controller")
    assert cli.main(["runs", "--json", "--dir", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert [r["run"] for r in json.loads(captured.out)] == ["r"]
    assert captured.err.startswith("note: squeue failed (squeue: error: Unable to contact")
