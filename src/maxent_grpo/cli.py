"""The `maxent-grpo` command: check, plan and run recipes; make the tiny model."""

from __future__ import annotations

import argparse
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
    parser.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        help="recipe overrides after --, e.g. -- --max_steps 10",
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
    run.add_argument("--logs-dir", default="logs", help="where log files go (default: logs)")

    plan = sub.add_parser("plan", help="print the launch plan (GPUs, ports, commands) only")
    _add_recipe_args(plan)

    check = sub.add_parser("check", help="validate a recipe for the planned allocation")
    _add_recipe_args(check)

    tiny = sub.add_parser("tiny-model", help="make the tiny local Qwen2 model (cached)")
    tiny.add_argument("--out", default=None, help="directory (default: .cache/models/tiny-qwen2)")
    return parser


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
        logs_dir=Path(getattr(args, "logs_dir", "logs")),
    )


def _run(args) -> int:
    from maxent_grpo.launch.launcher import launch, prepare

    if args.command == "run":
        return launch(_options(args))
    if args.command == "plan":
        plan, _ = prepare(_options(args))
        print(plan.describe())
        return 0
    if args.command == "check":
        plan, parsed = prepare(_options(args))
        print(
            f"ok: {args.config} is valid for {plan.train.num_processes} training process(es) "
            f"on {plan.device}; output_dir {parsed[1].output_dir}"
        )
        return 0
    if args.command == "tiny-model":
        from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

        print(ensure_tiny_model(args.out or DEFAULT_TINY_MODEL_DIR))
        return 0
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
