"""`maxent-grpo sbatch --config A --chain B [--chain C]`: jobs that run one after another.

Every recipe is checked first (all problems of all of them, nothing queued otherwise); then A
is queued, and each next one with `--dependency=afterok:<the previous job>`: it starts only
when the previous job succeeded, and Slurm cancels it when that job fails
(`--kill-on-invalid-dep=yes`). A chained recipe that starts from the previous run names it with
`init_from:` (launch/init_from.py), which is resolved when its job starts, so it may name a run
that does not exist yet. The run name and the `--` overrides of the command line apply to A
only; the others run as their recipes say.
"""

from __future__ import annotations

import argparse
import subprocess

from maxent_grpo.errors import ConfigProblems, UserError
from maxent_grpo.launch.launcher import Prepared, RunRequest
from maxent_grpo.launch.sbatch import (
    check_for,
    node_loss_options,
    planned_environment,
    require_slurm,
    sbatch_command,
)


def chain_requests(request: RunRequest, chained: list[str]) -> list[RunRequest]:
    """The first request as given, then one per chained recipe (its method from the recipe)."""
    return [request, *(RunRequest(recipe=r, logs_dir=request.logs_dir) for r in chained)]


def check_chain(requests: list[RunRequest], environment) -> list[Prepared]:
    """`check`'s verdict on every recipe of the chain, all problems at once; their plans."""
    lines: list[str] = []
    prepared = []
    for request in requests:
        try:
            prepared.append(check_for(request, environment)[0])
        except ConfigProblems as exc:
            lines.extend(exc.problems)
        except UserError as exc:
            lines.append(str(exc))
    if lines:
        raise ConfigProblems(f"the chain {' -> '.join(r.recipe for r in requests)}", lines)
    return prepared


def chain_commands(requests: list[RunRequest], args: argparse.Namespace) -> list[list[str]]:
    """The sbatch command of each job; a later one gets its dependency when it is queued."""
    return [sbatch_command(request, args) for request in requests]


def after(command: list[str], job: str) -> list[str]:
    """`command` queued behind `job`: only after it succeeded, cancelled if it failed."""
    at = command.index("training.sh")
    return [
        *command[:at],
        f"--dependency=afterok:{job}",
        "--kill-on-invalid-dep=yes",
        *command[at:],
    ]


def main(request: RunRequest, args: argparse.Namespace) -> int:
    """Check every recipe, then queue them one behind the other; prints each job."""
    require_slurm("sbatch")
    requests = chain_requests(request, list(args.chain))
    prepared = check_chain(requests, planned_environment(args.nodes, args.gpus))
    jobs: list[str] = []
    for request_, plan, command in zip(requests, prepared, chain_commands(requests, args)):
        command[1:1] = node_loss_options(plan)
        if jobs:
            command = after(command, jobs[-1])
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            reason = " ".join(result.stderr.split()) or f"exit code {result.returncode}"
            queued = f" (queued already: {', '.join(jobs)})" if jobs else ""
            raise UserError(f"sbatch refused {request_.recipe}: {reason}{queued}")
        jobs.append(result.stdout.strip().split(";")[0])
        print(f"submitted job {jobs[-1]}: {' '.join(command)}")
    return 0
