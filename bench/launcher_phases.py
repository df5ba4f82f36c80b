"""Where the launcher's own time goes, phase by phase, in a fresh interpreter (bench helper).

    .venv/bin/python bench/launcher_phases.py RECIPE LOGS_DIR

Run by bench/bench_launcher.py. Does what `maxent-grpo run` does before the trainers start,
in the same order (maxent_grpo.launch.launcher.prepare, then the Popen of a child); each
phase's time is what prepare() records in its own timers (maxent_grpo/timers.py: "prepare: ...").
prepare() imports no torch, TRL or datasets: `launcher_heavy_modules` lists any that were, and
must stay empty. Then it times the trainer-side parse and checks of src/grpo.py
(parse_recipe + check_recipe for the planned world size) next to what a bare TRL script does
instead (yaml + trl.GRPOConfig). Prints one JSON object.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def time_imports(phases: dict[str, float]) -> None:
    """The launcher's imports, in the order the console script and prepare() make them."""
    for label, module in (
        ("import maxent_grpo.cli", "maxent_grpo.cli"),
        ("import maxent_grpo.launch.attempt (and launcher)", "maxent_grpo.launch.attempt"),
        ("import maxent_grpo.recipe (schema reader, no TRL)", "maxent_grpo.recipe"),
        ("import maxent_grpo.recipe.checks", "maxent_grpo.recipe.checks"),
    ):
        start = time.perf_counter()
        importlib.import_module(module)
        phases[label] = time.perf_counter() - start


def launcher_part(recipe: str, logs_dir: Path, phases: dict[str, float]):
    """prepare() phase by phase, then the Popen of a child as the launcher's Child does it
    (own session, log file). Returns the plan and the launcher's time up to the Popen."""
    from maxent_grpo import timers
    from maxent_grpo.launch import launcher
    from maxent_grpo.launch.processes import Child

    timers.reset()
    start = time.perf_counter()
    prepared = launcher.prepare(launcher.RunRequest(recipe=recipe, logs_dir=logs_dir))
    phases["prepare (total)"] = time.perf_counter() - start
    for name, timer in timers.timings().items():
        if name.startswith("prepare: "):
            phases[name] = timer["total_s"]
    start = time.perf_counter()
    describe = prepared.plan.describe()
    phases["plan.describe"] = time.perf_counter() - start
    start = time.perf_counter()
    child = Child("probe", [sys.executable, "-c", "pass"], logs_dir / "probe.log")
    phases["process start (Child Popen)"] = time.perf_counter() - start
    launcher_total = time.perf_counter() - _T0  # the launcher's part ends with the Popen
    child.wait()
    heavy = sorted({"torch", "trl", "transformers", "datasets", "peft"} & set(sys.modules))
    return prepared.plan, describe, launcher_total, heavy


def trainer_part(recipe: str, world_size: int) -> tuple[float, float]:
    """Every rank's parse + checks (as maxent_grpo.train_process.cli_main makes them), against a
    bare script's config build; the imports are already paid."""
    import dataclasses

    import trl
    import yaml

    from maxent_grpo.preflight import check_recipe
    from maxent_grpo.recipe import parse_recipe

    # The launcher no longer imports TRL: pay the trainers' imports (which a bare script pays
    # too) with one untimed call, then time the parse and checks themselves.
    check_recipe(parse_recipe(["--config", recipe], None, world_size))
    start = time.perf_counter()
    check_recipe(parse_recipe(["--config", recipe], None, world_size))
    ours = time.perf_counter() - start
    start = time.perf_counter()
    raw = yaml.safe_load(Path(recipe).read_text())
    names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    trl.GRPOConfig(**{k: v for k, v in raw.items() if k in names})
    bare = time.perf_counter() - start
    return ours, bare


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="recipe YAML")
    parser.add_argument("logs_dir", type=Path, help="where the probe child writes its log")
    args = parser.parse_args(argv)

    phases: dict[str, float] = {}
    time_imports(phases)
    plan, describe, launcher_total, heavy = launcher_part(args.recipe, args.logs_dir, phases)
    trainer_ours, trainer_bare = trainer_part(args.recipe, plan.train.num_processes)
    result = {
        "phases_s": phases,
        "launcher_in_process_s": launcher_total,
        "launcher_heavy_modules": heavy,  # must stay empty
        "trainer_parse_and_check_s": trainer_ours,
        "bare_config_s": trainer_bare,
        "plan": describe,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
