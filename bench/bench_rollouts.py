"""Rollout filters, generation rounds and over-sampling by signal against plain GRPO.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_rollouts.py [--steps 30] [--rounds 2]

The tiny Qwen2 model, GRPO, one CPU process, 2 groups of 4 completions per step, the same seed
for every variant. The reward is binary (`has_digit`: 1 when a completion has a digit among
its first characters, else 0), so many groups of 4 get the same reward and carry no
advantage. Variants, alternated --rounds times (ABBA; --variants picks some):

- plain: TRL as is;
- filtered: rollout_filters [nonzero_std], max_generation_rounds 4, oversample_factor 1.5;
- filtered-best: the same with oversample_keep best;
- oversample: no filter, oversample_factor 3 (6 groups generated, 2 trained, 2 carried over);
- oversample-best: the same with oversample_keep best (the 2 of largest spread trained).

Figures per variant (medians over rounds): informative groups trained per step (groups with
reward spread), informative groups trained per generated group, completions generated per
informative group, the mean signal (reward standard deviation) of the groups trained, wall time
per step, and the mean generated reward over the last 5 steps before each variant had generated
as many completions as the run that generated fewest. Then best against first (ratios) for
each pair run. Wall time per step is the time between consecutive step events (generation,
every round, scoring, training, logging).
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


def recipe(base: dict, model: Path, steps: int, variant: str) -> dict:
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
    data.update(VARIANTS[variant])
    return data


FILTERED = dict(rollout_filters=["nonzero_std"], max_generation_rounds=4, oversample_factor=1.5)
OVERSAMPLE = dict(oversample_factor=3.0)
VARIANTS = {
    "plain": {},
    "filtered": FILTERED,
    "filtered-best": {**FILTERED, "oversample_keep": "best"},
    "oversample": OVERSAMPLE,
    "oversample-best": {**OVERSAMPLE, "oversample_keep": "best"},
}
# best against first: (variant with best, the same with first)
PAIRS = (("filtered-best", "filtered"), ("oversample-best", "oversample"))


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
    informative, generated, rewards, signals, used = [], [], [], [], 0
    for m in steps:
        if "rollouts/rounds" in m:
            made = m["rollouts/groups_generated"]
            trained = 0.0 if m["rollouts/skipped"] else m["rollouts/groups_trained"]
            reward = m.get("rollouts/reward_generated", m["reward"])
            if trained:
                signals.append(m["rollouts/signal_trained"])
        else:
            made, trained, reward = groups, groups, m["reward"]
        # frac_reward_zero_std: of the groups trained (the rollouts replace TRL's figure)
        informative.append(trained * (1.0 - m["frac_reward_zero_std"]))
        generated.append(made * k)
        if used < budget and made:
            rewards.append(reward)
        used += made * k
    total_informative = sum(informative)
    return {
        "informative_groups_per_step": statistics.mean(informative),
        "informative_per_generated_group": total_informative / (sum(generated) / k),
        "signal_trained": statistics.mean(signals) if signals else None,
        "completions_per_informative_group": (
            sum(generated) / total_informative if total_informative else None
        ),
        "wall_s_per_step": statistics.median(m["wall_s"] for m in steps if "wall_s" in m),
        "reward_at_budget": statistics.mean(rewards[-5:]),
        "completions_generated": sum(generated),
    }


FIGURES = (
    ("informative_groups_per_step", "groups"),
    ("informative_per_generated_group", "groups"),
    ("completions_per_informative_group", "completions"),
    ("signal_trained", "reward std"),
    ("wall_s_per_step", "s"),
    ("reward_at_budget", "reward"),
)


def run_variants(names: list[str], rounds: int, steps: int, first_chars: int) -> dict:
    """Each variant's runs (the step metrics of each), alternated ABBA over `rounds`."""
    import yaml
    from benchlib import SMOKE, write_recipe

    from maxent_grpo.tiny_model import build_tiny_model

    base = yaml.safe_load(SMOKE.read_text())
    runs: dict[str, list[list[dict]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model")
        for index in range(rounds):
            for name in names if index % 2 == 0 else names[::-1]:
                folder = Path(tmp) / f"{name}-{index}"
                path = write_recipe(folder, None, "recipe.yaml", **recipe(base, model, steps, name))
                runs[name].append(train(path, first_chars))
                print(f"round {index + 1}: {name} done", flush=True)
    return runs


def figures_of(summary: dict, budget: int) -> list[dict]:
    """The median of each figure per variant, then best / first for each pair run."""
    from benchlib import figure

    medians: dict[tuple[str, str], float | None] = {}
    figures = []
    for key, unit in FIGURES:
        for name, runs in summary.items():
            values = [s[key] for s in runs if s[key] is not None]
            medians[name, key] = statistics.median(values) if values else None
            figures.append(
                figure(f"{name}: {key}", medians[name, key], unit, note=f"budget {budget}")
            )
    for best, first in PAIRS:
        if best not in summary or first not in summary:
            continue
        for key in ("informative_per_generated_group", "signal_trained"):
            a, b = medians[best, key], medians[first, key]
            ratio = a / b if a is not None and b else None
            figures.append(figure(f"{best} / {first}: {key}", ratio, "x", is_ratio=True))
    return figures


def main() -> None:
    from benchlib import Measurement, bench_parser, print_figures

    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-chars", type=int, default=8)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args()
    measurement = Measurement("rollouts", args.output)
    runs = run_variants(args.variants, args.rounds, args.steps, args.first_chars)
    budget = min(
        sum((m.get("rollouts/groups_generated", 2)) * 4 for m in steps)
        for variant in runs.values()
        for steps in variant
    )
    summary = {
        name: [summarise(steps, budget) for steps in variant] for name, variant in runs.items()
    }
    figures = figures_of(summary, budget)
    print_figures(figures)
    measurement.finish(figures, vars(args) | {"output": str(args.output)}, runs=summary)


if __name__ == "__main__":
    main()
