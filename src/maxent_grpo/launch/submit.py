"""`maxent-grpo submit`: the same launcher, submitted from Python with submitit.

The job runs `Launch` (plan -> server -> accelerate launch) inside the allocation. Before the
time limit (or on preemption) submitit calls `checkpoint()`: we ask the trainers to save a
complete checkpoint, wait for them, tear everything down and hand submitit a fresh copy of
the job, which it requeues; the next attempt resumes from that checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import submitit

from maxent_grpo.configs import LaunchArguments
from maxent_grpo.launch.launcher import Launch, LaunchOptions, prepare
from maxent_grpo.launch.sbatch import planned_environment


@dataclass(frozen=True)
class SubmitOptions:
    nodes: int = 1
    gpus_per_node: int = 8
    time_min: int = 24 * 60
    partition: str | None = None
    account: str | None = None
    max_requeues: int | None = None  # None: the recipe's max_requeues
    signal_lead_s: int = 300
    cpus_per_task: int | None = None
    folder: str = "logs/submitit"
    stop_timeout_s: float = 240.0  # how long checkpoint() waits for the trainers' save


class TrainingJob(submitit.helpers.Checkpointable):
    """One attempt of a training run; requeued by submitit with a fresh copy of itself."""

    def __init__(self, options: LaunchOptions, workdir: str, stop_timeout_s: float):
        self.options = options
        self.workdir = workdir
        self.stop_timeout_s = stop_timeout_s
        self._launch: Launch | None = None

    def __getstate__(self):
        # The running launch (processes, files) never travels with the pickled job.
        return {k: v for k, v in self.__dict__.items() if k != "_launch"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._launch = None

    def __call__(self) -> int:
        os.chdir(self.workdir)
        # submitit requeues on its own; the launcher must not requeue as well.
        self._launch = Launch(self.options, requeue_on_stop=False)
        code = self._launch.run()
        if code not in (0,):
            raise RuntimeError(f"training attempt failed with exit code {code}")
        return code

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        if self._launch is not None:
            self._launch.stop_gracefully("submitit: time limit or preemption", self.stop_timeout_s)
        return submitit.helpers.DelayedSubmission(
            TrainingJob(self.options, self.workdir, self.stop_timeout_s)
        )


def submit(options: LaunchOptions, submit_options: SubmitOptions) -> submitit.Job:
    """Check the recipe for the planned allocation, then queue the job. Returns the job."""
    _plan, parsed = prepare(
        options,
        environment=planned_environment(submit_options.nodes, submit_options.gpus_per_node),
    )
    max_requeues = submit_options.max_requeues
    if max_requeues is None:
        max_requeues = next(p for p in parsed if isinstance(p, LaunchArguments)).max_requeues
    folder = Path(submit_options.folder) / "%j"
    executor = submitit.AutoExecutor(folder=folder, slurm_max_num_timeout=max_requeues)
    parameters = dict(
        name=options.run_name or "maxent-grpo",
        nodes=submit_options.nodes,
        tasks_per_node=1,
        timeout_min=submit_options.time_min,
        slurm_signal_delay_s=submit_options.signal_lead_s,
        slurm_additional_parameters={"requeue": True},
    )
    if submit_options.gpus_per_node:
        parameters["gpus_per_node"] = submit_options.gpus_per_node
    if submit_options.cpus_per_task:
        parameters["cpus_per_task"] = submit_options.cpus_per_task
    if submit_options.partition:
        parameters["slurm_partition"] = submit_options.partition
    if submit_options.account:
        parameters["slurm_account"] = submit_options.account
    executor.update_parameters(**parameters)
    job = TrainingJob(options, os.getcwd(), submit_options.stop_timeout_s)
    return executor.submit(job)
