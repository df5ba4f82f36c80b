"""MaxEnt-GRPO step time relative to GRPO: same model, data, rewards, batch and reference model.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_maxent.py [--steps 25] [--warmup 5] [--rounds 3]

Both methods train the tiny Qwen2 model with 2 CPU processes through the launcher; GRPO with
beta > 0 and MaxEnt with init_kl_coeff = beta, so both run the same reference model. Every
completion is generated to full length (min_new_tokens), so generation costs the same. The
step time is TRL's `step_time` metric (generation, scoring, forward and backward of one
optimizer step). The first --warmup steps of each run are dropped; runs of the two methods
alternate --rounds times to spread machine noise. Prints the medians and their ratio and writes
bench/results/maxent_vs_grpo.json. Target: ratio <= 1.10.

On a shared machine the end-to-end medians move with other processes' load; the per-round
ratios show how much. The script therefore also times, in one process with interleaved calls,
the parts MaxEnt changes: its loss + backward against TRL's GRPO loss + backward, and the
weight computation.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import REPO, RESULTS_DIR, SMOKE_MAXENT, bench_parser

from maxent_grpo.rundir.checkpoints import last_complete_checkpoint
from maxent_grpo.tiny_model import build_tiny_model

RESULTS = RESULTS_DIR / "maxent_vs_grpo.json"
TARGET_RATIO = 1.10
KL_COEFF = 0.04
COMPONENT_LENGTH = 32  # completion tokens of the in-process timings


def recipes(model: Path, steps: int, workdir: Path) -> dict[str, Path]:
    """The MaxEnt smoke recipe and its GRPO twin (MaxEnt keys and `method: maxent` out, same
    beta)."""
    common = yaml.safe_load(SMOKE_MAXENT.read_text())
    common.update(
        model_name_or_path=str(model),
        max_steps=steps,
        save_steps=steps,  # one checkpoint at the end: its trainer_state.json has the logs
        logging_steps=1,
        report_to="none",
        generation_kwargs={"min_new_tokens": common["max_completion_length"]},
    )
    maxent = {**common, "init_kl_coeff": KL_COEFF}
    maxent_only = ("method", "init_kl_coeff", "kl_target", "kl_horizon")
    grpo = {k: v for k, v in common.items() if not k.startswith("maxent_") and k not in maxent_only}
    grpo["beta"] = KL_COEFF
    paths = {}
    for method, recipe in (("grpo", grpo), ("maxent", maxent)):
        paths[method] = workdir / f"{method}.yaml"
        paths[method].write_text(yaml.safe_dump(recipe))
    return paths


def run(method: str, recipe: Path, output_dir: Path, logs: Path, processes: int) -> list[float]:
    """Train once through the launcher; return the per-step `step_time` values of rank 0."""
    cmd = [
        str(Path(sys.executable).parent / "maxent-grpo"),
        "run",
        "--method",
        method,
        "--config",
        str(recipe),
        "--logs-dir",
        str(logs),
        "--",
        "--output_dir",
        str(output_dir),
        "--num_processes",
        str(processes),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{method} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    checkpoint = last_complete_checkpoint(output_dir)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [e["step_time"] for e in state["log_history"] if "step_time" in e]


def component_trainer(model: Path, workdir: Path):
    """A MaxEnt trainer of the smoke recipe's batch shape, CPU, rewards all 0."""
    from datasets import Dataset

    from maxent_grpo.maxent.trainer import MaxEntGRPOTrainer
    from maxent_grpo.recipe.maxent_keys import MaxEntConfig

    recipe = yaml.safe_load(SMOKE_MAXENT.read_text())
    args = MaxEntConfig(
        output_dir=str(workdir / "components"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=recipe["num_generations"],
        per_device_train_batch_size=recipe["per_device_train_batch_size"],
        max_completion_length=COMPONENT_LENGTH,
        init_kl_coeff=KL_COEFF,
    )
    batch = args.per_device_train_batch_size
    trainer = MaxEntGRPOTrainer(
        model=str(model),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["What is 1 + 1?"] * batch}),
    )
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def loss_inputs(trainer, prompt: int = 40) -> dict:
    """A random batch as the loss sees it, with the reference model's log-probs."""
    import torch

    batch, k = trainer.args.per_device_train_batch_size, trainer.num_generations
    length, vocab = COMPONENT_LENGTH, trainer.model.config.vocab_size
    inputs = {
        "prompt_ids": torch.randint(0, vocab, (batch, prompt)),
        "prompt_mask": torch.ones(batch, prompt, dtype=torch.long),
        "completion_ids": torch.randint(0, vocab, (batch, length)),
        "completion_mask": torch.ones(batch, length, dtype=torch.long),
        "maxent_weights": torch.full((batch,), 1 / k),
        "advantages": torch.randn(batch),
        "num_items_in_batch": torch.tensor(batch * length),
    }
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        inputs["ref_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
            trainer.ref_model, ids, torch.ones_like(ids), length
        )[0]
    return inputs


def component_calls(trainer, inputs: dict) -> dict:
    """The three timed calls: MaxEnt's loss + backward, TRL's GRPO loss + backward on the same
    trainer and inputs, and the weights of one generation batch."""
    import torch
    import trl

    from maxent_grpo.maxent.weights import (
        informative_groups,
        maxent_weights,
        sequence_log_likelihood,
        weight_stats,
    )

    policy, k = trainer.model, trainer.num_generations
    # Both processes' completions: every process computes the weights of all of them.
    generation_batch = 2 * trainer.args.per_device_train_batch_size

    def maxent_loss():
        trainer.compute_loss(policy, inputs).backward()

    def grpo_loss():
        trl.GRPOTrainer._compute_loss(trainer, policy, inputs).backward()

    def weights():
        rewards = torch.randn(generation_batch)
        per_token = torch.randn(generation_batch, COMPONENT_LENGTH)
        ref = sequence_log_likelihood(per_token, torch.ones_like(per_token), True)
        w = maxent_weights(rewards, k, 1.0, KL_COEFF, ref, 1.0, 0.01)
        weight_stats(w, k)
        weight_stats(w, k, informative_groups(rewards, k))

    return {"maxent_loss": maxent_loss, "grpo_loss": grpo_loss, "weights": weights}


def interleaved_ms(calls: dict, reps: int) -> dict[str, float]:
    """Median ms of each call, the calls interleaved, the first tenth of reps dropped."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(reps):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            if rep >= reps // 10:  # warm-up
                samples[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(values) for name, values in samples.items()}


def component_times(model: Path, workdir: Path, reps: int) -> dict:
    """What MaxEnt changes, timed in one process with calls interleaved (robust to load):
    its loss + backward against TRL's GRPO loss + backward on the same batch and reference
    log-probs, and the weight computation of one generation batch."""
    trainer = component_trainer(model, workdir)
    ms = interleaved_ms(component_calls(trainer, loss_inputs(trainer)), reps)
    return {
        "maxent_loss_backward_ms": ms["maxent_loss"],
        "grpo_loss_backward_ms": ms["grpo_loss"],
        "loss_backward_ratio": ms["maxent_loss"] / ms["grpo_loss"],
        "weights_per_generation_batch_ms": ms["weights"],
        "reps": reps,
    }


def run_rounds(args, paths: dict[str, Path], workdir: Path) -> tuple[dict, dict]:
    """--rounds runs of each method, alternating: steady step times, and each run's median."""
    times: dict[str, list[float]] = {"grpo": [], "maxent": []}
    round_medians: dict[str, list[float]] = {"grpo": [], "maxent": []}
    for round_ in range(args.rounds):
        for method in ("grpo", "maxent"):
            out = workdir / f"{method}-{round_}"
            step_times = run(method, paths[method], out, workdir / "logs", args.processes)
            steady = step_times[args.warmup :]
            times[method] += steady
            round_medians[method].append(statistics.median(steady))
            print(
                f"round {round_ + 1}/{args.rounds} {method:6s}: median step "
                f"{round_medians[method][-1]:.4f} s",
                flush=True,
            )
    return times, round_medians


def summarize(args, times: dict, round_medians: dict, components: dict) -> dict:
    medians = {method: statistics.median(values) for method, values in times.items()}
    ratio = medians["maxent"] / medians["grpo"]
    # Each round's runs are back to back, so their ratio is less exposed to load drift.
    round_ratios = [m / g for m, g in zip(round_medians["maxent"], round_medians["grpo"])]
    return {
        "ratio_maxent_over_grpo": ratio,
        "target": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "median_step_s": medians,
        "round_ratios": round_ratios,
        "median_round_ratio": statistics.median(round_ratios),
        "round_median_step_s": round_medians,
        "components": components,
        "load_average_after": os.getloadavg(),
        "step_times_s": times,
        "settings": {
            "model": "tiny Qwen2 (maxent_grpo.tiny_model)",
            "recipe": "recipes/smoke/config_maxent.yaml (GRPO: maxent keys removed)",
            "kl_coeff": KL_COEFF,
            "steps": args.steps,
            "warmup_dropped": args.warmup,
            "rounds": args.rounds,
            "processes": args.processes,
            "device": "cpu",
            "machine": platform.platform(),
            "cpus": os.cpu_count(),
        },
    }


def print_result(result: dict, output: Path) -> None:
    medians, ratio = result["median_step_s"], result["ratio_maxent_over_grpo"]
    components = result["components"]
    print(
        f"median step time: GRPO {medians['grpo']:.4f} s, MaxEnt {medians['maxent']:.4f} s; "
        f"ratio {ratio:.3f} (target <= {TARGET_RATIO}); per-round ratios "
        f"{', '.join(f'{r:.3f}' for r in result['round_ratios'])}"
    )
    print(
        f"in-process: loss + backward MaxEnt {components['maxent_loss_backward_ms']:.2f} ms, "
        f"GRPO {components['grpo_loss_backward_ms']:.2f} ms "
        f"(ratio {components['loss_backward_ratio']:.3f}); weights "
        f"{components['weights_per_generation_batch_ms']:.2f} ms per generation batch; "
        f"results: {output}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=25, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="steps dropped from each run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per method, alternating")
    parser.add_argument("--processes", type=int, default=2, help="training processes")
    parser.add_argument(
        "--component-reps", type=int, default=200, help="repetitions of the in-process timings"
    )
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    output = args.output or RESULTS

    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-maxent-") as tmp:
        workdir = Path(tmp)
        model = build_tiny_model(workdir / "tiny-qwen2")
        paths = recipes(model, args.steps, workdir)
        times, round_medians = run_rounds(args, paths, workdir)
        components = component_times(model, workdir, args.component_reps)

    result = summarize(args, times, round_medians, components)
    result["wall_s"] = time.time() - started
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print_result(result, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
