"""The `maxent-grpo` command: check, plan and run recipes; make the tiny model."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from maxent_grpo.errors import EXIT_USER_ERROR, UserError, error_report
from maxent_grpo.launch.attempt import run_attempt
from maxent_grpo.launch.launcher import RunRequest, prepare
from maxent_grpo.launch.plan import parse_visible_devices, servers_summary
from maxent_grpo.methods import METHODS, RL_METHODS
from maxent_grpo.recipe.parser import load_recipe_file
from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

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


def _planned(args):
    """The allocation to plan for: the one asked for, else this machine's."""
    if args.gpus is None:
        return None
    from maxent_grpo.launch.sbatch import planned_environment  # plan, check, migrate only

    return planned_environment(args.nodes, args.gpus)


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


def _request(args):
    overrides = list(args.overrides or [])
    if overrides and overrides[0] == "--":
        overrides = overrides[1:]
    return RunRequest(
        recipe=args.config,
        method=args.method,
        run_name=args.run_name,
        overrides=tuple(overrides),
        logs_dir=Path(args.logs_dir),
        accept_changes=getattr(args, "accept_changes", False),
    )


def _run(args) -> int:
    # Each command imports what only it needs: `run` (every attempt, every requeue) stays light.
    if args.command in ("runs", "plot", "logs"):
        return _report(args)
    if args.command == "eval":
        from maxent_grpo.evaluate.command import main as evaluate_main  # eval only

        request = _request(args)
        return evaluate_main(request, args.checkpoint, args.step, args.benchmark, args.queued)
    if getattr(args, "rehearse", False) and (code := _rehearse_first(args)):
        return code
    if args.command == "sweep":
        from maxent_grpo.launch.sweep import main as sweep_main  # sweep only

        return sweep_main(_request(args), args)
    if args.command == "run":
        request = _request(args)
        if args.sweep_points:
            from maxent_grpo.launch.sweep import point_request  # a sweep's task only

            request = point_request(request, args.sweep_points)
        # The recorder's own list, not a copy: a signal that lands before the attempt's handlers
        # are set is still in it when the attempt reads it (after setting them).
        return run_attempt(request, early_signals=args.early_signals)
    if args.command == "plan":
        print(prepare(_request(args), environment=_planned(args), packages=False).describe())
        return 0
    if args.command == "check":
        print(_check(_request(args), _planned(args)))
        return 0
    if args.command == "migrate":
        return _migrate(args)
    if args.command in ("submit", "sbatch"):
        return _queue(args)
    if args.command == "rehearse":
        from maxent_grpo.launch.rehearse import main as rehearse_main  # rehearse only

        request, server = _request(args), not args.no_server
        return rehearse_main(request, args.gpus, args.nodes, args.steps, args.out, server)
    if args.command == "tiny-model":
        print(ensure_tiny_model(args.out or DEFAULT_TINY_MODEL_DIR))
        return 0
    raise AssertionError(args.command)


def _rehearse_first(args) -> int:
    from maxent_grpo.launch.rehearse import rehearse_first  # --rehearse only

    return rehearse_first(_request(args), args)


def _report(args) -> int:
    """`runs`, `plot` and `logs`: read run directories, start nothing."""
    if args.command == "runs":
        from maxent_grpo.runs import main as runs_main  # runs only

        active = args.active_within * 60
        return runs_main(args.dirs, as_json=args.json, active_within=active, sweep=args.sweep)
    if args.command == "plot":
        if args.sweep or len(args.run) != 1:  # several runs in one figure
            from maxent_grpo.runs.overlay import main as overlay_main  # plot only

            return overlay_main(args.run, args.sweep, args.out, args.csv, args.outputs)
        from maxent_grpo.runs.plot import main as plot_main  # plot only

        return plot_main(args.run[0], args.out, args.csv, args.outputs)
    if args.command == "logs":
        from maxent_grpo.runs.logs import main as logs_main  # logs only

        return logs_main(args.run, args.dirs, args.component, args.follow)
    raise AssertionError(args.command)


def _queue(args) -> int:
    """`submit` and `sbatch`: the job is checked, then queued (nothing trains here)."""
    if args.command == "submit":
        from maxent_grpo.launch.sbatch import slurm_resources  # submit only
        from maxent_grpo.launch.submit import SubmitOptions, submit  # imports submitit

        job = submit(
            _request(args),
            SubmitOptions(
                nodes=args.nodes,
                gpus_per_node=args.gpus,
                time_min=args.time,
                max_requeues=args.max_requeues,
                signal_lead_s=args.signal_lead,
                folder=args.folder,
                slurm=slurm_resources(args),
            ),
        )
        print(f"submitted job {job.job_id}; submitit folder: {args.folder}/{job.job_id}")
        return 0
    if args.command == "sbatch":
        from maxent_grpo.launch.sbatch import sbatch_command, submit_sbatch  # sbatch only

        if args.chain:
            from maxent_grpo.launch.chain import main as chain_main  # sbatch --chain only

            return chain_main(_request(args), args)
        command = sbatch_command(_request(args), args)
        job_id = submit_sbatch(_request(args), args, command)
        print(f"submitted job {job_id}: {' '.join(command)}")
        return 0
    raise AssertionError(args.command)


def _check(request, environment) -> str:
    """`check`: the verdict on a recipe, with every problem at once (a ConfigProblems)."""
    from maxent_grpo.launch.sbatch import check_for  # check, migrate only

    prepared, notes = check_for(request, environment)  # the verdict of sbatch and submit too
    plan = prepared.plan
    return "\n".join(
        [
            *(f"note: {note}" for note in notes),
            f"ok: {request.recipe} is valid for {plan.train.num_processes} training process(es) "
            f"on {plan.device}; output_dir {prepared.keys.output_dir}"
            + servers_summary(plan)
            + (
                ""
                if prepared.keys.method in RL_METHODS
                else "; no vLLM server (SFT generates nothing)"
            ),
        ]
    )


def _migrate(args) -> int:
    """`migrate`: write the translated recipe, list what changed, then check the result."""
    from maxent_grpo.migrate.command import translate  # migrate only
    from maxent_grpo.migrate.engine import behaviour_differences, default_drift  # migrate only

    if not Path(args.recipe).is_file():
        load_recipe_file(args.recipe)  # one line for a missing file
    done = translate(args.recipe, args.gpus, args.nodes, args.trl_version, os.environ)
    text, changes = done.text, done.changes
    Path(args.out).write_text(text)
    left_out = [c for c in changes if c.left_out]
    print(
        f"migrated {args.recipe} -> {args.out}: {len(changes) - len(left_out)} change(s), "
        f"{len(left_out)} key(s) or value(s) left out"
    )
    for change in changes:
        print(f"  {'left out' if change.left_out else 'changed'}: {change.text}")
    if done.arithmetic:
        print("batch, re-fit to the planned processes (completions, as the source's):")
        print("\n".join(f"  {line}" for line in done.arithmetic))
    differences = behaviour_differences(changes)
    if differences:
        print(f"behaviour differences: this run trains differently from {args.recipe} in:")
        print("\n".join(f"  - {line}" for line in differences))
    if drift := default_drift(changes):
        print(f"defaults that changed since {args.recipe}'s TRL, written out with the old value:")
        print("\n".join(f"  - {line}" for line in drift))
    args.gpus, args.nodes = done.gpus, done.nodes  # a verl / prime-rl source's own allocation
    environment, note = _migrate_target(args)
    try:
        print(note or "", end="\n" if note else "")
        print(_check(RunRequest(recipe=args.out, method=args.method), environment))
    except UserError as exc:
        print(error_report(exc), file=sys.stderr)
        print(f"{args.out} still fails check: fix the lines above by hand", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


def _migrate_target(args):
    """The allocation migrate checks its output for, and a note: --gpus N; else this machine,
    unless it sees no GPU and the recipe runs vLLM on GPUs: then one node of JOB_GPUS, the
    verdict `sbatch` would give (what this machine lacks is no fault of the translation)."""
    if args.gpus is not None or parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")):
        return _planned(args), None
    from maxent_grpo.launch.requirements import recipe_values  # migrate only
    from maxent_grpo.launch.sbatch import planned_environment  # migrate only
    from maxent_grpo.recipe.needs import recipe_needs  # migrate only

    _, values = recipe_values(args.out)
    if not any(need.extra == "vllm" for need in recipe_needs(values)):
        return None, None
    note = (
        f"note: this machine sees no GPU and {args.out} runs vLLM on GPUs: checked for one node "
        f"of {JOB_GPUS} GPUs, as maxent-grpo sbatch queues it (give --gpus N for yours)"
    )
    return planned_environment(1, JOB_GPUS), note


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
        print(error_report(exc), file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
