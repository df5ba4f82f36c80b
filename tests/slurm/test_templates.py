"""The sbatch templates of slurm/, submitted as users submit them (from the repository root),
CPU-sized: the smoke recipe trains on CPU (use_cpu) inside the test cluster's fake-GPU nodes.

Their headers are used as written (CPUs, memory, time, signal, requeue, logs) except for the
output files, which go under the test's folder; the multi-node template runs on one node here
(tests/slurm/test_multinode.py runs it on two)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.recipes import small_recipe

pytestmark = pytest.mark.slurm


def submit_template(cluster, tmp_path: Path, template: str, *sbatch_args: str) -> str:
    args = [
        *sbatch_args,
        f"--output={tmp_path}/slurm_%A_%a.out",
        f"--error={tmp_path}/slurm_%A_%a.err",
        f"slurm/{template}",
        "--config",
        # One trainer process: the templates' headers are what is tested, not the training.
        str(small_recipe(tmp_path, max_steps=6, max_completion_length=16, num_processes=1)),
        "--logs-dir",
        str(tmp_path / "logs"),
    ]
    return cluster.submit(args, cwd=REPO)


def read_all(tmp_path: Path, suffix: str) -> str:
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob(f"slurm_*{suffix}")))


def assert_completed_run(tmp_path: Path) -> None:
    assert (tmp_path / "out" / "maxent_grpo_training_complete.json").is_file(), read_all(
        tmp_path, ".out"
    )[-3000:]


def test_retry_chain_runs_once_and_the_later_tasks_exit_at_once(slurm_cluster, tmp_path):
    job = submit_template(slurm_cluster, tmp_path, "retry-chain.sbatch")
    assert slurm_cluster.wait(job, timeout=420) == "COMPLETED", read_all(tmp_path, ".out")[-3000:]
    records = slurm_cluster.job_records(job)
    assert sorted(r["ArrayTaskId"] for r in records) == ["0", "1", "2", "3"], records
    assert all(r["MinCPUsNode"] == "32" for r in records), records  # the header, as written
    assert_completed_run(tmp_path)
    outs = sorted(tmp_path.glob("slurm_*.out"))
    assert len(outs) == 4, outs  # one per task (%A_%a)
    assert sum("already holds a completed run" in p.read_text() for p in outs) == 3
    errs = sorted(tmp_path.glob("slurm_*.err"))
    assert len(errs) == 4 and all("training.sh: job" in p.read_text() for p in errs), errs


@pytest.mark.parametrize(
    "template, extra",
    [("preemptible.sbatch", ("--partition=debug",)), ("multinode.sbatch", ("--nodes=1",))],
)
def test_template_trains_to_completion(slurm_cluster, tmp_path, template, extra):
    job = submit_template(slurm_cluster, tmp_path, template, *extra)
    assert slurm_cluster.wait(job, timeout=300) == "COMPLETED", read_all(tmp_path, ".out")[-3000:]
    assert_completed_run(tmp_path)
    (record,) = slurm_cluster.job_records(job)
    assert record["Requeue"] == "1" and record["MinCPUsNode"] == "32", record
    assert "training.sh: job" in read_all(tmp_path, ".err")
