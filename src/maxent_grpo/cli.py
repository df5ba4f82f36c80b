"""The `maxent-grpo` command: check, plan and run recipes; make the tiny model."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from maxent_grpo.cli_parser import JOB_GPUS, build_parser
from maxent_grpo.errors import EXIT_USER_ERROR, UserError, error_report
from maxent_grpo.launch.attempt import run_attempt
from maxent_grpo.launch.launcher import RunRequest, prepare
from maxent_grpo.launch.plan import parse_visible_devices, servers_summary
from maxent_grpo.methods import RL_METHODS
from maxent_grpo.recipe.parser import load_recipe_file
from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model


def _planned(args):
    """The allocation to plan for: the one asked for, else this machine's."""
    if args.gpus is None:
        return None
    from maxent_grpo.launch.sbatch import planned_environment  # plan, check, migrate only

    return planned_environment(args.nodes, args.gpus)


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
