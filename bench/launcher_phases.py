"""Where the launcher's own time goes, phase by phase, in a fresh interpreter (bench helper).

    .venv/bin/python bench/launcher_phases.py RECIPE LOGS_DIR

Run by bench/bench_launcher.py. Does what `maxent-grpo run` does before the trainers start,
in the same order, timing each phase by wrapping the functions prepare() calls (the product
code is not changed), then times the trainer-side checks of src/grpo.py (parse_and_check) next
to what a bare TRL script does instead (yaml + trl.GRPOConfig). Prints one JSON object.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def main() -> None:
    recipe, logs_dir = sys.argv[1], Path(sys.argv[2])
    phases: dict[str, float] = {}

    t = time.perf_counter()
    import maxent_grpo.cli  # noqa: F401  (what the console script imports first)

    phases["import maxent_grpo.cli"] = time.perf_counter() - t
    t = time.perf_counter()
    import maxent_grpo.launch.launcher as launcher

    phases["import launcher (configs: torch, transformers, trl)"] = time.perf_counter() - t

    from maxent_grpo import configs, data, preflight

    def timed(module, name: str, label: str) -> None:
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                phases[label] = phases.get(label, 0.0) + time.perf_counter() - start

        setattr(module, name, wrapper)

    timed(configs, "recipe_values", "prepare: recipe_values (YAML, key/type check)")
    timed(launcher, "ensure_tiny_model", "prepare: ensure_tiny_model (cached)")
    timed(launcher, "free_port", "prepare: free ports")
    timed(launcher, "environment_from_os", "prepare: environment")
    timed(launcher, "make_plan", "prepare: make_plan")
    timed(launcher, "_cuda_here", "prepare: torch.cuda.is_available")
    timed(configs, "parse_recipe", "prepare: parse_recipe (dataclasses, planned world size)")
    timed(preflight, "check_rewards", "prepare: preflight check_rewards")
    timed(data, "preflight_columns", "prepare: preflight dataset columns")
    timed(preflight, "check_output_dir", "prepare: preflight output_dir")
    timed(preflight, "check_recipe", "prepare: preflight check_recipe (total)")
    timed(preflight, "check_launch", "prepare: check_launch")

    options = launcher.LaunchOptions(recipe=recipe, logs_dir=logs_dir)
    t = time.perf_counter()
    plan, _parsed = launcher.prepare(options)
    phases["prepare (total)"] = time.perf_counter() - t
    t = time.perf_counter()
    describe = plan.describe()
    phases["plan.describe"] = time.perf_counter() - t

    # Process start: the Popen of a child, as launcher.Child does it (own session, log file).
    from maxent_grpo.launch.processes import Child

    t = time.perf_counter()
    child = Child("probe", [sys.executable, "-c", "pass"], logs_dir / "probe.log")
    phases["process start (Child Popen)"] = time.perf_counter() - t
    launcher_total = time.perf_counter() - _T0  # the launcher's part ends with the Popen
    child.wait()

    # Trainer side, on every rank: our parse + checks, against a bare script's config build.
    os.environ[configs.PLANNED_WORLD_SIZE_ENV] = str(plan.train.num_processes)
    from maxent_grpo.train.entry import parse_and_check

    t = time.perf_counter()
    parse_and_check(["--config", recipe])
    trainer_ours = time.perf_counter() - t
    import dataclasses

    import trl
    import yaml

    t = time.perf_counter()
    raw = yaml.safe_load(Path(recipe).read_text())
    names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    trl.GRPOConfig(**{k: v for k, v in raw.items() if k in names})
    trainer_bare = time.perf_counter() - t

    print(
        json.dumps(
            {
                "phases_s": phases,
                "launcher_in_process_s": launcher_total,
                "trainer_parse_and_check_s": trainer_ours,
                "bare_config_s": trainer_bare,
                "plan": describe,
            }
        )
    )


if __name__ == "__main__":
    main()
