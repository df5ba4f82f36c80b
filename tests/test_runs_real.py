"""`maxent-grpo runs` and `maxent-grpo plot` on runs made for real on the tiny model, through
the launcher and the trainer, in every state (integration: about 30 s on 2 CPUs). The same
reader on synthetic event logs: tests/test_runs.py."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.paths import MAXENT_GRPO, PYTHON, REPO, SMOKE, SMOKE_MAXENT
from helpers.procs import wait_for
from helpers.recipes import ONE_THREAD, small_recipe
from helpers.runs import child_env, log_history, run
from maxent_grpo.rundir.checkpoints import CHECKPOINT_MARKER, request_stop
from maxent_grpo.rundir.events import read_events
from maxent_grpo.runs import KILLED, collect_runs
from maxent_grpo.runs.state import resume_points

GRPO = str(REPO / "src" / "grpo.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The stopped run's length: the stop request, written as soon as step 1 is logged, must land
# before the end (steps take ~0.1-0.15 s; 6 steps lost that race in CI).
RESUMED_STEPS = 30


@dataclass
class RealRuns:
    work: Path
    results: dict = field(default_factory=dict)  # name -> CompletedProcess
    snapshots: dict = field(default_factory=dict)  # label -> {run: RunInfo}
    seconds: dict = field(default_factory=dict)

    def table(self) -> dict:
        return {r.run: r for r in collect_runs([self.work / "outputs", self.work / "logs"])}


def _recipe(work: Path, name: str, tiny_model: Path, base: Path = SMOKE, **keys) -> Path:
    """A small recipe work/NAME.yaml, one process, output in work/outputs/NAME."""
    layout = dict(output_dir=str(work / "outputs" / name), num_processes=1, save_steps=2)
    layout.update(ONE_THREAD)
    # The step length the stop-request race of _stopped_then_resumed_run was sized with.
    layout.update(max_completion_length=16)
    return small_recipe(work, tiny_model, base, f"{name}.yaml", **{**layout, **keys})


def _launch(work: Path, recipe: Path, name: str, timeout: float = 600):
    args = [MAXENT_GRPO, "run", "--config", str(recipe), "--run-name", name]
    return run(args, cwd=work, timeout=timeout)


def _killed_run(work: Path, tiny_model: Path, runs: RealRuns) -> None:
    """A trainer alone, whose output goes to a train log (as the launcher does it), killed with
    SIGKILL (process group) once a complete checkpoint exists."""
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
        # (any: at a few steps a second, checkpoint-2 may be rotated away between two looks)
        out = work / "outputs" / "killed"
        wait_for(
            lambda: any(out.glob(f"checkpoint-*/{CHECKPOINT_MARKER}")), 300, "a save", proc=proc
        )
        runs.snapshots["killed-live"] = runs.table()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _broken_model(work: Path, tiny_model: Path) -> Path:
    """The tiny model with its weights cut short: loading it fails in training."""
    broken = work / "broken-model"
    broken.mkdir()
    for path in tiny_model.iterdir():
        if path.is_file():
            data = path.read_bytes()
            (broken / path.name).write_bytes(data[:100] if path.suffix == ".safetensors" else data)
    return broken


def _stopped_then_resumed_run(work: Path, tiny_model: Path, runs: RealRuns) -> None:
    """The stop-request file after step 1; the same command again. One training process, as
    the other runs here: the table reads the run's files, the same for any process count, and
    a second trainer in each of the two attempts cost ~14 CPU-s (2-process stops and resumes:
    test_state_registry.py, reliability/test_graceful_stop.py)."""
    recipe = _recipe(work, "resumed", tiny_model, max_steps=RESUMED_STEPS, save_steps=100)
    args = [MAXENT_GRPO, "run", "--config", str(recipe), "--run-name", "resumed"]
    with open(work / "resumed-1.out", "wb") as out:
        launcher = subprocess.Popen(
            args, cwd=work, env=child_env(), stdout=out, stderr=subprocess.STDOUT
        )
    try:

        def logged_a_step() -> bool:
            events = read_events(work / "outputs" / "resumed")
            return any(e["event"] == "step" for e in events)

        wait_for(logged_a_step, 300, "step 1 of resumed", poll=0.05, proc=launcher)
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


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory, tiny_model) -> RealRuns:
    """One run in each state and a maxent run, made for real; shared by the tests below."""
    work = tmp_path_factory.mktemp("runs")
    (work / "logs").mkdir()
    runs = RealRuns(work)

    def timed(name: str, make) -> None:
        start = time.monotonic()
        make()
        runs.seconds[name] = time.monotonic() - start

    def done() -> None:  # the launcher, to the end
        result = _launch(work, _recipe(work, "done", tiny_model), "done")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    def bad() -> None:  # a user error in the recipe, through the launcher
        recipe = _recipe(work, "bad", tiny_model, num_generations=3, per_device_train_batch_size=4)
        runs.results["bad"] = _launch(work, recipe, "bad", timeout=300)

    def failed() -> None:  # failed in training: the model cannot be loaded
        model = str(_broken_model(work, tiny_model))
        recipe = _recipe(work, "failed", tiny_model, model_name_or_path=model)
        runs.results["failed"] = _launch(work, recipe, "failed")

    def maxent() -> None:  # the other method, in a folder of its own (its only run)
        folder = work / "maxent"
        folder.mkdir()
        recipe = _recipe(folder, "mx", tiny_model, base=SMOKE_MAXENT, max_steps=3, save_steps=3)
        args = [MAXENT_GRPO, "run", "--method", "maxent", "--config", str(recipe)]
        runs.results["mx"] = run([*args, "--run-name", "mx"], cwd=folder)

    # The one-process runs are independent: two at a time, one thread each (ONE_THREAD in
    # _recipe; the launcher would give a lone trainer both CPUs). The resumed run then alone.
    with ThreadPoolExecutor(2) as pool:
        made = [
            pool.submit(timed, "done", done),
            pool.submit(timed, "failed", failed),
            pool.submit(timed, "maxent", maxent),
            pool.submit(timed, "killed", lambda: _killed_run(work, tiny_model, runs)),
            pool.submit(timed, "bad", bad),
        ]
        for future in made:
            future.result()
    timed("resumed", lambda: _stopped_then_resumed_run(work, tiny_model, runs))
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
    killed = real_runs.table()["killed"]  # a trainer alone writes steps, not an outcome
    assert (killed.state, killed.reason, killed.method) == ("failed", KILLED, "grpo")
    assert killed.checkpoint is not None and int(killed.checkpoint.split("-")[1]) >= 2
    assert killed.step >= int(killed.checkpoint.split("-")[1]) and killed.max_steps == 400


@pytest.mark.integration
def test_bad_recipe_through_the_launcher(real_runs):
    result = real_runs.results["bad"]
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "num_generations" in line
    # A start refused before anything ran leaves no run behind (issue 26.4).
    assert "bad" not in real_runs.table()


@pytest.mark.integration
def test_failed_run_reports_the_exception_line(real_runs):
    assert real_runs.results["failed"].returncode != 0
    failed = real_runs.table()["failed"]
    assert (failed.state, failed.outcome) == ("failed", "crash")
    assert failed.reason and failed.reason.count("\n") == 0 and failed.method == "grpo"
    assert failed.checkpoint is None and failed.attempts == 1


@pytest.mark.integration
def test_stopped_then_resumed_run(real_runs):
    stopping = real_runs.snapshots["resumed-stopping"]["resumed"]
    assert (stopping.state, stopping.reason) == ("running", "stop requested")
    assert real_runs.results["resumed-1"] != 0
    stopped = real_runs.snapshots["resumed-stopped"]["resumed"]
    assert (stopped.state, stopped.outcome) == ("stopped", "stopped"), stopped
    step = int(stopped.checkpoint.split("-")[1])
    assert stopped.reason and "\n" not in stopped.reason
    assert 1 <= step < RESUMED_STEPS and stopped.step == step

    second = real_runs.results["resumed-2"]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = real_runs.table()["resumed"]
    assert (resumed.state, resumed.attempts, resumed.step, resumed.max_steps) == (
        "completed",
        2,
        RESUMED_STEPS,
        RESUMED_STEPS,
    )
    assert resumed.resumed_from == [step] and resumed.outcome == "completed"


@pytest.mark.integration
def test_runs_command_prints_every_run(real_runs):
    start = time.monotonic()
    result = run([MAXENT_GRPO, "runs"], cwd=real_runs.work, timeout=60)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    print(result.stdout, f"({elapsed:.2f}s)")
    states = {line.split()[0]: line.split()[2] for line in result.stdout.splitlines()[1:]}
    assert states == {
        **{"done": "completed", "killed": "failed", "failed": "failed"},
        **{"resumed": "completed"},
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
    assert "from " + str(Path("outputs") / "resumed" / "events.jsonl") in result.stdout
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
    assert [int(r["step"]) for r in rows] == [e["step"] for e in history]
    assert [e["step"] for e in history] == list(range(1, RESUMED_STEPS + 1))
    for row, entry in zip(rows, history, strict=True):
        for key in header:
            assert float(row[key]) == entry[key], (row["step"], key)

    stopped = real_runs.snapshots["resumed-stopped"]["resumed"]
    step = int(stopped.checkpoint.split("-")[1])
    assert resume_points(list(read_events(work / "outputs" / "resumed"))) == [step]


@pytest.mark.integration
def test_maxent_run_is_named_and_plotted(real_runs):
    folder = real_runs.work / "maxent"
    result = real_runs.results["mx"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (row,) = collect_runs([folder / "outputs", folder / "logs"])
    assert (row.run, row.method, row.state, row.step) == ("mx", "maxent", "completed", 3)
    plotted = run([MAXENT_GRPO, "plot", "mx"], cwd=folder)
    assert plotted.returncode == 0, plotted.stderr
    # by default beside the run's output, not in the directory the command ran in
    assert (folder / "outputs" / "mx" / "mx.png").read_bytes().startswith(PNG_SIGNATURE)
    header = (folder / "outputs" / "mx" / "mx.csv").read_text().splitlines()[0].split(",")
    for key in ("maxent/weight_entropy", "maxent/ess", "maxent/beta", "maxent/tau"):
        assert key in header, header
