"""`maxent-grpo sbatch --rehearse` on the real test cluster: a recipe that `check` accepts but
whose rehearsal fails (a reward that raises on some of the recipe's rows) is not queued.

`sbatch` without --rehearse would queue it (check passes: the reward loads); with it, the
rehearsal runs first on this machine (docs/rehearse.md), its passport names the reward, and
the controller knows no new job afterwards.
"""

from __future__ import annotations

import subprocess

from helpers.paths import MAXENT_GRPO, REPO
from helpers.recipes import ONE_THREAD, SMOKE, write_recipe


def known_jobs(cluster) -> set[str]:
    shown = cluster.run(["scontrol", "show", "job", "-o"])
    return {w.split("=", 1)[1] for w in shown.stdout.split() if w.startswith("JobId=")}


def test_sbatch_rehearse_queues_nothing_when_a_row_fails(slurm_cluster, tmp_path, tiny_model):
    recipe = write_recipe(
        tmp_path,
        SMOKE,
        **ONE_THREAD,
        reward_funcs=["answer_match", "tests.helpers.rehearse_rewards:raises_on_odd"],
        reward_weights=[1.0, 1.0],
    )
    before = known_jobs(slurm_cluster)
    command = [MAXENT_GRPO, "sbatch", "--rehearse", "--config", str(recipe), "--gpus", "1"]
    command += ["--cpus-per-task", "2", "--mem", "2G", "--time", "10"]
    env = {**slurm_cluster.env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-4000:]
    assert "fix: reward tests.helpers.rehearse_rewards:raises_on_odd:" in result.stdout, out
    assert "not queued: the rehearsal of" in result.stderr
    assert "submitted job" not in out
    assert known_jobs(slurm_cluster) == before
