"""`maxent-grpo runs` and `maxent-grpo plot`: log parsing and states (fast, synthetic files),
then runs in every state produced for real on the tiny model (integration)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.runs import PYTHON, REPO, child_env, log_history, run, write_recipe
from maxent_grpo.runs import (
    KILLED,
    collect_runs,
    format_table,
    open_train_logs,
    parse_launcher_output,
    parse_log_name,
    parse_metrics_line,
    parse_progress,
    read_tail,
    summarize_log,
    summarize_trainer_state,
)
from maxent_grpo.train.checkpoints import CHECKPOINT_MARKER, RUN_MARKER, STOP_REQUEST, request_stop

SMOKE = REPO / "recipes" / "smoke" / "config_grpo.yaml"
SMOKE_MAXENT = REPO / "recipes" / "smoke" / "config_maxent.yaml"
GRPO = str(REPO / "src" / "grpo.py")
MAXENT_GRPO = str(REPO / ".venv" / "bin" / "maxent-grpo")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# ----------------------------------------------------------------------------- log text
# Shapes copied from real train logs (transformers 5.17 / TRL 1.16 / torch 2.13).

METRICS = (
    "{'loss': '0.01', 'grad_norm': '0.5', 'learning_rate': '0.001', 'num_tokens': '1.03e+04', "
    "'completions/mean_length': '27.5', 'rewards/answer_match/mean': '0', "
    "'rewards/format/mean': '0.25', 'reward': 'REWARD', 'reward_std': '0.2', "
    "'entropy': '5.851', 'step_time': '0.5775', 'epoch': '0.007812'}"
)


def metrics_line(reward) -> str:
    return METRICS.replace("REWARD", str(reward))


ELASTIC = """\
E1122 12:17:01.176000 10549 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: {code}) local_rank: 1 (pid: 10650) of binary: /venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
/repo/src/grpo.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 10649)  (SIGTERM)
  traceback : Signal 15 (SIGTERM) received by PID 10649
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 10650) {signal}
  error_file: <N/A>
============================================================
"""  # noqa: E501, W291
RANK_TRACEBACK = """\
[rank1]: Traceback (most recent call last):
[rank0]: Traceback (most recent call last):
[rank1]:   File "/repo/src/grpo.py", line 11, in <module>
[rank0]:   File "/repo/src/grpo.py", line 11, in <module>
[rank1]:     sys.exit(cli_main(sys.argv[1:]))
[rank1]:              ^^^^^^^^^^^^^^^^^^^^^^
[rank1]: safetensors._safetensors_rust.SafetensorError: Error while deserializing header: invalid header length
[rank0]:     sys.exit(cli_main(sys.argv[1:]))
[rank0]: RuntimeError: rank 0 saw it too
"""  # noqa: E501


def steps_text(first: int, last: int, total: int, reward: float = 0.25) -> str:
    """Progress-bar redraws and metric lines, with the carriage returns tqdm writes."""
    parts = [f"\r  0%|          | 0/{total} [00:00<?, ?it/s]"]
    for step in range(first, last + 1):
        parts.append(f"\r {step * 100 // total}%|#   | {step}/{total} [00:01<00:25,  1.33s/it]")
        parts.append("\r                          \r" + metrics_line(reward) + "\n")
    return "".join(parts)


def stop_text(step: int, total: int) -> str:
    return (
        steps_text(1, step, total)
        + f"12:16:52 INFO [rank0] maxent_grpo: Stopped on request after step {step}; "
        f"saved outputs/r/checkpoint-{step}\n" + ELASTIC.format(code=85, signal="")
    )


# ----------------------------------------------------------------------------- parsing


def test_parse_log_name():
    name = parse_log_name("my_run_job123_20261122-121844_train.log")
    assert (name.run, name.job, name.stamp, name.role) == (
        "my_run",
        "123",
        "20261122-121844",
        "train",
    )
    name = parse_log_name("smoke-grpo_20261122-121844_vllm.log")
    assert (name.run, name.job, name.role) == ("smoke-grpo", None, "vllm")
    assert parse_log_name("slurm_123.out") is None
    assert parse_log_name("notes_train.log") is None


def test_parse_metrics_line_and_progress():
    metrics = parse_metrics_line(metrics_line("-0.4375"))
    assert metrics["reward"] == -0.4375 and metrics["num_tokens"] == 10300.0
    assert metrics["rewards/format/mean"] == 0.25
    assert parse_metrics_line("{'train_runtime': 14.32, 'epoch': 0.07812}") == {
        "train_runtime": 14.32,
        "epoch": 0.07812,
    }
    assert parse_metrics_line("12:19:49 INFO maxent_grpo: Training complete") is None
    assert parse_progress(" 45%|####5     | 9/20 [00:06<00:06,  1.67it/s]") == (9, 20)
    assert parse_progress("Map: 100%|##########| 512/512 [00:00<00:00, 6067 examples/s]") is None


def test_summarize_completed_log():
    text = steps_text(1, 20, 20) + (
        "12:19:49 INFO [rank0] maxent_grpo: Training complete; model saved to outputs/x\n"
    )
    summary = summarize_log(text)
    assert summary.outcome == "complete"
    assert (summary.step, summary.max_steps, summary.reward) == (20, 20, 0.25)
    assert summary.metric_keys >= {"loss", "reward"}


def test_stop_then_launcher_failure_report_is_stopped_not_failed():
    # accelerate reports the trainers' exit code 85 (checkpointed) as a ChildFailedError.
    summary = summarize_log(stop_text(7, 20))
    assert summary.outcome == "stopped"
    assert summary.stopped_step == 7 and summary.step == 7
    assert summary.reason.startswith("Stopped on request after step 7")


def test_failed_log_reason_is_the_last_exception_line_not_the_launcher_wrapper():
    text = steps_text(1, 3, 20) + RANK_TRACEBACK + ELASTIC.format(code=1, signal="")
    summary = summarize_log(text)
    assert summary.outcome == "failed"
    assert summary.reason == "RuntimeError: rank 0 saw it too"
    assert summary.entry_script == "grpo.py"


def test_error_line_wins_over_exceptions():
    text = (
        steps_text(1, 2, 20)
        + RANK_TRACEBACK
        + "error: recipe.yaml: dataset_name: no such file 'x.jsonl'\n"
        + ELASTIC.format(code=2, signal="")
    )
    summary = summarize_log(text)
    assert (summary.outcome, summary.reason) == (
        "failed",
        "error: recipe.yaml: dataset_name: no such file 'x.jsonl'",
    )


def test_killed_rank_without_a_traceback_reports_its_signal():
    text = steps_text(1, 5, 20) + ELASTIC.format(code=-9, signal=" (SIGKILL)")
    summary = summarize_log(text)
    assert summary.outcome == "failed"
    assert summary.reason == "a training process exited with code -9 (SIGKILL)"


def test_single_process_launcher_wrapper_gives_the_exit_code():
    text = (
        steps_text(1, 1, 4)
        + "boom: something printed\nTraceback (most recent call last):\n"
        + '  File "/venv/lib/python3.11/site-packages/accelerate/commands/launch.py", line 999\n'
        + "    raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)\n"
        + "subprocess.CalledProcessError: Command '['python', 'src/grpo.py']' returned "
        + "non-zero exit status 3.\n"
    )
    assert summarize_log(text).reason == "a training process exited with code 3"


def test_a_traceback_training_went_on_after_is_not_a_failure():
    text = (
        steps_text(1, 2, 20)
        + "Traceback (most recent call last):\n  File 'x.py', line 1\nValueError: handled\n"
        + steps_text(3, 4, 20)
    )
    summary = summarize_log(text)
    assert summary.outcome is None and summary.step == 4


def test_resume_line_and_no_exit_line():
    text = (
        "Map: 100%|##########| 512/512 [00:00<00:00, 6067.13 examples/s]\n"
        "12:18:10 INFO [rank0] maxent_grpo: Resuming from outputs/docs-stop/checkpoint-4\n"
        + steps_text(5, 9, 20, reward=0.5)
    )
    summary = summarize_log(text)
    assert summary.resumed_from == 4
    assert (summary.outcome, summary.step, summary.reward) == (None, 9, 0.5)


def test_read_tail_starts_at_a_line_boundary_and_skips_the_rest(tmp_path):
    path = tmp_path / "big_train.log"
    with open(path, "wb") as handle:
        handle.truncate(3 * 1024**3)  # 3 GiB hole: reading it all would take seconds
        handle.seek(3 * 1024**3)
        handle.write(steps_text(1, 40, 40).encode())
        handle.write(b"12:00:00 INFO [rank0] maxent_grpo: Training complete\n")
    start = time.perf_counter()
    text = read_tail(path, 4096)
    assert time.perf_counter() - start < 0.5
    assert len(text) <= 4096 and "\x00" not in text
    assert text[0] in "\r\n {" or text.startswith("12:")
    assert summarize_log(text).outcome == "complete"


def test_parse_launcher_output():
    text = (
        stop_text(3, 20)
        + "training exited with code 85 after 3600.2s\n"
        + "log: logs/r_job77_20261122-121616_train.log\n"
        + "stopped (SIGUSR1 received); resume point: outputs/r/checkpoint-3\n"
        + "requeueing 77\n"
        + "training: 2 processes on 1 machine(s) ...\n"
        + "training exited with code 85 after 12.0s\n"
        + "log: logs/r_job77_20261122-131616_train.log\n"
        + "stopped (SIGUSR1 received); resume point: outputs/r/checkpoint-5\n"
        + "not requeued: requeued 3 times already (max_requeues: 3); resubmit to continue\n"
    )
    records, last_error = parse_launcher_output(text)
    first = records["r_job77_20261122-121616_train.log"]
    second = records["r_job77_20261122-131616_train.log"]
    assert (first.exit_code, first.requeued, first.not_requeued) == ("85", "77", None)
    assert second.requeued is None and second.not_requeued.startswith("requeued 3 times")
    assert last_error is None


def test_trainer_state_summary_reads_head_and_tail_of_big_files_alike(tmp_path):
    history = [
        {"loss": 0.1, "reward": 0.1 * s, "maxent/ess": 3.5, "step": s, "zz": "x" * 2000}
        for s in range(1, 40)
    ]
    history.append({"step": 39, "train_loss": 0.1, "train_runtime": 3.0})
    state = {"global_step": 39, "log_history": history, "max_steps": 100, "epoch": 0.5}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state, indent=2, sort_keys=True))  # as HF writes it
    assert path.stat().st_size > 64 * 1024
    big = summarize_trainer_state(path)
    path.write_text(json.dumps({**state, "log_history": history[-3:]}, indent=2, sort_keys=True))
    small = summarize_trainer_state(path)
    for found in (big, small):
        assert (found.global_step, found.max_steps) == (39, 100)
        assert found.reward == pytest.approx(3.9) and found.reward_step == 39
        assert "maxent/ess" in found.metric_keys


# ----------------------------------------------------------------------------- states on disk


def _log(logs: Path, run: str, text: str, job: str | None = None, age_s: float = 0.0, n=0):
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() - 7200 + n))
    name = f"{run}_job{job}_{stamp}_train.log" if job else f"{run}_{stamp}_train.log"
    path = logs / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


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


def _rows(tmp_path: Path, **kwargs) -> dict:
    dirs = [tmp_path / "outputs", tmp_path / "logs"]
    return {r.run: r for r in collect_runs(dirs, **kwargs)}


def test_states_from_synthetic_runs(tmp_path):
    outputs, logs = tmp_path / "outputs", tmp_path / "logs"
    # completed: the marker decides, and records the method
    out = outputs / "done"
    _checkpoint(out, 10, method="maxent")
    _checkpoint(out, 20, method="maxent")
    (out / RUN_MARKER).write_text(json.dumps({"method": "maxent", "global_step": 20}))
    _log(logs, "done", steps_text(1, 20, 20) + "maxent_grpo: Training complete\n", age_s=60)
    # running under Slurm: fresh log, no exit line (its node's processes are not visible here)
    _checkpoint(outputs / "slurm-live", 10)
    _checkpoint(outputs / "slurm-live", 12, complete=False)  # a save in progress
    _log(logs, "slurm-live", steps_text(1, 13, 20, reward=0.75), job="41", age_s=30)
    # the same, but silent for 2 hours: killed
    _checkpoint(outputs / "slurm-dead", 10)
    _log(logs, "slurm-dead", steps_text(1, 13, 20), job="42", age_s=7200)
    # requeued: the launcher's Slurm output says so
    _checkpoint(outputs / "requeued", 6)
    log = _log(logs, "requeued", stop_text(6, 20), job="43", age_s=300)
    (logs / "slurm_43.out").write_text(
        stop_text(6, 20) + f"training exited with code 85 after 30.0s\nlog: logs/{log.name}\n"
        "stopped (SIGUSR1 received); resume point: outputs/requeued/checkpoint-6\n"
        "requeueing 43\n"
    )
    # stopped locally (no Slurm): the stop request is still there
    _checkpoint(outputs / "stopped", 4)
    (outputs / "stopped" / STOP_REQUEST).write_text("{}")
    _log(logs, "stopped", stop_text(4, 20), age_s=600)
    # failed, two attempts, two jobs: only the latest attempt counts
    _log(logs, "failed", stop_text(2, 20), job="44", n=0, age_s=900)
    _log(logs, "failed", steps_text(3, 5, 20) + RANK_TRACEBACK, job="45", n=1, age_s=800)
    # a local attempt with no exit line whose process is gone: killed
    _checkpoint(outputs / "local-dead", 2)
    _log(logs, "local-dead", steps_text(1, 3, 20), age_s=5)
    # a local attempt held open by a live process: running
    live = _log(logs, "local-live", steps_text(1, 3, 20), age_s=5000)
    # no log at all: unknown
    _checkpoint(outputs / "nolog", 2)
    # a user error under sbatch: only the Slurm output has it (no train log, no run name)
    (logs / "slurm_46.out").write_text("error: r.yaml: unknown key 'lr'; did you mean ...\n")
    # not runs: an empty dir, a stray file
    (outputs / "empty").mkdir()
    (logs / "notes.txt").write_text("hello")

    rows = _rows(tmp_path, open_logs={os.path.realpath(live)})
    states = {name: row.state for name, row in rows.items()}
    assert states == {
        "done": "completed",
        "slurm-live": "running",
        "slurm-dead": "failed",
        "requeued": "requeued",
        "stopped": "stopped",
        "failed": "failed",
        "local-dead": "failed",
        "local-live": "running",
        "nolog": "unknown",
        "slurm_46": "failed",
    }
    done = rows["done"]
    assert (done.method, done.step, done.max_steps, done.checkpoint) == (
        "maxent",
        20,
        20,
        "checkpoint-20",
    )
    live_row = rows["slurm-live"]
    assert (live_row.step, live_row.reward, live_row.checkpoint) == (13, 0.75, "checkpoint-10")
    assert live_row.jobs == ["41"] and live_row.reason.startswith("log written")
    assert rows["slurm-dead"].reason == KILLED and rows["local-dead"].reason == KILLED
    assert rows["requeued"].reason == "requeueing 43"
    assert rows["stopped"].reason.startswith("Stopped on request after step 4")
    failed = rows["failed"]
    assert failed.reason == "RuntimeError: rank 0 saw it too"
    assert (failed.attempts, failed.jobs) == (2, ["44", "45"])
    assert rows["slurm_46"].reason.startswith("error: r.yaml: unknown key")
    assert rows["slurm_46"].jobs == ["46"]
    assert rows["nolog"].method == "grpo" and rows["nolog"].checkpoint == "checkpoint-2"

    # Without process information, a local log's age decides too.
    rows = _rows(tmp_path, open_logs=None)
    assert rows["local-dead"].state == "running" and rows["local-live"].state == "failed"
    assert rows["slurm-live"].state == "running"
    assert _rows(tmp_path, open_logs=None, active_within=10)["slurm-live"].state == "failed"

    table = format_table(list(_rows(tmp_path, open_logs=set()).values()))
    header, *lines = table.splitlines()
    assert header.split() == [
        "RUN",
        "METHOD",
        "STATE",
        "JOB",
        "ATT",
        "STEP",
        "REWARD",
        "CHECKPOINT",
        "AGE",
        "DETAIL",
    ]
    assert len(lines) == 10 and all(line == line.rstrip() for line in lines)
    done_line = next(line for line in lines if line.startswith("done "))
    assert done_line.split()[:8] == [
        "done",
        "MaxEnt",
        "completed",
        "-",
        "1",
        "20/20",
        "0.25",
        "checkpoint-20",
    ]


def test_the_vllm_log_explains_a_trainer_that_died_without_a_message(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "v_job9_20261122-100000_vllm.log").write_text(
        "INFO Application startup complete.\nTraceback (most recent call last):\n"
        '  File "vllm/engine.py", line 1\ntorch.OutOfMemoryError: CUDA out of memory\n'
    )
    (logs / "v_job9_20261122-100130_train.log").write_text(
        steps_text(1, 2, 20) + ELASTIC.format(code=-15, signal=" (SIGTERM)")
    )
    (row,) = collect_runs([logs], open_logs=set())
    assert row.state == "failed"
    assert row.reason == (
        "a training process exited with code -15 (SIGTERM); "
        "vllm: torch.OutOfMemoryError: CUDA out of memory"
    )


def test_output_dir_given_directly_and_method_from_metric_names(tmp_path):
    out = tmp_path / "outputs" / "solo"
    out.mkdir(parents=True)
    state = {
        "global_step": 3,
        "max_steps": 3,
        "log_history": [{"loss": 0.0, "maxent/ess": 3.0, "reward": 0.5, "step": 3}],
    }
    (out / "trainer_state.json").write_text(json.dumps(state))
    (rows,) = collect_runs([out], open_logs=set())
    assert (rows.run, rows.method, rows.state, rows.step, rows.reward) == (
        "solo",
        "maxent",
        "unknown",
        3,
        0.5,
    )


def test_open_train_logs_sees_this_process(tmp_path):
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc")
    path = tmp_path / "x_20260101-000000_train.log"
    with open(path, "w"):
        assert os.path.realpath(path) in open_train_logs()
    assert os.path.realpath(path) not in open_train_logs()


def test_fake_runs_of_the_benchmark_are_all_read_right(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_runs", REPO / "bench" / "bench_runs.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    expected = bench.make_fake_runs(tmp_path, count=42, steps=30, big=2)
    rows = _rows(tmp_path)
    assert {name: row.state for name, row in rows.items()} == expected
    assert {row.method for row in rows.values()} == {"grpo", "maxent"}


def test_runs_cli_table_and_json(tmp_path, capsys):
    from maxent_grpo.cli import main

    _checkpoint(tmp_path / "outputs" / "a", 2)
    _log(tmp_path / "logs", "a", steps_text(1, 3, 20) + RANK_TRACEBACK)
    dirs = ["--dir", str(tmp_path / "outputs"), "--dir", str(tmp_path / "logs")]
    assert main(["runs", *dirs]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:3] == ["a", "GRPO", "failed"]
    assert main(["runs", *dirs, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["state"] == "failed" and row["step"] == 3 and row["age_s"] >= 0
    assert main(["runs", "--dir", str(tmp_path / "nothing")]) == 0
    assert "no runs found" in capsys.readouterr().out


# ----------------------------------------------------------------------------- plot (synthetic)


def test_plot_csv_holds_the_logged_values_exactly_and_png_is_valid(tmp_path):
    from maxent_grpo.runs.plot import plot_run

    out = tmp_path / "outputs" / "m"
    out.mkdir(parents=True)
    history = [
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
        for s in range(1, 11)
    ]
    history.append({"step": 10, "train_loss": 0.1, "train_runtime": 3.0})
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 10, "log_history": history}))
    logs = tmp_path / "logs"
    _log(logs, "m", "maxent_grpo: Resuming from outputs/m/checkpoint-4\n" + steps_text(5, 10, 10))
    png, table, info = plot_run(
        "m", tmp_path / "p" / "m.png", outputs=tmp_path / "outputs", logs_dirs=[logs]
    )
    assert table == tmp_path / "p" / "m.csv"
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and 10_000 < len(data) < 300_000
    assert "MaxEnt beta and tau" in info["panels"] and len(info["panels"]) == 7
    with open(table) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == [
        "step",
        "reward",
        "rewards/acc/mean",
        "kl",
        "entropy",
        "completions/mean_length",
        "completions/min_length",
        "completions/max_length",
        "maxent/weight_entropy",
        "maxent/ess",
        "maxent/beta",
        "maxent/tau",
    ]
    assert len(rows) == 10
    for row, entry in zip(rows, history, strict=False):
        for key, text in row.items():
            assert float(text) == entry[key], key


# ----------------------------------------------------------------------------- real runs


@dataclass
class RealRuns:
    work: Path
    results: dict = field(default_factory=dict)  # name -> CompletedProcess
    snapshots: dict = field(default_factory=dict)  # label -> {run: RunInfo}
    seconds: dict = field(default_factory=dict)

    def table(self) -> dict:
        return {r.run: r for r in collect_runs([self.work / "outputs", self.work / "logs"])}


def _recipe(work: Path, name: str, tiny_model: Path, base: Path = SMOKE, **overrides) -> Path:
    settings = dict(
        model_name_or_path=str(tiny_model),
        output_dir=str(work / "outputs" / name),
        dataset_num_rows=256,
        max_completion_length=16,
        max_steps=4,
        save_steps=2,
        num_processes=1,
    )
    settings.update(overrides)
    return write_recipe(work / f"{name}.yaml", base, **settings)


def _launch(work: Path, recipe: Path, name: str, timeout: float = 600):
    args = [MAXENT_GRPO, "run", "--config", str(recipe), "--run-name", name]
    return run(args, cwd=work, timeout=timeout)


def _wait_for(predicate, timeout: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory, tiny_model) -> RealRuns:
    """One run in each state, made for real; shared by the tests below (~3-5 min on 2 CPUs)."""
    work = tmp_path_factory.mktemp("runs")
    (work / "logs").mkdir()
    runs = RealRuns(work)
    start = time.monotonic()

    # Completed: the launcher, to the end.
    result = _launch(work, _recipe(work, "done", tiny_model), "done")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs.seconds["done"] = time.monotonic() - start

    # Killed: a trainer whose output goes to a train log (as the launcher does it), killed
    # with SIGKILL (process group) once a complete checkpoint exists.
    start = time.monotonic()
    recipe = _recipe(work, "killed", tiny_model, max_steps=400, save_steps=2)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with open(work / "logs" / f"killed_{stamp}_train.log", "ab") as log:
        proc = subprocess.Popen(
            [PYTHON, GRPO, "--config", str(recipe)],
            cwd=work,
            env=child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        marker = work / "outputs" / "killed" / "checkpoint-2" / CHECKPOINT_MARKER
        _wait_for(marker.is_file, 300, "checkpoint-2", proc)
        runs.snapshots["killed-live"] = runs.table()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    runs.seconds["killed"] = time.monotonic() - start

    # A user error in the recipe, through the launcher.
    start = time.monotonic()
    bad = _recipe(work, "bad", tiny_model, num_generations=3, per_device_train_batch_size=4)
    runs.results["bad"] = _launch(work, bad, "bad", timeout=300)
    runs.seconds["bad"] = time.monotonic() - start

    # Failed in training: the recipe's model cannot be loaded (weights cut short).
    start = time.monotonic()
    broken = work / "broken-model"
    broken.mkdir()
    for path in tiny_model.iterdir():
        if path.is_file():
            data = path.read_bytes()
            (broken / path.name).write_bytes(data[:100] if path.suffix == ".safetensors" else data)
    recipe = _recipe(work, "failed", tiny_model, model_name_or_path=str(broken))
    runs.results["failed"] = _launch(work, recipe, "failed")
    runs.seconds["failed"] = time.monotonic() - start

    # Stopped, then resumed: 2 training processes; the stop-request file after step 1.
    start = time.monotonic()
    recipe = _recipe(work, "resumed", tiny_model, max_steps=6, save_steps=10, num_processes=2)
    args = [MAXENT_GRPO, "run", "--config", str(recipe), "--run-name", "resumed"]
    with open(work / "resumed-1.out", "wb") as out:
        launcher = subprocess.Popen(
            args, cwd=work, env=child_env(), stdout=out, stderr=subprocess.STDOUT
        )
    try:

        def logged_a_step() -> bool:
            return any("{'loss'" in p.read_text() for p in work.glob("logs/resumed_*_train.log"))

        _wait_for(logged_a_step, 300, "step 1 of resumed", launcher)
        request_stop(work / "outputs" / "resumed", "test: stop request")
        runs.snapshots["resumed-stopping"] = runs.table()
        launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    runs.results["resumed-1"] = launcher.returncode
    runs.snapshots["resumed-stopped"] = runs.table()
    time.sleep(1.1)  # the next attempt's log gets another time stamp
    runs.results["resumed-2"] = _launch(work, recipe, "resumed")
    runs.seconds["resumed"] = time.monotonic() - start
    print(f"real runs made in {runs.seconds}")
    return runs


@pytest.mark.integration
def test_completed_run(real_runs):
    done = real_runs.table()["done"]
    assert (done.state, done.method, done.attempts, done.jobs) == ("completed", "grpo", 1, [])
    assert (done.step, done.max_steps, done.checkpoint) == (4, 4, "checkpoint-4")
    last = [e for e in log_history(real_runs.work / "outputs" / "done") if "reward" in e][-1]
    assert done.reward == last["reward"]
    assert 0 <= done.age(time.time()) < 3600


@pytest.mark.integration
def test_running_then_killed_run(real_runs):
    live = real_runs.snapshots["killed-live"]["killed"]
    assert live.state == "running" and live.reason == ""  # a live process holds its log
    assert live.checkpoint is not None and live.max_steps == 400
    killed = real_runs.table()["killed"]
    assert (killed.state, killed.reason, killed.method) == ("failed", KILLED, "grpo")
    assert killed.checkpoint is not None and int(killed.checkpoint.split("-")[1]) >= 2
    assert killed.step >= int(killed.checkpoint.split("-")[1]) and killed.max_steps == 400


@pytest.mark.integration
def test_bad_recipe_through_the_launcher(real_runs):
    result = real_runs.results["bad"]
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "num_generations" in line
    rows = real_runs.table()
    # The launcher writes the error line into the attempt's train log.
    assert (rows["bad"].state, rows["bad"].reason) == ("failed", line)


@pytest.mark.integration
def test_failed_run_reports_the_exception_line(real_runs):
    assert real_runs.results["failed"].returncode != 0
    failed = real_runs.table()["failed"]
    assert failed.state == "failed"
    assert "SafetensorError" in failed.reason, failed.reason
    assert failed.reason.count("\n") == 0 and failed.method == "grpo"
    assert failed.checkpoint is None and failed.attempts == 1


@pytest.mark.integration
def test_stopped_then_resumed_run(real_runs):
    stopping = real_runs.snapshots["resumed-stopping"]["resumed"]
    assert (stopping.state, stopping.reason) == ("running", "stop requested")
    assert real_runs.results["resumed-1"] != 0
    stopped = real_runs.snapshots["resumed-stopped"]["resumed"]
    assert stopped.state == "stopped", stopped
    step = int(stopped.checkpoint.split("-")[1])
    assert stopped.reason.startswith(f"Stopped on request after step {step}")
    assert 1 <= step < 6 and stopped.step == step

    second = real_runs.results["resumed-2"]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = real_runs.table()["resumed"]
    assert (resumed.state, resumed.attempts, resumed.step, resumed.max_steps) == (
        "completed",
        2,
        6,
        6,
    )
    first, second = sorted((real_runs.work / "logs").glob("resumed_*_train.log"))
    assert summarize_log(first.read_text()).resumed_from is None
    assert summarize_log(second.read_text()).resumed_from == step


@pytest.mark.integration
def test_runs_command_prints_every_run(real_runs):
    start = time.monotonic()
    result = run([MAXENT_GRPO, "runs"], cwd=real_runs.work, timeout=60)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    print(result.stdout, f"({elapsed:.2f}s)")
    states = {line.split()[0]: line.split()[2] for line in result.stdout.splitlines()[1:]}
    assert states == {
        "done": "completed",
        "killed": "failed",
        "failed": "failed",
        "resumed": "completed",
    } or states == {
        **{"done": "completed", "killed": "failed", "failed": "failed"},
        **{"resumed": "completed", "bad": "failed"},
    }


@pytest.mark.integration
def test_plot_of_a_real_run(real_runs):
    work = real_runs.work
    result = run([MAXENT_GRPO, "plot", "resumed", "--out", "plots/resumed.png"], cwd=work)
    assert result.returncode == 0, result.stderr
    png, table = work / "plots" / "resumed.png", work / "plots" / "resumed.csv"
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and 10_000 < len(data) < 300_000
    assert "resumed from checkpoint" not in result.stdout  # said in the picture's title
    with open(table) as handle:
        rows = list(csv.DictReader(handle))
    header = list(rows[0])
    for key in (
        "step",
        "reward",
        "rewards/answer_match/mean",
        "rewards/format/mean",
        "rewards/tag_count/mean",
        "entropy",
        "completions/mean_length",
    ):
        assert key in header, (key, header)
    # Exactly the logged numbers: every cell reads back as the trainer_state.json float.
    history = [e for e in log_history(work / "outputs" / "resumed") if "loss" in e]
    assert [int(r["step"]) for r in rows] == [e["step"] for e in history] == [1, 2, 3, 4, 5, 6]
    for row, entry in zip(rows, history, strict=True):
        for key in header:
            assert float(row[key]) == entry[key], (row["step"], key)

    from maxent_grpo.runs.plot import resume_points

    stopped = real_runs.snapshots["resumed-stopped"]["resumed"]
    step = int(stopped.checkpoint.split("-")[1])
    assert [s for s, _ in resume_points("resumed", [work / "logs"])] == [step]


@pytest.mark.integration
def test_maxent_run_is_named_and_plotted(tmp_path, tiny_model):
    if not (REPO / "src" / "maxent-grpo.py").is_file():
        pytest.skip("no MaxEnt entry point")
    recipe = _recipe(tmp_path, "mx", tiny_model, base=SMOKE_MAXENT, max_steps=3, save_steps=3)
    result = run(
        [MAXENT_GRPO, "run", "--method", "maxent", "--config", str(recipe), "--run-name", "mx"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (row,) = collect_runs([tmp_path / "outputs", tmp_path / "logs"])
    assert (row.run, row.method, row.state, row.step) == ("mx", "maxent", "completed", 3)
    plotted = run([MAXENT_GRPO, "plot", "mx"], cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "mx.png").read_bytes().startswith(PNG_SIGNATURE)
    header = (tmp_path / "mx.csv").read_text().splitlines()[0].split(",")
    for key in ("maxent/weight_entropy", "maxent/ess", "maxent/beta", "maxent/tau"):
        assert key in header, header


def test_plot_says_what_is_missing(tmp_path):
    from maxent_grpo.errors import UserError
    from maxent_grpo.runs.plot import plot_run

    with pytest.raises(UserError, match="no such run"):
        plot_run("nope", outputs=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="nothing to plot yet"):
        plot_run("empty", outputs=tmp_path)
