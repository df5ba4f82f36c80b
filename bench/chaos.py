"""Chaos campaign: faults at random moments of tiny real runs, every invariant checked after.

From a seed, draws trials (a run kind, a moment of the run's life, a fault), runs each (a
failpoint holds the process that reaches the moment while the fault goes in), recovers as a
user would (the same command again) and checks the invariants (tests/helpers/chaos_checks.py).
Prints one row per trial and a summary; writes both as JSON (bench/results/chaos.json).

    python bench/chaos.py --trials 60 --seed 1            # the campaign (make chaos)
    python bench/chaos.py --replay 123456789              # one trial again, from its seed
    python bench/chaos.py --trials 4 --seed 54 --no-servers   # the short CI share
    python bench/chaos.py --trials 6 --slurm 1node        # under the running test cluster
    python bench/chaos.py --trials 2 --slurm 3node        # a server node's network cut
    python bench/chaos.py --trials 3 --slurm 1node --servers-only   # a vLLM server in the job

Every trial's spec follows from its own seed (trial_from_seed); the campaign only picks the
seeds, so that each moment and each fault comes up about equally often. A failing trial
prints `replay: python bench/chaos.py --replay SEED`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import bench_parser, figure, loadavg, machine, write_result  # noqa: E402

from helpers.chaos_slurm import (  # noqa: E402
    SLURM_FAULTS,
    SLURM_SEEDS,
    SLURM_VLLM_SEEDS,
    Cluster,
    run_slurm_trial,
    slurm_expected,
    slurm_trial_from_seed,
)
from helpers.chaos_trial import (  # noqa: E402
    FAULTS,
    MOMENTS,
    Kind,
    Trial,
    expected_outcomes,
    run_trial,
    tiny_model,
    write_trial_recipe,
)
from helpers.launched import Launched  # noqa: E402

STEP_MOMENTS = ("generation", "scoring", "optimizer_step", "weight_push")
SERVER_MOMENTS = ("server_start", "weight_push")
DAMAGE = ("checkpoint_truncated", "checkpoint_file_removed")


def trial_from_seed(seed: int) -> Trial:
    """Everything about a trial, from its seed alone (pure); seeds from SLURM_SEEDS up draw
    a trial under the Slurm test cluster (helpers.chaos_slurm)."""
    if seed >= SLURM_SEEDS:
        return slurm_trial_from_seed(seed)
    rng = random.Random(seed)
    moment, fault = rng.choice(MOMENTS), rng.choice(FAULTS)
    target = fault.partition("_")[2]
    # Half the server starts are the reward-model server's (no vLLM: cheap on a loaded CPU).
    rm_start = moment == "server_start" and target != "server" and rng.random() < 0.5
    server = moment in SERVER_MOMENTS and not rm_start
    server = server or target == "server" or rng.random() < 0.15
    kind = Kind(
        method=rng.choice(("grpo", "maxent")),
        procs=rng.choice((1, 2)),
        server=server,
        async_=server and rng.random() < 0.5,
        reward_server=target == "reward_server" or rm_start,
        cluster="3node" if fault == "network_cut" else "none",
    )
    step = None
    if moment in STEP_MOMENTS:
        step = rng.randint(3 if fault in DAMAGE else 2, 6)
    elif moment == "checkpoint_write":
        step = 4 if fault in DAMAGE else rng.choice((2, 4))
    return Trial(seed=seed, kind=kind, moment=moment, step=step, fault=fault)


def expected(trial: Trial) -> tuple[str | None, ...]:
    """The classes the trial's faulted attempt may end with (with Slurm or without)."""
    return slurm_expected(trial) if trial.kind.cluster != "none" else expected_outcomes(trial)


def allowed(trial: Trial, servers: bool | str, clusters: tuple[str, ...]) -> bool:
    """servers: False (none), True (some), "only" (every trial has a vLLM server)."""
    if trial.kind.cluster not in clusters or (trial.kind.server and not servers):
        return False
    if servers == "only" and not trial.kind.server:
        return False
    # No checkpoint exists yet when the server starts: nothing to damage.
    return not (trial.moment == "server_start" and trial.fault in DAMAGE)


def draw(
    seed: int, count: int, servers: bool | str = True, clusters=("none",), only=()
) -> list[Trial]:
    """`count` trials whose (moment, fault) pairs go round every allowed moment and fault
    (`only`: the moments and faults to draw from, when not all)."""
    rng = random.Random(seed)
    seeds = range(1, SLURM_SEEDS) if "none" in clusters else range(SLURM_SEEDS, 2**32)
    if servers == "only" and "1node" in clusters:  # Slurm's vLLM trials have seeds of their own
        seeds = range(SLURM_VLLM_SEEDS, 2**33)
    probe = [trial_from_seed(s) for s in rng.sample(seeds, 60000)]
    pool = [t for t in probe if allowed(t, servers, clusters)]
    if only:
        pool = [t for t in pool if t.moment in only and t.fault in only]
    moments = sorted({t.moment for t in pool}, key=MOMENTS.index)
    order = [*FAULTS, *SLURM_FAULTS]
    faults = sorted({t.fault for t in pool}, key=order.index)
    trials, used = [], Counter()
    for index in range(count):
        moment = moments[index % len(moments)]
        fault = min(faults, key=lambda f: (used[f], rng.random()))
        fits = [t for t in pool if t.moment == moment and t.fault == fault and t not in trials]
        fits = fits or [t for t in pool if t.moment == moment and t not in trials]
        trials.append(fits[0])
        used[trials[-1].fault] += 1
    return trials


# --- references and the campaign ----------------------------------------------------------


def reference(trial: Trial, root: Path) -> Path | None:
    """The uninterrupted seeded run's final weights for the trial's kind (run once, kept)."""
    if not trial.kind.deterministic:
        return None
    kind = replace(trial.kind, cluster="none")  # the same run without Slurm: the same weights
    folder = root / f"reference-{kind.name}"
    weights = folder / "out" / "model.safetensors"
    if not weights.is_file():
        plain = Trial(seed=0, kind=kind, moment="generation", step=None, fault="none")
        run = Launched(folder, write_trial_recipe(plain, folder))
        if run.wait(timeout=600) != 0:
            raise SystemExit(f"the reference run failed:\n{run.text[-3000:]}")
    return weights


def summary(rows: list[dict]) -> dict:
    failed = [r for r in rows if r["problems"]]
    return {
        "trials": len(rows),
        "survived": len(rows) - len(failed),
        "steps_lost": sum(r["steps_lost"] for r in rows),
        "steps_redone": sum(r["steps_redone"] for r in rows),
        "orphans": sum(r["orphans"] for r in rows),
        "corrupted": sum(r["corrupted"] for r in rows),
        "outcome_wrong": sum(any("outcome" in p for p in r["problems"]) for r in rows),
        "moments": dict(Counter(r["moment"] for r in rows if r["applied"])),
        "faults": dict(Counter(r["fault"] for r in rows if r["applied"])),
        "failed_seeds": [r["seed"] for r in failed],
        "found_and_fixed": {r["seed"]: r["fixed"] for r in rows if r.get("fixed")},
        # Rows rebuilt from the docs' table (bench/chaos_rows.jsonl) have no wall time.
        "wall_s": round(sum(r["wall_s"] or 0 for r in rows), 1),
        "rows_without_wall_s": sum(r["wall_s"] is None for r in rows),
    }


COLUMNS = ("seed", "kind", "moment", "step", "fault", "outcome", "recovered", "steps_lost")
COLUMNS += ("steps_redone", "first_step_s", "orphans", "weights_equal", "wall_s")


def table(rows: list[dict]) -> str:
    cells = [COLUMNS] + [tuple(str(r[c]) for c in COLUMNS) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)) for line in cells]
    for row in rows:
        for problem in row["problems"]:
            lines.append(f"FAIL seed {row['seed']}: {problem}")
    return "\n".join(lines)


def print_row(row: dict) -> None:
    verdict = "ok" if not row["problems"] else "FAIL"
    print(
        f"[{verdict}] seed {row['seed']} {row['kind']} {row['moment']}:{row['step']} "
        f"{row['fault']} -> {row['outcome']} (expected {row['expected']}), recovered "
        f"{row['recovered']}, lost {row['steps_lost']}, redone {row['steps_redone']}, "
        f"orphans {row['orphans']}, {row['wall_s']} s",
        flush=True,
    )
    for problem in row["problems"]:
        print(f"    {problem}", flush=True)
    if row["problems"]:
        print(f"    replay: python bench/chaos.py --replay {row['seed']}", flush=True)


def campaign(trials: list[Trial], root: Path, keep: bool = False, jobs: int = 1) -> list[dict]:
    """Every trial (`jobs` at a time), in the order drawn; the references first. Slurm trials
    run one at a time, on the test cluster running now (tests/slurm/cluster.sh start)."""
    kinds = {t.kind: t for t in trials}
    clusters = {t.kind.cluster for t in trials} - {"none"}
    cluster = Cluster.running(3 if "3node" in clusters else 1) if clusters else None
    jobs = 1 if cluster else jobs
    with ThreadPoolExecutor(jobs) as pool:
        weights = dict(zip(kinds, pool.map(lambda t: reference(t, root), kinds.values())))

    def one(index: int) -> dict:
        trial = trials[index]
        folder = root / f"trial-{index:03d}-{trial.seed}"
        if trial.kind.cluster != "none":
            row = run_slurm_trial(trial, folder, weights[trial.kind], cluster)
        else:
            row = run_trial(trial, folder, weights[trial.kind])
        print_row(row)
        with open(root / "rows.jsonl", "a") as rows:  # a campaign stopped keeps its rows
            rows.write(json.dumps(row) + "\n")
        if not keep and not row["problems"]:
            shutil.rmtree(folder, ignore_errors=True)
        return row

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, range(len(trials))))


def main(argv=None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="skip the campaign's first N")
    parser.add_argument("--replay", type=int, action="append", help="a trial's seed (repeatable)")
    parser.add_argument("--no-servers", action="store_true", help="no vLLM server trials")
    parser.add_argument("--servers-only", action="store_true", help="only vLLM server trials")
    parser.add_argument("--only", default="", help="comma-separated moments and faults to draw")
    parser.add_argument("--workdir", type=Path, default=None, help="trials' folders (kept)")
    parser.add_argument("--list", action="store_true", help="print the drawn trials only")
    parser.add_argument("--jobs", type=int, default=1, help="trials run at once")
    parser.add_argument(
        "--slurm",
        choices=("1node", "3node"),
        help="trials under the running test cluster (tests/slurm/cluster.sh start [--nodes 3])",
    )
    parser.add_argument(
        "--merge", type=Path, nargs="+", help="campaigns run in pieces: their rows.jsonl files"
    )
    parser.add_argument("--markdown", type=Path, help="also write the docs' table there")
    args = parser.parse_args(argv)
    if args.merge:
        return report(merged(args.merge), args, load_before=None, started=None)
    if args.replay:
        trials = [trial_from_seed(s) for s in args.replay]
    else:
        servers = "only" if args.servers_only else not args.no_servers
        only = tuple(filter(None, args.only.split(",")))
        clusters = (args.slurm,) if args.slurm else ("none",)
        trials = draw(args.seed, args.trials, servers, clusters, only)[args.first :]
    if args.list:
        for trial in trials:
            print(trial.seed, trial.kind.name, trial.moment, trial.step, trial.fault)
        return 0
    tiny_model()
    # vLLM's CPU build pins its worker to core 0 by default, whoever else runs there: the
    # trainers and other trials share the cores (tests/vllm_server/, tests/slurm/ do this too).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    root = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    load_before, started = loadavg(), time.monotonic()
    rows = campaign(trials, root, keep=args.workdir is not None, jobs=args.jobs)
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return report(rows, args, load_before, started)


def merged(paths: list[Path]) -> list[dict]:
    """The rows of several pieces, the last row of a seed winning (a replay after a fix)."""
    rows: dict[int, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                earlier = rows.get(row["seed"], {})
                if earlier.get("problems") and not row["problems"]:
                    row["fixed"] = earlier["problems"]  # what it found before the fix
                    row["first_outcome"] = earlier["outcome"]
                rows[row["seed"]] = row
    return list(rows.values())


def markdown(rows: list[dict]) -> str:
    """The docs' table (docs/reliability.md): one line per trial, by moment then fault."""
    head = "| seed | run | moment | fault | outcome | steps redone | first step s | weights equal "
    lines = [head + "| invariants |", "| --- " * 9 + "|"]
    order = sorted(rows, key=lambda r: (MOMENTS.index(r["moment"]), r["fault"], r["kind"]))
    for r in order:
        moment = f"{r['moment']}:{r['step']}" if r["step"] else r["moment"]
        equal = {True: "yes", False: "NO", None: "not compared"}[r["weights_equal"]]
        verdict = "held" if not r["problems"] else "FAILED: " + "; ".join(r["problems"])
        if r.get("fixed"):
            verdict += f" (replayed after a fix; first outcome {r.get('first_outcome')})"
        cells = (r["seed"], r["kind"].removesuffix("-none"), moment, r["fault"])
        cells += (r["outcome"] or "none", r["steps_redone"], r["first_step_s"], equal, verdict)
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def report(rows: list[dict], args, load_before, started) -> int:
    total = summary(rows)
    print(table(rows))
    print(json.dumps(total, indent=1))
    figures = [
        figure("trials survived", total["survived"], "trials", note=f"of {total['trials']}"),
        figure("steps lost", total["steps_lost"], "steps", target=0),
        figure("orphans", total["orphans"], "processes", target=0),
        figure("corrupted outputs", total["corrupted"], "files", target=0),
    ]
    payload = {"figures": figures, "summary": total, "rows": rows, "seed": args.seed}
    payload.update(load_average={"before": load_before, "after": loadavg()}, machine=machine())
    payload["wall_s"] = round(time.monotonic() - started, 1) if started else None
    write_result("chaos", payload, args.output)
    if args.markdown:
        args.markdown.write_text(markdown(rows) + "\n")
    return 1 if total["failed_seeds"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
