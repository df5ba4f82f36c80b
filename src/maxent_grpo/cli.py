"""The `maxent-grpo` command: check, plan and run recipes; make the tiny model."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from maxent_grpo.errors import EXIT_USER_ERROR, UserError


def _add_recipe_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="recipe YAML file")
    parser.add_argument(
        "--method",
        choices=["grpo", "maxent"],
        default="grpo",
        help="trainer: GRPO (src/grpo.py) or MaxEnt-GRPO (src/maxent-grpo.py)",
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


def _planned(args):
    """The allocation to plan for: the one asked for, else this machine's."""
    if args.gpus is None:
        return None
    from maxent_grpo.launch.sbatch import planned_environment

    return planned_environment(args.nodes, args.gpus)


def _add_allocation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--time", type=int, default=24 * 60, help="time limit in minutes")
    parser.add_argument("--partition", default=None, help="Slurm partition")
    parser.add_argument("--account", default=None, help="Slurm account")
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

    run = sub.add_parser(
        "run",
        help="check the recipe, plan the GPUs, start vLLM if needed and train (one attempt)",
    )
    _add_recipe_args(run)

    plan = sub.add_parser("plan", help="print the launch plan (GPUs, ports, commands) only")
    _add_recipe_args(plan)
    _add_planned_allocation_args(plan)

    check = sub.add_parser("check", help="validate a recipe for the planned allocation")
    _add_recipe_args(check)
    _add_planned_allocation_args(check)

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
    submit.add_argument(
        "--cpus-per-task", type=int, default=None, help="CPUs per node (Slurm's default if unset)"
    )
    submit.add_argument("--folder", default="logs/submitit", help="submitit's job folder")

    sbatch = sub.add_parser(
        "sbatch",
        help="check the recipe for the requested allocation, then `sbatch training.sh` it",
    )
    _add_recipe_args(sbatch)
    _add_allocation_args(sbatch)
    sbatch.add_argument("--array", default=None, help="array spec for retries, e.g. 0-3%%1")

    tiny = sub.add_parser("tiny-model", help="make the tiny local Qwen2 model (cached)")
    tiny.add_argument("--out", default=None, help="directory (default: .cache/models/tiny-qwen2)")
    _add_runs_commands(sub)
    return parser


def _add_runs_commands(sub) -> None:
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
        "--active-within",
        type=float,
        default=15,
        metavar="MIN",
        help="a Slurm attempt with no exit line counts as running while its log was written "
        "in the last MIN minutes (default 15)",
    )
    plot = sub.add_parser("plot", help="plot a run's reward, KL, entropy, length (PNG + CSV)")
    plot.add_argument("run", help="run name (looked up under --outputs) or an output directory")
    plot.add_argument("--out", default=None, help="PNG file (default: ./<run>.png)")
    plot.add_argument("--csv", default=None, help="CSV file (default: the PNG's name, .csv)")
    plot.add_argument("--outputs", default="outputs", help="where run names are looked up")
    plot.add_argument(
        "--logs",
        action="append",
        default=None,
        metavar="DIR",
        help="train logs to find resume points in (repeatable; default: logs)",
    )


def _options(args):
    from maxent_grpo.launch.launcher import LaunchOptions

    overrides = list(args.overrides or [])
    if overrides and overrides[0] == "--":
        overrides = overrides[1:]
    return LaunchOptions(
        recipe=args.config,
        method=args.method,
        run_name=args.run_name,
        overrides=tuple(overrides),
        logs_dir=Path(args.logs_dir),
    )


def _run(args) -> int:
    # runs / plot only read files: they must not pay for importing TRL (seconds).
    if args.command == "runs":
        from maxent_grpo import runs

        return runs.main(args.dirs, as_json=args.json, active_within=args.active_within * 60)
    if args.command == "plot":
        from maxent_grpo.runs import plot

        return plot.main(args.run, args.out, args.csv, args.outputs, args.logs or ["logs"])
    from maxent_grpo.launch.launcher import launch, prepare

    if args.command == "run":
        return launch(_options(args), early_signals=tuple(args.early_signals))
    if args.command == "plan":
        plan, _ = prepare(_options(args), environment=_planned(args))
        print(plan.describe())
        return 0
    if args.command == "check":
        plan, parsed = prepare(_options(args), environment=_planned(args))
        print(
            f"ok: {args.config} is valid for {plan.train.num_processes} training process(es) "
            f"on {plan.device}; output_dir {parsed[1].output_dir}"
        )
        return 0
    if args.command == "submit":
        from maxent_grpo.launch.submit import SubmitOptions, submit

        options = _options(args)
        job = submit(
            options,
            SubmitOptions(
                nodes=args.nodes,
                gpus_per_node=args.gpus,
                time_min=args.time,
                partition=args.partition,
                account=args.account,
                max_requeues=args.max_requeues,
                signal_lead_s=args.signal_lead,
                cpus_per_task=args.cpus_per_task,
                folder=args.folder,
            ),
        )
        print(f"submitted job {job.job_id}; submitit folder: {args.folder}/{job.job_id}")
        return 0
    if args.command == "sbatch":
        from maxent_grpo.launch.sbatch import sbatch_command, submit_sbatch

        command = sbatch_command(_options(args), args)
        job_id = submit_sbatch(_options(args), args, command)
        print(f"submitted job {job_id}: {' '.join(command)}")
        return 0
    if args.command == "tiny-model":
        from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

        print(ensure_tiny_model(args.out or DEFAULT_TINY_MODEL_DIR))
        return 0
    raise AssertionError(args.command)


def _record_stop_signals() -> list[int]:
    """Until the launcher takes over, remember SIGUSR1/SIGTERM instead of dying of them.

    Slurm's time-limit warning may land while Python is still importing (seconds).
    """
    received: list[int] = []
    for signum in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(signum, lambda number, _frame: received.append(number))
    return received


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    early = _record_stop_signals() if args.command == "run" else []
    args.early_signals = early
    try:
        return _run(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
