"""SFT then GRPO on the real test cluster: `maxent-grpo sbatch --config sft.yaml --chain
grpo.yaml`, the GRPO recipe's init_from naming the SFT run's directory (not there yet when both
are queued). Both jobs complete; the GRPO run starts from the SFT model and its settings
(run_settings.json) and events record it."""

from __future__ import annotations

import json

import yaml

from helpers.paths import REPO
from helpers.recipes import ONE_THREAD, small_recipe
from helpers.runs import sbatch_chain, slurm_logs
from maxent_grpo.rundir.checkpoints import RUN_MARKER
from maxent_grpo.rundir.events import read_events
from maxent_grpo.rundir.settings import read_settings

SMOKE_SFT = REPO / "recipes" / "smoke" / "config_sft.yaml"


def test_sft_then_grpo_chain_starts_grpo_from_the_sft_model(slurm_cluster, tmp_path):
    sft_dir, grpo_dir = tmp_path / "sft", tmp_path / "grpo"
    sft = tmp_path / "sft.yaml"
    one = dict(**ONE_THREAD, num_processes=1)  # the chain is the same with one trainer process
    sft_keys = dict(output_dir=str(sft_dir), max_steps=4, dataset_num_rows=64, **one)
    sft.write_text(yaml.safe_dump({**yaml.safe_load(SMOKE_SFT.read_text()), **sft_keys}))
    grpo = small_recipe(
        tmp_path, name="grpo.yaml", **one, output_dir=str(grpo_dir), init_from=str(sft_dir)
    )
    _, jobs = sbatch_chain(slurm_cluster, tmp_path, sft, grpo)
    assert slurm_cluster.wait(jobs[0], timeout=600, poll=2) == "COMPLETED", slurm_logs(tmp_path)
    assert slurm_cluster.wait(jobs[1], timeout=600, poll=2) == "COMPLETED", slurm_logs(tmp_path)
    marker = json.loads((sft_dir / RUN_MARKER).read_text())
    assert marker["method"] == "sft" and marker["global_step"] == 4
    settings = read_settings(grpo_dir)
    assert settings is not None and settings.method == "grpo"
    assert settings.values["model_name_or_path"] == str(sft_dir)
    assert f"--model_name_or_path={sft_dir}" in settings.overrides
    (event,) = [e for e in read_events(grpo_dir) if e["event"] == "init_from"]
    assert event["path"] == str(sft_dir)
    assert (grpo_dir / RUN_MARKER).is_file()
