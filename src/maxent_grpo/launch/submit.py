"""`maxent-grpo submit`: the same launcher, submitted from Python with submitit.

The job runs an `Attempt` (plan -> server -> accelerate launch) inside the allocation. Before the
time limit (or on preemption) submitit calls `checkpoint()`: we ask the trainers to save a
complete checkpoint, wait for them, tear everything down and hand submitit a fresh copy of
the job, which it requeues; the next attempt resumes from that checkpoint. A stop submitit
did not see (the trainers got Slurm's SIGTERM) is requeued by the launcher, as under sbatch.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import submitit

from maxent_grpo.launch.attempt import Attempt
from maxent_grpo.launch.launcher import RunRequest
from maxent_grpo.launch.sbatch import check_for, planned_environment, require_slurm


@dataclass(frozen=True)
class SubmitOptions:
    nodes: int = 1
    gpus_per_node: int = 8
    time_min: int = 24 * 60
    max_requeues: int | None = None  # None: the recipe's max_requeues
    signal_lead_s: int = 300
    folder: str = "logs/submitit"
    # sbatch option name -> value (sbatch.slurm_resources): cpus-per-task, mem, partition, ...
    slurm: dict = field(default_factory=dict)
    stop_timeout_s: float = 240.0  # how long checkpoint() waits for the trainers' save


class TrainingJob(submitit.helpers.Checkpointable):
    """One attempt of a training run; requeued by submitit with a fresh copy of itself."""

    def __init__(self, request: RunRequest, workdir: str, stop_timeout_s: float):
        self.request = request
        self.workdir = workdir
        self.stop_timeout_s = stop_timeout_s
        self._attempt: Attempt | None = None

    def __getstate__(self):
        # The running attempt (processes, files) never travels with the pickled job.
        return {k: v for k, v in self.__dict__.items() if k != "_attempt"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._attempt = None

    def __call__(self) -> int:
        os.chdir(self.workdir)
        # A stop that did not come through checkpoint() is requeued by the launcher itself:
        # Slurm's SIGTERM to the trainers, e.g. a preemption of a multi-node job, whose srun
        # step is signalled at once; the job ends within the grace time, so Slurm would not.
        self._attempt = Attempt(self.request)
        code = self._attempt.run()
        if code != 0 and not self._attempt.requeued:
            raise RuntimeError(f"training attempt failed with exit code {code}")
        return code

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        if self._attempt is not None:
            self._attempt.requeue_on_stop = False  # submitit requeues the copy returned here
            self._attempt.stop_gracefully("submitit: time limit or preemption", self.stop_timeout_s)
        return submitit.helpers.DelayedSubmission(
            TrainingJob(self.request, self.workdir, self.stop_timeout_s)
        )


def submitit_parameters(resources: dict) -> dict:
    """sbatch option names -> submitit's AutoExecutor parameters (slurm_mem, slurm_qos, ...)."""
    return {
        ("cpus_per_task" if name == "cpus-per-task" else f"slurm_{name}"): (
            int(value) if name == "cpus-per-task" else value
        )
        for name, value in resources.items()
    }


def submit(request: RunRequest, submit_options: SubmitOptions) -> submitit.Job:
    """Check the recipe for the planned allocation, then queue the job. Returns the job."""
    require_slurm("submit")
    environment = planned_environment(submit_options.nodes, submit_options.gpus_per_node)
    prepared, _ = check_for(request, environment)  # the verdict of check and sbatch
    max_requeues = submit_options.max_requeues
    if max_requeues is None:
        max_requeues = prepared.keys.max_requeues
    executor = make_executor(submit_options, max_requeues, request.run_name or "maxent-grpo")
    job = TrainingJob(request, os.getcwd(), submit_options.stop_timeout_s)
    return executor.submit(job)


def make_executor(
    submit_options: SubmitOptions, max_requeues: int, name: str
) -> submitit.AutoExecutor:
    """submitit's executor for one training job of `submit_options`."""
    folder = Path(submit_options.folder) / "%j"
    executor = submitit.AutoExecutor(
        folder=folder,
        cluster="slurm",
        slurm_max_num_timeout=max_requeues,
        # exec: Python replaces the batch shell, so the B: signal reaches submitit's handler
        # instead of killing bash (USR2's default action) and the job with it.
        slurm_python="exec " + shlex.quote(sys.executable),
    )
    parameters = dict(
        name=name,
        nodes=submit_options.nodes,
        tasks_per_node=1,
        timeout_min=submit_options.time_min,
        # One launcher per job, in the batch shell of the first node: it starts the server and
        # the training srun step itself (under srun, every node would run its own launcher).
        slurm_use_srun=False,
        # So the time-limit signal goes to that batch shell (B:), not to the training step.
        slurm_additional_parameters={
            "requeue": True,
            "signal": f"B:{submitit.JobEnvironment.USR_SIG}@{submit_options.signal_lead_s}",
        },
    )
    if submit_options.gpus_per_node:
        parameters["gpus_per_node"] = submit_options.gpus_per_node
    parameters.update(submitit_parameters(submit_options.slurm))
    executor.update_parameters(**parameters)
    return executor
