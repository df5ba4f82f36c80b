"""Reward throughput: completions scored per second by each built-in reward, on a realistic mix.

    .venv/bin/python bench/bench_rewards.py [--completions 2000] [--batch 20] [--repeats 3]
    .venv/bin/python bench/bench_rewards.py --code-only   # the code rewards and the sandbox

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
the figure is completions per second from the median time.

The rewards that run the completion's program (code, binary_code, python_unit_tests) are timed
on their own mix (--code-completions, default 40): per problem (add two numbers, three test
cases) a correct program, a wrong one, one that crashes and one without a code block; each run
is a sandboxed Python process, at most parallel_code_exec_per_proc (2) at a time. Their
figure is completions per second too (three sandbox runs per completion with a code block for
code/binary_code, one for python_unit_tests). The sandbox's own cost is timed apart: an empty
program run through the sandbox (bubblewrap, code_sandbox: bwrap) against a bare start of the
same interpreter, alternating, --sandbox-runs times each; and the trainer's own CPU per run
(--cpu-runs) for an honest program and one writing stdout a byte at a time. Writes
bench/results/rewards.json.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from benchlib import Measurement, bench_parser, figure, print_figures

KINDS = ("correct", "incorrect", "unformatted", "boxed", "long")
CODE_REWARDS = ("code", "binary_code", "python_unit_tests")
CODE_KINDS = {
    "correct": "a, b = map(int, input().split())\nprint(a + b)\n\ndef add(a, b):\n    return a + b",
    "wrong": "a, b = map(int, input().split())\nprint(a - b)\n\ndef add(a, b):\n    return a - b",
    "crash": "raise ValueError('no idea')",
    "no_block": None,
}
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


def build_code_mix(count: int, seed: int) -> tuple[list, dict]:
    """Completions and keywords (verification_info, solution) for the code rewards."""
    rng = random.Random(seed)
    completions, infos, tests = [], [], []
    while len(completions) < count:
        pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(3)]
        cases = [{"input": f"{a} {b}", "output": str(a + b)} for a, b in pairs]
        info = {"language": "python", "test_cases": cases}
        unit = "\n".join(f"assert add({a}, {b}) == {a + b}" for a, b in pairs)
        for code in CODE_KINDS.values():
            text = "Here it is." if code is None else f"Here it is:\n```python\n{code}\n```"
            completions.append([{"role": "assistant", "content": text}])
            infos.append(info)
            tests.append(unit)
    n = count
    return completions[:n], {"verification_info": infos[:n], "solution": tests[:n]}


def time_reward(func, make_mix, batch: int, repeats: int, guarded=None) -> dict:
    """Median seconds of `func` (and of its guarded twin) over fresh mixes, alternating."""
    times = {"unguarded": [], "guarded": []}
    for rep in range(repeats):
        order = [("unguarded", func)] + ([("guarded", guarded)] if guarded else [])
        for variant, f in order if rep % 2 == 0 else order[::-1]:
            completions, keywords = make_mix()
            start = time.perf_counter()
            for i in range(0, len(completions), batch):
                f(completions[i : i + batch], **{k: v[i : i + batch] for k, v in keywords.items()})
            times[variant].append(time.perf_counter() - start)
    return {variant: values for variant, values in times.items() if values}


def throughput_figure(name: str, rate: float, note: str) -> dict:
    """A reward's completions per second, printed as soon as it is measured."""
    fig = figure(f"reward {name}: throughput", rate, "completions/s", note=note)
    print_figures([fig])
    return fig


def bench_text_rewards(names: list[str], args) -> tuple[dict, list, dict]:
    """Throughput of the rewards that only read the text (and the guard's overhead)."""
    from maxent_grpo.rewards import get_reward_funcs, guard_rewards

    # A fresh mix (another seed: other problems, same composition) for every timed pass:
    # math-verify and sympy cache parses, so re-scoring the same texts would time the caches.
    seeds = iter(range(1, 10**6))

    def make_mix():
        completions, solutions, ids, _ = build_mix(args.completions, seed=next(seeds))
        return completions, {"solution": solutions, "completion_ids": ids}

    completions, keywords = make_mix()
    n = len(completions)
    funcs = get_reward_funcs(names, overlong_max_length=1024, overlong_buffer=256)
    results, figures = {}, []
    for name, plain, safe in zip(names, funcs, guard_rewards(funcs, 60.0)):
        # Warm-up: first calls import and build parser state (math-verify, sympy).
        plain(completions[:100], **{k: v[:100] for k, v in keywords.items()})
        times = time_reward(plain, make_mix, args.batch, args.repeats, safe)
        med = {variant: statistics.median(values) for variant, values in times.items()}
        rate, calls = n / med["unguarded"], -(-n // args.batch)
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
        note = (
            f"{1e6 / rate:.1f} us per completion; guarded {n / med['guarded']:,.0f}/s "
            f"(guard {guard_us:+.1f} us per call of {args.batch})"
        )
        figures.append(throughput_figure(name, rate, note))
    return results, figures, {"completions": n}


def bench_code_rewards(args) -> tuple[dict, list]:
    """Throughput of the rewards that run the program in the sandbox (default settings)."""
    from maxent_grpo.rewards import get_reward_funcs

    def make_mix():
        return build_code_mix(args.code_completions, seed=0)

    n = args.code_completions
    results, figures = {}, []
    for name, func in zip(CODE_REWARDS, get_reward_funcs(list(CODE_REWARDS))):
        times = time_reward(func, make_mix, args.batch, args.repeats)["unguarded"]
        rate = n / statistics.median(times)
        results[name] = {"seconds": times, "completions_per_s": rate}
        note = (
            f"{1e3 / rate:.0f} ms per completion (sandboxed runs, "
            f"{func.workers} at a time); mix: {', '.join(CODE_KINDS)}"
        )
        figures.append(throughput_figure(name, rate, note))
    return results, figures


def bench_sandbox_cost(runs: int) -> tuple[dict, list]:
    """Milliseconds of one empty program: bare interpreter start vs through the sandbox."""
    import subprocess

    from maxent_grpo.rewards.sandbox import Limits, interpreter, run_python

    bare_argv = [interpreter(), "-I", "-B", "-S", "-c", "pass"]
    times: dict[str, list[float]] = {"bare": [], "sandboxed": []}
    run_python("pass", "", Limits())  # the first run checks bwrap once (cached)
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(bare_argv, check=True)
        times["bare"].append(1e3 * (time.perf_counter() - start))
        start = time.perf_counter()
        assert run_python("pass", "", Limits()).ok
        times["sandboxed"].append(1e3 * (time.perf_counter() - start))
    med = {name: statistics.median(values) for name, values in times.items()}
    fig = figure(
        "code sandbox: one empty program, start to end",
        med["sandboxed"],
        "ms",
        note=f"bare interpreter start {med['bare']:.1f} ms (python -I -B -S); the difference is "
        "bubblewrap's namespaces, mounts, seccomp filter and the pidfd kill at the end",
    )
    print_figures([fig])
    return {"ms": times, "median_ms": med}, [fig]


#: A program writing stdout a byte at a time, pausing so that a reader can wake for each byte.
BYTE_AT_A_TIME = (
    "import os, time\nend = time.monotonic() + 1.8\nwhile time.monotonic() < end:\n"
    "    os.write(1, b'x')\n    time.sleep(0.0005)\n"
)


def bench_trainer_cpu(runs: int) -> tuple[dict, list]:
    """The trainer's own CPU per sandboxed run (its reader, the start and the end; not the
    program's): an honest program against one writing a byte at a time for 1.8 s."""
    from maxent_grpo.rewards.sandbox import Limits, run_python

    programs = {"honest": "a, b = 2, 3\nprint(a + b)", "byte_at_a_time": BYTE_AT_A_TIME}
    cpu: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(runs):
        for name, source in programs.items():
            start = time.process_time()
            run_python(source, "", Limits(wall_seconds=3))
            cpu[name].append(1e3 * (time.process_time() - start))
    med = {name: statistics.median(values) for name, values in cpu.items()}
    figs = [
        figure(
            f"code sandbox: trainer CPU per run, {name.replace('_', ' ')} program",
            med[name],
            "ms",
            note="time.process_time of the trainer around run_python (median)",
        )
        for name in programs
    ]
    print_figures(figs)
    return {"cpu_ms": cpu, "median_ms": med}, figs


def _text_figures(args, counts) -> tuple[dict, list, list]:
    from maxent_grpo.rewards import list_reward_names

    print(f"reward throughput: {counts}, batches of {args.batch}", flush=True)
    names = [name for name in list_reward_names() if name not in CODE_REWARDS]
    results, figures, _ = bench_text_rewards(names, args)
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
    return results, figures, figs


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--completions", type=int, default=2000, help="completions in the mix")
    parser.add_argument(
        "--batch", type=int, default=20, help="completions per reward call (4 prompts x 5)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per variant")
    parser.add_argument(
        "--code-completions", type=int, default=40, help="completions in the code rewards' mix"
    )
    parser.add_argument(
        "--sandbox-runs", type=int, default=20, help="empty programs timed, bare and sandboxed"
    )
    parser.add_argument(
        "--cpu-runs", type=int, default=5, help="runs timed for the trainer's CPU per run"
    )
    parser.add_argument(
        "--code-only", action="store_true", help="only the code rewards and the sandbox's cost"
    )
    args = parser.parse_args(argv)

    measurement = Measurement("rewards", args.output)
    counts = build_mix(args.completions, seed=0)[3]
    results, figures, figs = ({}, [], []) if args.code_only else _text_figures(args, counts)
    code_results, code_figures = bench_code_rewards(args)
    sandbox_cost, sandbox_figures = bench_sandbox_cost(args.sandbox_runs)
    trainer_cpu, cpu_figures = bench_trainer_cpu(args.cpu_runs)
    settings = {
        "completions": args.completions,
        "code_completions": args.code_completions,
        "sandbox_runs": args.sandbox_runs,
        "batch": args.batch,
        "repeats": args.repeats,
        "overlong_max_length": 1024,
        "overlong_buffer": 256,
    }
    measurement.finish(
        figures + figs + code_figures + sandbox_figures + cpu_figures,
        settings,
        rewards={**results, **code_results},
        sandbox_cost=sandbox_cost,
        trainer_cpu=trainer_cpu,
        mix=counts,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
