"""Reward throughput: completions scored per second by each built-in reward, on a realistic mix.

    .venv/bin/python bench/bench_rewards.py [--completions 2000] [--batch 20] [--repeats 3]

The mix is built from built-in dataset problems (`builtin:mixed`: arithmetic and word problems,
exact integer answers), one fifth each of:
- correct:     <think>...</think><answer>...</answer> with the right answer (open-r1 layout);
- incorrect:   the same layout with a wrong answer;
- unformatted: prose without tags ("... so the answer is 42.");
- boxed:       prose ending in $\\boxed{42}$ (right answer);
- long:        ~2,000 characters of repetitive reasoning, then an answer block (right or not).
Completions are passed the way TRL passes them for a conversational dataset (a list with one
assistant message), with `solution` and `completion_ids` keywords, grouped by prompt (the five
completions of a problem together, as TRL groups num_generations completions) in batches of
--batch (one reward call per batch, as TRL calls a reward once per generation batch).

Every timed pass scores a fresh mix (other problems, same composition): math-verify and sympy
cache parses, so scoring the same texts again would time the caches. Each reward is timed
unguarded (the function itself) and guarded (what training uses:
maxent_grpo.rewards.guard_rewards with the default 60 s timeout), alternating, --repeats times;
the figure is completions per second from the median time. Writes bench/results/rewards.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from benchlib import figure, loadavg, machine, print_figures, write_result

KINDS = ("correct", "incorrect", "unformatted", "boxed", "long")
FILLER = (
    "First I look at the numbers. Then I multiply the first two and add the rest, "
    "checking each partial result again. "
)


def completion_text(kind: str, problem: str, answer: str, rng: random.Random) -> str:
    wrong = str(int(answer) + rng.randint(1, 9))
    reasoning = f"The question is: {problem} Let me work it out step by step."
    if kind == "correct":
        return f"<think>\n{reasoning}\n</think>\n<answer>\n{answer}\n</answer>"
    if kind == "incorrect":
        return f"<think>\n{reasoning}\n</think>\n<answer>\n{wrong}\n</answer>"
    if kind == "unformatted":
        return f"{reasoning} Adding it all up, the result is {answer}."
    if kind == "boxed":
        return f"{reasoning} So the final answer is $\\boxed{{{answer}}}$."
    body = reasoning + " " + FILLER * rng.randint(14, 20)
    final = answer if rng.random() < 0.5 else wrong
    return f"<think>\n{body}\n</think>\n<answer>\n{final}\n</answer>"


def build_mix(count: int, seed: int = 0) -> tuple[list, list[str], list[list[int]], dict]:
    from maxent_grpo.data import builtin_dataset

    rng = random.Random(seed)
    rows = builtin_dataset("mixed", num_rows=max(1, count // len(KINDS) + 1), seed=seed)
    items = []
    for row in rows:
        # One group per prompt, as TRL batches num_generations completions of a prompt.
        group = [
            (kind, completion_text(kind, row["problem"], row["solution"], rng), row["solution"])
            for kind in KINDS
        ]
        rng.shuffle(group)
        items += group
    items = items[:count]
    completions = [[{"role": "assistant", "content": text}] for _, text, _ in items]
    solutions = [solution for _, _, solution in items]
    # About 3.5 characters per token, as the tiny model's BPE gives on this text.
    completion_ids = [list(range(max(1, len(text) * 2 // 7))) for _, text, _ in items]
    counts = {kind: sum(1 for k, _, _ in items if k == kind) for kind in KINDS}
    counts["mean_chars"] = statistics.fmean(len(text) for _, text, _ in items)
    return completions, solutions, completion_ids, counts


def score_all(func, completions, solutions, completion_ids, batch: int) -> float:
    """Seconds to score every completion, one call per batch."""
    start = time.perf_counter()
    for i in range(0, len(completions), batch):
        func(
            completions[i : i + batch],
            solution=solutions[i : i + batch],
            completion_ids=completion_ids[i : i + batch],
        )
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=2000, help="completions in the mix")
    parser.add_argument(
        "--batch", type=int, default=20, help="completions per reward call (4 prompts x 5)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per variant")
    parser.add_argument("--output", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)

    from maxent_grpo.rewards import get_reward_funcs, guard_rewards, list_reward_names

    load_before = loadavg()
    started = time.monotonic()
    # A fresh mix (another seed: other problems, same composition) for every timed pass:
    # math-verify and sympy cache parses, so re-scoring the same texts would time the caches.
    seeds = iter(range(1, 10**6))
    completions, solutions, completion_ids, counts = build_mix(args.completions, seed=0)
    n = len(completions)
    print(f"reward throughput: {n} completions ({counts}), batches of {args.batch}", flush=True)
    names = list_reward_names()
    funcs = get_reward_funcs(names, overlong_max_length=1024, overlong_buffer=256)
    guarded = guard_rewards(funcs, 60.0)
    results = {}
    figures = []
    for name, plain, safe in zip(names, funcs, guarded):
        # Warm-up: first calls import and build parser state (math-verify, sympy).
        score_all(plain, completions[:100], solutions[:100], completion_ids[:100], args.batch)
        times = {"unguarded": [], "guarded": []}
        for rep in range(args.repeats):
            order = (("unguarded", plain), ("guarded", safe))
            for variant, func in order if rep % 2 == 0 else order[::-1]:
                mix = build_mix(args.completions, seed=next(seeds))[:3]
                times[variant].append(score_all(func, *mix, args.batch))
        med = {variant: statistics.median(values) for variant, values in times.items()}
        rate = n / med["unguarded"]
        calls = -(-n // args.batch)
        guard_us = 1e6 * (med["guarded"] - med["unguarded"]) / calls
        results[name] = {
            "seconds": times,
            "median_s": med,
            "completions_per_s": rate,
            "guarded_completions_per_s": n / med["guarded"],
            "guard_ratio": med["guarded"] / med["unguarded"],
            "guard_overhead_us_per_call": guard_us,
            "us_per_completion": 1e6 * med["unguarded"] / n,
        }
        figs = [
            figure(
                f"reward {name}: throughput",
                rate,
                "completions/s",
                note=f"{1e6 / rate:.1f} us per completion; guarded {n / med['guarded']:,.0f}/s "
                f"(guard {guard_us:+.1f} us per call of {args.batch})",
            ),
        ]
        print_figures(figs)
        figures += figs
    # The guard's cost does not depend on the reward: one figure, the median over rewards
    # (per-reward differences of a few us are timing noise next to math-verify's ms).
    guard = statistics.median(r["guard_overhead_us_per_call"] for r in results.values())
    figs = [
        figure(
            "reward guard (timeout + failure policy): overhead per reward call",
            guard,
            "us",
            note="median over the built-in rewards; TRL calls each reward once per generation "
            "batch",
        )
    ]
    print_figures(figs)
    figures += figs
    write_result(
        "rewards",
        {
            "figures": figures,
            "rewards": results,
            "mix": counts,
            "load_average": {"before": load_before, "after": loadavg()},
            "settings": {
                "completions": n,
                "batch": args.batch,
                "repeats": args.repeats,
                "overlong_max_length": 1024,
                "overlong_buffer": 256,
            },
            "machine": machine(),
            "wall_s": time.monotonic() - started,
        },
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
