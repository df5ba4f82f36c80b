"""Rollout filters and generation rounds against plain GRPO, on a binary reward.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_rollouts.py [--steps 30] [--rounds 2]

The tiny Qwen2 model, GRPO, one CPU process, 2 groups of 4 completions per step, the same seed
for both variants. The reward is binary (`has_digit`: 1 when a completion has a digit among
its first characters, else 0), so many groups of 4 get the same reward and carry no
advantage. Variants, alternated --rounds times (ABBA):

- plain: TRL as is;
- filtered: rollout_filters [nonzero_std], max_generation_rounds 4, oversample_factor 1.5.

Figures per variant (medians over rounds): informative groups trained on per step (groups with
reward spread), completions generated per informative group, wall time per step, and the
mean generated reward over the last 5 steps before each variant had generated as many
completions as the run that generated fewest. Wall time per step is the
time between consecutive step events (generation, every round, scoring, training, logging).
Writes bench/results/rollouts.json (--first-chars 3: rollouts-first3.json with --output).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# has_digit looks at this many characters of a completion (the trainer process reads it from
# the environment: --first-chars); fewer: rarer successes, more groups without spread.
FIRST_CHARS = int(os.environ.get("BENCH_ROLLOUTS_FIRST_CHARS", "8"))


def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))


def has_digit(completions, **kwargs) -> list[float]:
    """1.0 when a digit appears in the completion's first FIRST_CHARS characters."""
    return [float(any(c.isdigit() for c in _text(c)[:FIRST_CHARS])) for c in completions]


def recipe(base: dict, model: Path, steps: int, filtered: bool) -> dict:
    data = {
        **{k: v for k, v in base.items() if k != "output_dir"},
        "method": "grpo",
        "model_name_or_path": str(model),
        "reward_funcs": ["bench_rollouts:has_digit"],
        "reward_weights": [1.0],
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 16,
        "max_steps": steps,
        "save_steps": steps,
        "logging_steps": 1,
        "report_to": "none",
    }
    if filtered:
        data.update(rollout_filters=["nonzero_std"], max_generation_rounds=4, oversample_factor=1.5)
    return data


def train(recipe_path: Path, first_chars: int) -> list[dict]:
    """One single-process run of src/grpo.py; the metrics of its step events."""
    from benchlib import REPO, child_env

    from maxent_grpo.rundir.events import read_events

    env = child_env()
    env["PYTHONPATH"] = f"{REPO / 'bench'}:{env.get('PYTHONPATH', '')}"
    env["BENCH_ROLLOUTS_FIRST_CHARS"] = str(first_chars)
    cmd = [sys.executable, str(REPO / "src" / "grpo.py"), "--config", str(recipe_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    out = recipe_path.parent / "out"
    steps = [
        {**e["metrics"], "time": e["time"]}
        for e in read_events(out)
        if e["event"] == "step" and "step_time" in e.get("metrics", {})
    ]
    for before, after in zip(steps, steps[1:], strict=False):
        after["wall_s"] = after["time"] - before["time"]  # from one step event to the next
    return steps


def summarise(steps: list[dict], budget: int) -> dict:
    """Per-step figures of one run; `budget`: completions generated for the reward figure."""
    k, groups = 4, 2
    informative, generated, rewards, used = [], [], [], 0
    for m in steps:
        if "rollouts/rounds" in m:
            made = m["rollouts/groups_generated"]
            useful = 0.0 if m["rollouts/skipped"] else m["rollouts/groups_trained"]
            reward = m.get("rollouts/reward_generated", m["reward"])
        else:
            made = groups
            useful = groups * (1.0 - m["frac_reward_zero_std"])
            reward = m["reward"]
        informative.append(useful)
        generated.append(made * k)
        if used < budget and made:
            rewards.append(reward)
        used += made * k
    total_informative = sum(informative)
    return {
        "informative_groups_per_step": statistics.mean(informative),
        "completions_per_informative_group": (
            sum(generated) / total_informative if total_informative else None
        ),
        "wall_s_per_step": statistics.median(m["wall_s"] for m in steps if "wall_s" in m),
        "reward_at_budget": statistics.mean(rewards[-5:]),
        "completions_generated": sum(generated),
    }


def main() -> None:
    import yaml
    from benchlib import SMOKE, Measurement, bench_parser, figure, print_figures, write_recipe

    from maxent_grpo.tiny_model import build_tiny_model

    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-chars", type=int, default=8)
    args = parser.parse_args()
    measurement = Measurement("rollouts", args.output)
    base = yaml.safe_load(SMOKE.read_text())
    runs: dict[str, list[list[dict]]] = {"plain": [], "filtered": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model")
        for index in range(args.rounds):
            order = ("plain", "filtered") if index % 2 == 0 else ("filtered", "plain")
            for name in order:
                folder = Path(tmp) / f"{name}-{index}"
                data = recipe(base, model, args.steps, name == "filtered")
                path = write_recipe(folder, None, "recipe.yaml", **data)
                runs[name].append(train(path, args.first_chars))
                print(f"round {index + 1}: {name} done", flush=True)
    budget = min(
        sum((m.get("rollouts/groups_generated", 2)) * 4 for m in steps)
        for steps in runs["plain"] + runs["filtered"]
    )
    summary = {
        name: [summarise(steps, budget) for steps in variant] for name, variant in runs.items()
    }
    figures = []
    for key, unit in (
        ("informative_groups_per_step", "groups"),
        ("completions_per_informative_group", "completions"),
        ("wall_s_per_step", "s"),
        ("reward_at_budget", "reward"),
    ):
        for name in ("plain", "filtered"):
            values = [s[key] for s in summary[name] if s[key] is not None]
            value = statistics.median(values) if values else None
            figures.append(figure(f"{name}: {key}", value, unit, note=f"budget {budget}"))
    print_figures(figures)
    measurement.finish(figures, vars(args) | {"output": str(args.output)}, runs=summary)


if __name__ == "__main__":
    main()
