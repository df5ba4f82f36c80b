"""Prove that the single-node Slurm test cluster (tests/slurm/cluster.sh) behaves like the real
clusters the launcher targets: fake GPUs via gres, self-requeue, pre-timeout signals."""

from __future__ import annotations

import stat
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_gres_gpus_are_visible(slurm_cluster, tmp_path):
    out = tmp_path / "gpu.out"
    job = slurm_cluster.submit(
        [
            "-c",
            "1",
            "--gres=gpu:2",
            "-o",
            str(out),
            "--wrap",
            'echo "$CUDA_VISIBLE_DEVICES"; echo "$SLURM_JOB_GPUS"',
        ],
        cwd=tmp_path,
    )
    assert slurm_cluster.wait(job, timeout=30) == "COMPLETED", out.read_text()
    cuda, job_gpus = out.read_text().split()
    ids = cuda.split(",")
    assert len(ids) == 2 and len(set(ids)) == 2 and all(i.isdigit() for i in ids), cuda
    assert len(job_gpus.split(",")) == 2, job_gpus


def test_job_requeues_itself_once(slurm_cluster, tmp_path):
    out = tmp_path / "requeue.out"
    script = _script(
        tmp_path / "requeue.sh",
        """
echo "run restart_count=${SLURM_RESTART_COUNT:-unset}"
if [[ -z "${SLURM_RESTART_COUNT:-}" ]]; then
    scontrol requeue "$SLURM_JOB_ID"
    sleep 120  # killed by the requeue
    exit 1
fi
echo "done restart_count=$SLURM_RESTART_COUNT"
""",
    )
    job = slurm_cluster.submit(
        ["-c", "1", "--requeue", "--open-mode=append", "-o", str(out), str(script)],
        cwd=tmp_path,
    )
    assert slurm_cluster.wait(job, timeout=90) == "COMPLETED", out.read_text()
    lines = out.read_text().splitlines()
    assert "run restart_count=unset" in lines, lines
    assert "run restart_count=1" in lines, lines
    assert lines[-1] == "done restart_count=1", lines
    (record,) = slurm_cluster.job_records(job)
    assert record["Restarts"] == "1", record


def test_signal_before_time_limit(slurm_cluster, tmp_path):
    out = tmp_path / "signal.out"
    marker = tmp_path / "got_usr1"
    script = _script(
        tmp_path / "signal.sh",
        f"""
date +%s > {tmp_path / "started"}
trap 'date +%s > {marker}; kill "$child" 2>/dev/null; exit 0' USR1
sleep 200 &
child=$!
wait "$child"
echo "no signal"
exit 1
""",
    )
    # B: signal only the batch shell; @60 with a 1-minute limit = as soon as the job starts,
    # but slurmctld checks time limits on a 30 s tick.
    job = slurm_cluster.submit(
        ["-c", "1", "--time=1", "--signal=B:USR1@60", "-o", str(out), str(script)],
        cwd=tmp_path,
    )
    assert slurm_cluster.wait(job, timeout=75) == "COMPLETED", out.read_text()
    assert marker.exists(), out.read_text()
    delay = int(marker.read_text()) - int((tmp_path / "started").read_text())
    assert 0 <= delay <= 45, delay


def test_array_job_wait(slurm_cluster, tmp_path):
    job = slurm_cluster.submit(
        [
            "-c",
            "1",
            "--array=0-1",
            "-o",
            str(tmp_path / "arr_%a.out"),
            "--wrap",
            "echo $SLURM_ARRAY_TASK_ID",
        ],
        cwd=tmp_path,
    )
    assert slurm_cluster.wait(f"{job}_1", timeout=30) == "COMPLETED"
    assert slurm_cluster.wait(job, timeout=30) == "COMPLETED"
    assert (tmp_path / "arr_0.out").read_text().strip() == "0"
    assert (tmp_path / "arr_1.out").read_text().strip() == "1"


def test_start_is_idempotent(slurm_cluster):
    t0 = time.monotonic()
    proc = slurm_cluster.cluster("start", timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "already running" in proc.stderr, proc.stderr
    assert elapsed < 10, elapsed
    status = slurm_cluster.cluster("status", timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "idle" in status.stdout or "mix" in status.stdout, status.stdout


def test_env_points_clients_at_state_dir(slurm_cluster):
    assert slurm_cluster.conf.is_file()
    assert slurm_cluster.env["SLURM_CONF"] == str(slurm_cluster.conf)
    proc = subprocess.run(
        ["scontrol", "show", "config"],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "maxentgrpo-test" in proc.stdout


def test_wait_fails_fast_for_a_job_that_can_never_start(slurm_cluster, tmp_path):
    too_big = str(2 * slurm_cluster.node_cpus(slurm_cluster.nodes[0]))
    job = slurm_cluster.submit(["-c", too_big, "--wrap", "true"], cwd=tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="can never start"):
            slurm_cluster.wait(job, timeout=60)
        assert time.monotonic() - t0 < 15
    finally:
        slurm_cluster.cancel(job)
