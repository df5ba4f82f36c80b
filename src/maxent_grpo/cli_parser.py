"""The `maxent-grpo` command's arguments (cli.py runs them): one parser, a function per
command or group of shared flags. Standard library and methods.py only: `--help` is fast."""

from __future__ import annotations

import argparse

from maxent_grpo.methods import METHODS

JOB_GPUS = 8  # GPUs per node of `sbatch` / `submit` without --gpus


def _add_recipe_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="recipe YAML file")
    parser.add_argument(
        "--method",
        choices=list(METHODS),
        default=None,
        help="trainer: "
        + ", ".join(f"{m.name} ({m.label})" for m in METHODS.values())
        + "; default: the recipe's `method:` key, else grpo",
    )
    parser.add_argument(
        "--run-name",
        default=None,
        help="name of the run: output goes to outputs/<run-name>, logs are named after it",
    )
    parser.add_argument("--logs-dir", default="logs", help="where log files go (default: logs)")
    parser.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        help="recipe overrides after --, e.g. -- --max_steps 10",
    )


def _add_planned_allocation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpus", type=int, default=None, help="plan for N GPUs per node (default: this machine's)"
    )
    parser.add_argument("--nodes", type=int, default=1, help="plan for N nodes (with --gpus)")


def _add_allocation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument(
        "--gpus", type=int, default=JOB_GPUS, help=f"GPUs per node (default {JOB_GPUS})"
    )
    parser.add_argument("--time", type=int, default=24 * 60, help="time limit in minutes")
    parser.add_argument(
        "--cpus-per-task",
        type=int,
        default=None,
        help="CPUs per node for the job (training.sh's header asks 32; submit: Slurm's default)",
    )
    parser.add_argument(
        "--mem", default=None, help="memory per node, e.g. 256G; 0 means all of the node's"
    )
    parser.add_argument(
        "--exclusive", action="store_true", help="the whole node(s): no other job shares them"
    )
    for flag, what in (
        ("--partition", "Slurm partition"),
        ("--account", "Slurm account"),
        ("--qos", "Slurm quality of service"),
        ("--constraint", "Slurm node features, e.g. h100"),
    ):
        parser.add_argument(flag, default=None, help=what)
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="first rehearse the recipe on this machine (maxent-grpo rehearse); queue nothing "
        "when a row of its passport fails",
    )
    parser.add_argument(
        "--rehearse-steps", type=int, default=4, help="steps of that rehearsal (default 4)"
    )
    parser.add_argument(
        "--signal-lead",
        type=int,
        default=300,
        help="seconds before the time limit at which to checkpoint (default 300)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maxent-grpo",
        description="Launch and check GRPO / MaxEnt-GRPO recipes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    _add_run_command(sub)

    plan = sub.add_parser("plan", help="print the launch plan (GPUs, ports, commands) only")
    _add_recipe_args(plan)
    _add_planned_allocation_args(plan)

    check = sub.add_parser(
        "check", help="validate a recipe for the planned allocation: every problem, one line each"
    )
    _add_recipe_args(check)
    _add_planned_allocation_args(check)
    _add_migrate_command(sub)

    _add_queue_commands(sub)
    _add_sweep_command(sub)
    _add_rehearse_command(sub)

    tiny = sub.add_parser("tiny-model", help="make the tiny local Qwen2 model (cached)")
    tiny.add_argument("--out", default=None, help="directory (default: .cache/models/tiny-qwen2)")
    _add_runs_commands(sub)
    _add_eval_command(sub)
    return parser


def _add_run_command(sub) -> None:
    run = sub.add_parser(
        "run",
        help="check the recipe, plan the GPUs, start vLLM if needed and train (one attempt)",
    )
    _add_recipe_args(run)
    run.add_argument(
        "--accept-changes",
        action="store_true",
        help="resume a run with keys that change training set otherwise than at its first "
        "start (it refuses them by default, naming each key and both values)",
    )
    run.add_argument(
        "--sweep-points",
        default=None,
        metavar="FILE",
        help="run point $SLURM_ARRAY_TASK_ID of this sweep (written by maxent-grpo sweep)",
    )


def _add_queue_commands(sub) -> None:
    """`submit` (submitit) and `sbatch` (training.sh): check, then queue."""
    submit = sub.add_parser(
        "submit",
        help="check the recipe for the requested allocation, then queue it with submitit",
    )
    _add_recipe_args(submit)
    _add_allocation_args(submit)
    submit.add_argument(
        "--max-requeues",
        type=int,
        default=None,
        help="requeues after time limits (default: the recipe's max_requeues)",
    )
    submit.add_argument("--folder", default="logs/submitit", help="submitit's job folder")

    sbatch = sub.add_parser(
        "sbatch",
        help="check the recipe for the requested allocation, then `sbatch training.sh` it",
    )
    _add_recipe_args(sbatch)
    _add_allocation_args(sbatch)
    sbatch.add_argument("--array", default=None, help="array spec for retries, e.g. 0-3%%1")
    sbatch.add_argument(
        "--chain",
        action="append",
        default=None,
        metavar="RECIPE",
        help="queue RECIPE after this job, with afterok (repeatable: each after the previous)",
    )


def _add_sweep_command(sub) -> None:
    sweep = sub.add_parser(
        "sweep", help="check every point of a grid of overrides, then sbatch them as one array"
    )
    _add_recipe_args(sweep)
    _add_allocation_args(sweep)
    sweep.add_argument(
        "--grid",
        action="append",
        help="the values to sweep, e.g. 'learning_rate=[1e-6,3e-6] maxent_tau=[0.5,1.0]'; "
        "default: the recipe's sweep: section (a key given here replaces its values there)",
    )
    sweep.add_argument(
        "--name", default=None, help="the sweep's name (default: the recipe's output_dir's)"
    )
    sweep.add_argument("--dry-run", action="store_true", help="check and list; queue nothing")
    sweep.add_argument("--throttle", type=int, default=None, help="at most N points at a time")


def _add_rehearse_command(sub) -> None:
    rehearse = sub.add_parser(
        "rehearse",
        help="run the recipe shrunk to this machine (CPU, tiny model), stop it, resume it, "
        "and print a passport of what holds (docs/rehearse.md)",
    )
    _add_recipe_args(rehearse)
    _add_planned_allocation_args(rehearse)
    rehearse.add_argument("--steps", type=int, default=4, help="steps to rehearse (default 4)")
    rehearse.add_argument(
        "--out", default=None, help="folder (default: outputs/rehearse/<recipe's path>)"
    )
    rehearse.add_argument(
        "--no-server",
        action="store_true",
        help="generate in the trainers even where vLLM's CPU build is installed (faster; the "
        "weight-push row is then not run)",
    )


def _add_eval_command(sub) -> None:
    evaluate = sub.add_parser(
        "eval", help="score one checkpoint on the recipe's benchmarks (events.jsonl, samples)"
    )
    evaluate.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint-N directory (default: the run's final model in output_dir)",
    )
    evaluate.add_argument(
        "--benchmark",
        action="append",
        default=None,
        metavar="NAME",
        help="one of the recipe's benchmarks (repeatable; default: all of them)",
    )
    evaluate.add_argument(
        "--step", type=int, default=None, help="the step to record (default: the checkpoint's)"
    )
    evaluate.add_argument(
        "--queued",
        action="store_true",
        help="run as a queued evaluation job: a checkpoint that is gone is skipped, not an error",
    )
    _add_recipe_args(evaluate)


def _add_migrate_command(sub) -> None:
    migrate = sub.add_parser(
        "migrate",
        help="rewrite an open-r1 / older-TRL / upstream recipe (comments kept), a verl script or "
        "config, or a prime-rl TOML for this toolkit; check it",
    )
    migrate.add_argument(
        "recipe", help="the recipe YAML, verl script (.sh) or config, prime-rl TOML to translate"
    )
    migrate.add_argument("-o", "--out", required=True, help="where to write the translated recipe")
    migrate.add_argument(
        "--method", choices=list(METHODS), default=None, help="as for check (default: the recipe's)"
    )
    migrate.add_argument(
        "--trl-version",
        default=None,
        help="the TRL version the recipe was written for (default: read from its source and "
        "keys); defaults that changed since are written out with their old values",
    )
    _add_planned_allocation_args(migrate)


def _add_runs_commands(sub) -> None:
    """runs, plot, logs: the commands that read runs (runs/), not recipes."""
    _add_runs_command(sub)
    _add_plot_command(sub)
    _add_logs_command(sub)


def _add_runs_command(sub) -> None:
    runs = sub.add_parser(
        "runs", help="one line per run under outputs/ and logs/: state, step, reward, checkpoint"
    )
    runs.add_argument(
        "--dir",
        dest="dirs",
        action="append",
        default=None,
        metavar="DIR",
        help="where to look for output dirs and logs (repeatable; default: outputs and logs)",
    )
    runs.add_argument("--json", action="store_true", help="print JSON instead of a table")
    runs.add_argument(
        "--sweep",
        default=None,
        metavar="NAME",
        help="only the points of sweep NAME (NAME.sweep.json under --dir), in their order",
    )
    runs.add_argument(
        "--active-within",
        type=float,
        default=15,
        metavar="MIN",
        help="an attempt with no outcome whose processes cannot be seen from here counts as "
        "running while its events or log were written in the last MIN minutes (default 15)",
    )


def _add_plot_command(sub) -> None:
    plot = sub.add_parser("plot", help="plot a run's reward, KL, entropy, length (PNG + CSV)")
    plot.add_argument(
        "run",
        nargs="*",
        help="run name (looked up under --dir) or an output directory; several: one figure",
    )
    plot.add_argument("--sweep", default=None, help="the points of sweep NAME in one figure")
    plot.add_argument("--out", default=None, help="PNG file (default: <output_dir>/<run>.png)")
    plot.add_argument("--csv", default=None, help="CSV file (default: the PNG's name, .csv)")
    plot.add_argument(
        "--dir",
        dest="outputs",
        default="outputs",
        metavar="DIR",
        help="where run names are looked up (default: outputs), as for runs",
    )
    # plot's spelling until 0.x: still read, no longer shown (`--dir`, as `runs` takes it)
    plot.add_argument(
        "--outputs", dest="outputs", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )


def _add_logs_command(sub) -> None:
    logs = sub.add_parser(
        "logs", help="a run's last attempt's logs by component (train, vllm, ...)"
    )
    logs.add_argument("run", help="run name (its output_dir's name) or an output directory")
    logs.add_argument(
        "--component",
        default=None,
        metavar="NAME",
        help="train, vllm, vllm-server1, vllm-restart1, reward_model, ... (default: all)",
    )
    logs.add_argument(
        "--dir",
        dest="dirs",
        action="append",
        default=None,
        metavar="DIR",
        help="where to look for logs and output dirs (repeatable; default: outputs and logs)",
    )
    logs.add_argument(
        "-f", "--follow", action="store_true", help="print what the logs gain until the run ends"
    )
