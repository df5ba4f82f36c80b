"""Replay (replay_share 0.5) against plain GRPO, on a sparse binary reward.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_replay.py [--steps 30] [--rounds 2]

The tiny Qwen2 model, GRPO, one CPU process, 2 groups of 4 completions per step, the same seed
for both variants. The reward is binary (`has_digit`: 1 when a completion has a digit among
its first --first-chars characters), so many groups get the same reward and carry no
advantage: the case replay is meant for (informative groups are rare; replay trains on them
again). Variants, alternated --rounds times (ABBA):

- plain: TRL as is;
- replay: replay_share 0.5 (1 of the 2 groups replayed), replay_priority advantage.

Figures per variant (medians over rounds): informative groups trained on per step (fresh ones
with reward spread, plus the replayed ones, which have it by their priority), completions
generated per informative group trained, the mean reward of the last 5 steps before each
variant had generated as many completions as the run that generated fewest (the same budget),
the share of tokens clipped (`clip_ratio/region_mean`) and wall time per step; and the ratios
replay / plain. Writes bench/results/replay.json.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FIRST_CHARS = int(os.environ.get("BENCH_REPLAY_FIRST_CHARS", "8"))
K, GROUPS = 4, 2  # completions per group, groups per step


def has_digit(completions, **kwargs) -> list[float]:
    """1.0 when a digit appears in the completion's first FIRST_CHARS characters."""

    def text(c) -> str:
        return c if isinstance(c, str) else "".join(str(m.get("content", "")) for m in c)

    return [float(any(ch.isdigit() for ch in text(c)[:FIRST_CHARS])) for c in completions]


def recipe(base: dict, model: Path, steps: int, replay: bool) -> dict:
    data = {
        **{k: v for k, v in base.items() if k != "output_dir"},
        "method": "grpo",
        "model_name_or_path": str(model),
        "reward_funcs": ["bench_replay:has_digit"],
        "reward_weights": [1.0],
        "num_generations": K,
        "per_device_train_batch_size": K * GROUPS,
        "max_completion_length": 16,
        "max_steps": steps,
        "save_steps": steps,
        "logging_steps": 1,
        "report_to": "none",
    }
    if replay:
        data.update(replay_share=0.5, replay_priority="advantage")
    return data


def train(recipe_path: Path, first_chars: int) -> list[dict]:
    """One single-process run of src/grpo.py; the metrics of its step events."""
    from benchlib import REPO, child_env

    from maxent_grpo.rundir.events import read_events

    env = child_env()
    env["PYTHONPATH"] = f"{REPO / 'bench'}:{env.get('PYTHONPATH', '')}"
    env["BENCH_REPLAY_FIRST_CHARS"] = str(first_chars)
    cmd = [sys.executable, str(REPO / "src" / "grpo.py"), "--config", str(recipe_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    steps = [
        {**e["metrics"], "time": e["time"]}
        for e in read_events(recipe_path.parent / "out")
        if e["event"] == "step" and "step_time" in e.get("metrics", {})
    ]
    for before, after in zip(steps, steps[1:], strict=False):
        after["wall_s"] = after["time"] - before["time"]  # from one step event to the next
    return steps


def generated_groups(m: dict) -> float:
    return GROUPS - m.get("replay/groups", 0.0)


def summarise(steps: list[dict], budget: int) -> dict:
    """Per-step figures of one run; `budget`: completions generated for the reward figure."""
    informative, generated, rewards, used = [], [], [], 0
    for m in steps:
        made = generated_groups(m)
        informative.append(made * (1.0 - m["frac_reward_zero_std"]) + m.get("replay/groups", 0))
        generated.append(made * K)
        if used < budget:
            rewards.append(m["reward"])  # TRL's reward: the fresh groups'
        used += made * K
    total = sum(informative)
    return {
        "informative_groups_per_step": statistics.mean(informative),
        "completions_per_informative_group": sum(generated) / total if total else None,
        "reward_at_budget": statistics.mean(rewards[-5:]),
        "clipped_token_share": statistics.mean(m.get("clip_ratio/region_mean", 0) for m in steps),
        "wall_s_per_step": statistics.median(m["wall_s"] for m in steps if "wall_s" in m),
        "completions_generated": sum(generated),
    }


FIGURES = (
    ("informative_groups_per_step", "groups"),
    ("completions_per_informative_group", "completions"),
    ("reward_at_budget", "reward"),
    ("clipped_token_share", "share"),
    ("wall_s_per_step", "s"),
)


def main() -> None:
    import yaml
    from benchlib import SMOKE, Measurement, bench_parser, figure, print_figures, write_recipe

    from maxent_grpo.tiny_model import build_tiny_model

    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-chars", type=int, default=FIRST_CHARS)
    args = parser.parse_args()
    measurement = Measurement("replay", args.output)
    base = yaml.safe_load(SMOKE.read_text())
    runs: dict[str, list[list[dict]]] = {"plain": [], "replay": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model")
        for index in range(args.rounds):
            order = ("plain", "replay") if index % 2 == 0 else ("replay", "plain")
            for name in order:
                folder = Path(tmp) / f"{name}-{index}"
                data = recipe(base, model, args.steps, name == "replay")
                path = write_recipe(folder, None, "recipe.yaml", **data)
                runs[name].append(train(path, args.first_chars))
                print(f"round {index + 1}: {name} done", flush=True)
    budget = min(
        int(sum(generated_groups(m) * K for m in steps)) for steps in runs["plain"] + runs["replay"]
    )
    summary = {name: [summarise(s, budget) for s in variant] for name, variant in runs.items()}
    figures, medians = [], {}
    for key, unit in FIGURES:
        for name in ("plain", "replay"):
            values = [s[key] for s in summary[name] if s[key] is not None]
            medians[name, key] = statistics.median(values) if values else None
            figures.append(
                figure(f"{name}: {key}", medians[name, key], unit, note=f"budget {budget}")
            )
        plain, replay = medians["plain", key], medians["replay", key]
        ratio = replay / plain if plain and replay is not None else None
        figures.append(figure(f"replay / plain: {key}", ratio, "x", is_ratio=True))
    print_figures(figures)
    measurement.finish(figures, vars(args) | {"output": str(args.output)}, runs=summary)


if __name__ == "__main__":
    main()
