"""Runs side by side: `maxent-grpo runs --sweep NAME` (runs/compare.py), `maxent-grpo plot
--sweep NAME` / `plot RUN RUN ...` (runs/overlay.py), and runs without a reward (SFT: TRL's
SFTTrainer logs `loss` and `mean_token_accuracy`). Run directories are written here with the
event log's own writer (`emit`), as the launcher and trainers write them."""

from __future__ import annotations

import csv
import json
import socket
from pathlib import Path

import pytest

from maxent_grpo import cli
from maxent_grpo.rundir.checkpoints import RUN_MARKER
from maxent_grpo.rundir.events import emit
from maxent_grpo.rundir.sweeps import Point, write_points
from maxent_grpo.runs import collect_runs, format_table

HOST = socket.gethostname()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _attempt(out: Path, n: int = 1, method: str = "grpo", job: str = "40") -> None:
    emit(out, "attempt_start", method=method, recipe="r.yaml", job=job, attempt=n, host=HOST)


def _rl_steps(out: Path, rewards: list[float], first: int = 1, max_steps: int = 4) -> None:
    for step, reward in enumerate(rewards, start=first):
        metrics = {"loss": 0.01, "reward": reward, "entropy": 5.0}
        emit(out, "step", step=step, metrics=metrics, max_steps=max_steps)


def _sft_steps(out: Path, losses: list[float], max_steps: int = 4) -> None:
    """What TRL's SFTTrainer logs per step, then the end-of-training log (train_loss, ...)."""
    for step, loss in enumerate(losses, start=1):
        metrics = {"loss": loss, "grad_norm": 1.5, "learning_rate": 1e-5, "entropy": 2.0}
        metrics |= {"num_tokens": 512.0 * step, "mean_token_accuracy": 0.5 + step / 100}
        emit(out, "step", step=step, metrics={**metrics, "epoch": step / 4}, max_steps=max_steps)
    end = {"train_runtime": 3.0, "train_loss": sum(losses) / len(losses), "epoch": 1.0}
    emit(out, "step", step=len(losses), metrics=end, max_steps=max_steps)


def _complete(out: Path, step: int, method: str = "grpo") -> None:
    emit(out, "outcome", outcome="completed", reason="", code=0, step=step, requeue=None)
    (out / RUN_MARKER).write_text(json.dumps({"method": method, "global_step": step}))


def make_sweep(root: Path) -> list[Point]:
    """A 2x2 sweep: point 0 failed (user error), point 1 completed with a benchmark score and a
    resumed attempt, point 2 never started, point 3 completed."""
    values = [{"learning_rate": lr, "seed": s} for lr in ("1e-3", "2e-3") for s in ("1", "2")]
    names = ["sw-" + "-".join(f"{k}={v}" for k, v in v.items()) for v in values]
    points = [Point(name, str(root / name), v) for name, v in zip(names, values)]
    write_points(root / "sw.sweep.json", {"sweep": "sw"}, points)
    p0, p1, p3 = (Path(points[i].output_dir) for i in (0, 1, 3))
    _attempt(p0)
    emit(p0, "outcome", outcome="user_error", reason="r.yaml: cannot load reward 'x'", code=2,
         step=None, requeue=None)  # fmt: skip
    _attempt(p1)
    _rl_steps(p1, [0.1, 0.9, 0.5])  # steps 1-3; checkpoint-2 complete, then preempted
    emit(p1, "checkpoint", step=2, path=str(p1 / "checkpoint-2"))
    emit(p1, "outcome", outcome="preempted", reason="SIGTERM", code=85, step=2, requeue=None)
    _attempt(p1, n=2)
    _rl_steps(p1, [0.6, 0.7], first=3)  # step 3 again (0.6 replaces 0.5), step 4
    emit(p1, "eval", step=4, benchmark="arithmetic", score=0.25, checkpoint="c", job=None)
    _complete(p1, 4)
    _attempt(p3)
    _rl_steps(p3, [0.2, 0.3, 0.3, 0.1])
    _complete(p3, 4)
    return points


def test_runs_sweep_compares_the_points(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)  # no Slurm here
    make_sweep(tmp_path)
    assert cli.main(["runs", "--dir", str(tmp_path), "--sweep", "sw"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "sweep sw: 4 point(s); REWARD: the last logged reward; BEST: the highest @ its step"
    )
    assert [line.split() for line in lines[1:]] == [
        ["#", "learning_rate", "seed", "STATE", "STEP", "REWARD", "BEST", "arithmetic", "DETAIL"],
        ["0", "1e-3", "1", "failed", "-", "-", "-", "-",
         *"user_error: r.yaml: cannot load reward 'x'".split()],
        ["1", "1e-3", "2", "completed", "4/4", "0.7", "0.9@2", "0.25@4",
         *"attempts: 1 preempted, 1 completed".split()],
        ["2", "2e-3", "1", "not", "started", "-", "-", "-", "-",
         *"not queued and nothing written".split()],
        ["3", "2e-3", "2", "completed", "4/4", "0.1", "0.3@2", "-"],
    ]  # fmt: skip
    assert cli.main(["runs", "--dir", str(tmp_path), "--sweep", "sw", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["values"] == {"learning_rate": "1e-3", "seed": "2"}
    assert (rows[1]["metric"], rows[1]["final"], rows[1]["best"]) == (
        "reward",
        {"step": 4, "value": 0.7},
        {"step": 2, "value": 0.9},
    )
    assert rows[1]["attempts"] == 2 and rows[1]["evals"]["arithmetic"]["score"] == 0.25
    assert rows[0]["outcome"] == "user_error" and rows[0]["best"] is None


def test_a_sweep_without_any_step_shows_no_metric_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)
    points = [Point("s-seed=1", str(tmp_path / "s-seed=1"), {"seed": "1"})]
    write_points(tmp_path / "s.sweep.json", {"sweep": "s"}, points)
    assert cli.main(["runs", "--dir", str(tmp_path), "--sweep", "s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "sweep s: 1 point(s); no point has logged a step yet"
    assert lines[1].split() == ["#", "seed", "STATE", "STEP", "DETAIL"]


# ----------------------------------------------------------------------------- without reward


def make_sft(out: Path, losses=(2.0, 1.2, 1.5, 1.4), done: bool = True) -> None:
    _attempt(out, method="sft")
    _sft_steps(out, list(losses))
    if done:
        _complete(out, len(losses), method="sft")


def test_runs_shows_the_loss_of_a_run_without_reward(tmp_path):
    make_sft(tmp_path / "sft")
    bare = tmp_path / "bare"  # no attempt_start, no marker: the method from the metric names
    bare.mkdir()
    _sft_steps(bare, [3.0, 2.5])
    runs = {r.run: r for r in collect_runs([tmp_path], open_logs=set())}
    assert (runs["sft"].method, runs["sft"].reward, runs["sft"].loss) == ("sft", None, 1.4)
    assert runs["bare"].method == "sft" and runs["bare"].loss == 2.5
    table = format_table([runs["sft"]]).splitlines()
    assert table[0].split()[6] == "REWARD" and table[1].split()[6:8] == ["loss", "1.4"]


def test_trainer_state_of_a_run_without_reward_gives_its_loss(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    history = [{"loss": 1.0 / s, "mean_token_accuracy": 0.5, "step": s} for s in (1, 2, 3)]
    (out / "trainer_state.json").write_text(
        json.dumps({"global_step": 3, "max_steps": 3, "log_history": history})
    )
    (run,) = collect_runs([tmp_path], open_logs=set())
    assert (run.step, run.reward, run.loss) == (3, None, pytest.approx(1 / 3))


def test_sweep_of_sft_points_is_judged_by_the_lowest_loss(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)
    points = [Point(f"s-lr={lr}", str(tmp_path / f"s-lr={lr}"), {"lr": lr}) for lr in "12"]
    write_points(tmp_path / "s.sweep.json", {"sweep": "s"}, points)
    make_sft(tmp_path / "s-lr=1")
    make_sft(tmp_path / "s-lr=2", losses=(3.0, 2.0), done=False)
    assert cli.main(["runs", "--dir", str(tmp_path), "--sweep", "s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("LOSS: the last logged loss; BEST: the lowest @ its step")
    assert lines[1].split()[:6] == ["#", "lr", "STATE", "STEP", "LOSS", "BEST"]
    assert lines[2].split()[:6] == ["0", "1", "completed", "4/4", "1.4", "1.2@2"]
    assert lines[3].split()[4:6] == ["2", "2@2"]


# ----------------------------------------------------------------------------- plots


def _long_csv(path: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(label, key) -> [(step, value)] of an overlay's CSV."""
    found: dict[tuple[str, str], list[tuple[int, float]]] = {}
    with open(path) as handle:
        for row in csv.DictReader(handle):
            found.setdefault((row["label"], row["key"]), []).append(
                (int(row["step"]), float(row["value"]))
            )
    return found


def test_plot_sweep_overlays_the_points_labelled_by_their_values(tmp_path, capsys):
    make_sweep(tmp_path)
    assert cli.main(["plot", "--sweep", "sw", "--outputs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"plot: {tmp_path}/sw.png (2 run(s): reward, arithmetic)" in out
    assert (
        "not plotted (nothing logged yet): learning_rate=1e-3 seed=1, learning_rate=2e-3 seed=1"
        in out
    )
    assert (tmp_path / "sw.png").read_bytes().startswith(PNG_SIGNATURE)
    series = _long_csv(tmp_path / "sw.csv")
    assert series == {
        # step 3 of the preempted attempt (0.5) is replaced by the resumed one's (0.6)
        ("learning_rate=1e-3 seed=2", "reward"): [(1, 0.1), (2, 0.9), (3, 0.6), (4, 0.7)],
        ("learning_rate=1e-3 seed=2", "eval/arithmetic"): [(4, 0.25)],
        ("learning_rate=2e-3 seed=2", "reward"): [(1, 0.2), (2, 0.3), (3, 0.3), (4, 0.1)],
    }


def test_plot_of_several_runs_without_reward_overlays_their_loss(tmp_path, capsys):
    make_sft(tmp_path / "a")
    make_sft(tmp_path / "b", losses=(3.0, 2.0))
    png = tmp_path / "p" / "ab.png"
    assert cli.main(["plot", "a", "b", "--outputs", str(tmp_path), "--out", str(png)]) == 0
    assert "(2 run(s): loss)" in capsys.readouterr().out
    assert _long_csv(png.with_suffix(".csv")) == {
        ("a", "loss"): [(1, 2.0), (2, 1.2), (3, 1.5), (4, 1.4)],
        ("b", "loss"): [(1, 3.0), (2, 2.0)],
    }
    assert cli.main(["plot", "--outputs", str(tmp_path)]) == 2  # nothing named


def test_plot_of_a_run_without_reward_draws_its_loss(tmp_path):
    from maxent_grpo.runs.plot import plot_run

    make_sft(tmp_path / "sft")
    png, table, info = plot_run("sft", tmp_path / "sft.png", outputs=tmp_path)
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert info["panels"] == ["Training loss", "Token accuracy", "Policy entropy"]
    with open(table) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["step", "loss", "mean_token_accuracy", "entropy"]
    assert [float(row["loss"]) for row in rows] == [2.0, 1.2, 1.5, 1.4]
