"""`maxent-grpo sweep`, the queue in `maxent-grpo runs` and `sbatch --chain` on the real test
cluster. The sweep: a 2x2 grid (the recipe's `sweep:` section and --grid, merged) as one
throttled array, one point
failing on purpose (its reward module cannot be loaded on that point only: a user error, not
retried), the other three finish.

What it shows: one `sbatch --array=0-3%2`, each task trains its own point in its own run
directory; point 0 fails first, and the tasks that start after it still run (a sweep task
remembers a user error for its point alone: launch/slurm.py user_error_marker; a retry array
would stop its later tasks); `maxent-grpo runs --sweep` shows which point failed and why and
each finished point's final and best reward; `plot --sweep` draws the three that trained.
"""

from __future__ import annotations

import json
import subprocess

from helpers.paths import MAXENT_GRPO, REPO
from helpers.recipes import ONE_THREAD, small_recipe
from helpers.runs import sbatch_chain, slurm_logs
from maxent_grpo.rundir.events import read_events

GRID = "learning_rate=[1e-3,2e-3]"  # merged with the recipe's sweep: section (seed, throttle)


def runs_json(env: dict, *args: str) -> list[dict]:
    """`maxent-grpo runs --json ARGS` against the test cluster."""
    listed = subprocess.run(
        [MAXENT_GRPO, "runs", "--json", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    return json.loads(listed.stdout)


def test_sweep_2x2_array_one_point_fails_the_others_finish(slurm_cluster, tmp_path):
    recipe = small_recipe(
        tmp_path,
        **ONE_THREAD,
        num_processes=1,  # a trainer process per point is enough to tell the points apart
        max_steps=2,
        max_completion_length=8,
        reward_funcs=["digit_fraction", "tests.helpers.sweep_rewards:constant"],
        reward_weights=[1.0, 1.0],
        sweep={"grid": {"seed": [1, 2]}, "throttle": 2},
    )
    env = {
        **slurm_cluster.env,
        # training.sh's header writes logs/slurm_%j.* in the repository; these win over it.
        "SBATCH_OUTPUT": f"{tmp_path}/slurm_%A_%a.out",
        "SBATCH_ERROR": f"{tmp_path}/slurm_%A_%a.err",
    }
    command = [MAXENT_GRPO, "sweep", "--config", str(recipe), "--grid", GRID, "--name", "sw"]
    command += ["--gpus", "1", "--cpus-per-task", "2", "--mem", "2G", "--time", "10"]
    command += ["--logs-dir", str(tmp_path / "logs")]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sweep sw: 4 point(s), all checked" in result.stdout
    job = result.stdout.split("submitted array job ")[1].split()[0]
    tasks = slurm_cluster.job_records(job)
    assert {r.get("ArrayTaskThrottle") for r in tasks} == {"2"}

    # Before any task has written anything, `runs --sweep` shows every point from the queue;
    # the throttle holds two of them back.
    queued = runs_json(env, "--dir", str(tmp_path), "--sweep", "sw")
    names = [f"sw-seed={s}-learning_rate={lr}" for s in (1, 2) for lr in ("1e-3", "2e-3")]
    assert [r["run"] for r in queued] == names
    assert all(r["jobs"] == [job] for r in queued), queued
    assert any(r["reason"].startswith("queued (JobArrayTaskLimit)") for r in queued), queued

    slurm_cluster.wait(job, timeout=600, poll=2)
    states = {r["ArrayTaskId"]: r["JobState"] for r in slurm_cluster.job_records(job)}
    err = "\n".join(p.read_text() for p in sorted(tmp_path.glob("slurm_*.err")))
    assert states == {"0": "FAILED", "1": "COMPLETED", "2": "COMPLETED", "3": "COMPLETED"}, err

    for name in names[1:]:
        assert (tmp_path / name / "model.safetensors").is_file(), name
    settings = json.loads((tmp_path / names[3] / "run_settings.json").read_text())
    assert settings["values"]["learning_rate"] == 2e-3 and settings["values"]["seed"] == 2

    listed = runs_json(env, "--dir", str(tmp_path), "--dir", str(tmp_path / "logs"))
    runs = {r["run"]: r for r in listed}
    assert {runs[n]["state"] for n in names[1:]} == {"completed"}, listed
    failed = runs[names[0]]
    assert failed["state"] == "failed" and failed["outcome"] == "user_error", failed
    assert "point 0 cannot load this reward" in failed["reason"], failed

    # The points side by side: final and best reward of each finished point, from its events.
    compared = runs_json(env, "--dir", str(tmp_path), "--sweep", "sw")
    assert [r["index"] for r in compared] == [0, 1, 2, 3]
    assert compared[0]["outcome"] == "user_error" and compared[0]["best"] is None
    for row in compared[1:]:
        rewards = [
            e["metrics"]["reward"]
            for e in read_events(tmp_path / row["run"])
            if e["event"] == "step" and "reward" in e["metrics"]
        ]
        assert row["metric"] == "reward" and row["final"]["value"] == rewards[-1], row
        assert row["best"]["value"] == max(rewards) and row["values"]["seed"] in ("1", "2")
    plotted = subprocess.run(
        [MAXENT_GRPO, "plot", "--sweep", "sw", "--outputs", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plotted.returncode == 0, plotted.stderr
    assert "(3 run(s): reward)" in plotted.stdout and (tmp_path / "sw.png").is_file()
    assert "not plotted (nothing logged yet): seed=1 learning_rate=1e-3" in plotted.stdout
    table = subprocess.run(
        [MAXENT_GRPO, "runs", "--dir", str(tmp_path), "--sweep", "sw"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(table.stdout)


def test_a_held_job_is_in_runs_before_it_has_written_anything(slurm_cluster, tmp_path):
    """A job held in the queue (`sbatch --hold`), named as `maxent-grpo sbatch` names it
    (tests/test_sweep.py), is a `pending` row of `runs` with Slurm's reason."""
    recipe = small_recipe(tmp_path, **ONE_THREAD, output_dir=str(tmp_path / "held-run"))
    args = ["--hold", "--job-name=maxent-grpo:held-run", f"--output={tmp_path}/slurm_%j.out"]
    args += ["--gres=gpu:1", "--cpus-per-task=1", "--mem=1G", "training.sh"]
    job = slurm_cluster.submit([*args, "--config", str(recipe)], cwd=REPO)
    try:
        rows = {r["run"]: r for r in runs_json(slurm_cluster.env, "--dir", str(tmp_path))}
        assert rows["held-run"]["state"] == "pending", rows
        assert rows["held-run"]["reason"] == "queued (JobHeldUser)"
        assert rows["held-run"]["jobs"] == [job]
        assert not (tmp_path / "held-run").exists()  # nothing written: the queue alone says it
    finally:
        slurm_cluster.cancel(job)


def test_chain_runs_the_second_job_from_the_first_runs_model(slurm_cluster, tmp_path):
    """`sbatch --config A --chain B`: B waits (Dependency) until A finished, then starts from
    A's final model (B's init_from names A's run directory, which does not exist yet)."""
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    one = dict(**ONE_THREAD, num_processes=1)  # the chain is the same with one trainer process
    first = small_recipe(tmp_path, name="a.yaml", **one, output_dir=str(first_dir))
    second = small_recipe(
        tmp_path,
        name="b.yaml",
        **one,
        output_dir=str(second_dir),
        init_from=str(first_dir),
        max_steps=2,
    )
    env, jobs = sbatch_chain(slurm_cluster, tmp_path, first, second)
    rows = {r["run"]: r for r in runs_json(env, "--dir", str(tmp_path))}
    assert rows["second"]["state"] == "pending" and "(Dependency)" in rows["second"]["reason"]

    assert slurm_cluster.wait(jobs[1], timeout=600, poll=2) == "COMPLETED", slurm_logs(tmp_path)
    (event,) = [e for e in read_events(second_dir) if e["event"] == "init_from"]
    assert event["path"] == str(first_dir)
    assert (second_dir / "model.safetensors").is_file()
