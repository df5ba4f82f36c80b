"""The test cluster preempts by partition, as the launcher's preemption tests need: a job in the
`high` partition takes the CPUs of a job in `debug` (the default partition).

What Slurm 22.05 does then (PreemptMode=REQUEUE, GraceTime=30 on debug), measured here:
SIGTERM at once to the tasks of the job's steps (srun), *not* to the batch shell; SIGTERM to the
batch shell when the grace time ends, SIGKILL KillWait later; then the job is requeued and
runs again after the high-priority job. A job that ends by itself during the grace time is not
requeued by Slurm (it completed or failed): it must requeue itself.
"""

from __future__ import annotations

import stat
import time

import pytest

from helpers.procs import wait_for

pytestmark = pytest.mark.slurm

GRACE_S = 30  # GraceTime of the debug partition (tests/slurm/cluster.sh)

# The step's task writes its lines straight into TASK_LOG: through srun's output relay, the
# line of a task that ends on SIGTERM can be lost (srun may end before it relays it; seen once).
LOW = """#!/bin/bash
attempt=${SLURM_RESTART_COUNT:-0}
echo "attempt $attempt"
trap 'echo "batch TERM $(date +%s.%N)"' TERM
if [[ $attempt == 0 ]]; then
    srun --ntasks=1 bash -c \\
        'trap "echo task TERM \\$(date +%s.%N) >> $TASK_LOG; exit 0" TERM
         echo task ready >> $TASK_LOG; sleep 300 & wait' &
    wait
    # Keep the allocation until Slurm ends the grace time (bounded by the test's waits).
    for _ in 1 2 3 4 5 6; do sleep 20 & wait; done
    exit 1
fi
echo "done"
"""


def _times(lines: list[str], prefix: str) -> list[float]:
    return [float(line.split()[-1]) for line in lines if line.startswith(prefix)]


def test_high_partition_preempts_then_requeues_a_debug_job(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    out, task_log = tmp_path / "low.out", tmp_path / "task.log"
    script = tmp_path / "low.sh"
    script.write_text(LOW.replace("$TASK_LOG", str(task_log)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    # Both jobs ask for the whole node: the high job can only run by preempting the low one.
    whole_node = str(cluster.node_cpus(cluster.nodes[0]))
    low = cluster.submit(
        ["-c", whole_node, "--requeue", "--open-mode=append", "-o", str(out), str(script)], tmp_path
    )
    # The step's task has set its trap (it says so right after).
    ready = lambda: task_log.is_file() and "task ready" in task_log.read_text()  # noqa: E731
    wait_for(ready, 30, "the low job's task to set its trap", poll=0.25)
    (record,) = cluster.job_records(low)
    assert record["JobState"] == "RUNNING" and record["Partition"] == "debug", record

    high_out = tmp_path / "high.out"
    t0 = time.time()
    high = cluster.submit(
        ["-p", "high", "-c", whole_node, "-o", str(high_out), "--wrap", "date +%s.%N"], tmp_path
    )
    assert cluster.wait(high, timeout=GRACE_S + 60) == "COMPLETED", out.read_text()
    assert cluster.wait(low, timeout=60) == "COMPLETED", out.read_text()

    lines = out.read_text().splitlines()
    (task_term,) = _times(task_log.read_text().splitlines(), "task TERM")
    (batch_term,) = _times(lines, "batch TERM")
    high_start = float(high_out.read_text())
    cluster.timings["preemption: tasks get SIGTERM after (s)"] = task_term - t0
    cluster.timings["preemption: batch shell gets SIGTERM after (s)"] = batch_term - t0
    cluster.timings["preemption: high job starts after (s)"] = high_start - t0
    assert task_term - t0 <= 10, lines
    assert GRACE_S - 5 <= batch_term - task_term <= GRACE_S + 10, lines
    assert high_start >= batch_term, (high_start, batch_term)
    assert [line for line in lines if line.startswith("attempt")] == ["attempt 0", "attempt 1"]
    assert lines[-1] == "done", lines
    (record,) = cluster.job_records(low)
    assert record["Restarts"] == "1", record
