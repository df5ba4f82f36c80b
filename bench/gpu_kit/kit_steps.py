"""The GPU kit's steps (bench/gpu_kit/kit.py runs one per process; see there).

Each returns its figures or raises with one line that says why it failed. Comparisons come
after an untimed warm-up run (the first process pays CUDA's and the file cache's cold start:
9.8 s against 3.3-3.6 s for a first step on the H200), and ours against bare TRL alternates
the sides ABBA, so that drift and order hit both alike.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import time
from pathlib import Path

from kit_runs import MAXENT_RECIPE, ROOT, Kit, abba, compare, one_line, require_learning

ABBA = ["bare", "module", "module", "bare"]
SIGNAL_STEPS = {"gpu": 6, "cpu": 20}  # on CPU, long enough that the signal lands mid-run
# A batch no card holds: 16384 completions of 32 tokens have logits of 16384 x 33 x 151936
# bf16 values (164 GB) in the training forward; an H200 has 141 GB.
OOM_KEYS = {"per_device_train_batch_size": 16384, "dataset_num_rows": 4096}


def step_model(kit: Kit) -> dict:
    """The model every run trains, built here with random weights (nothing downloaded)."""
    import torch

    if kit.mode == "cpu":
        from maxent_grpo.tiny_model import build_tiny_model

        build_tiny_model(kit.model)
        device = "CPU"
    else:
        from kit_model import build_qwen_shape

        build_qwen_shape(kit.model)
        device = torch.cuda.get_device_name(0)
    config = json.loads((kit.model / "config.json").read_text())
    return {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "layers": config["num_hidden_layers"],
        "hidden": config["hidden_size"],
        "vocab": config["vocab_size"],
    }


def step_warmup(kit: Kit) -> dict:
    """An untimed run of ours first: it pays the cold start, what it costs sizes the later
    steps' time bounds (kit.py cap), and it is the signal step's uninterrupted run."""
    run = uninterrupted(kit, "warmup")
    fixed = run["wall_s"] - sum(run["step_times_s"])
    return {"run": run, "fixed_s": round(max(fixed, 0.0), 1), "step_s": run["step_time_s"]}


def uninterrupted(kit: Kit, name: str) -> dict:
    """A run with the signal step's keys, on deterministic kernels where the card has them
    (so that equal weights are a fair demand on a GPU too)."""
    keys = {"full_determinism": True, "max_steps": SIGNAL_STEPS[kit.mode]}
    try:
        run = kit.train(name, "module", kit.recipe(name, **keys))
    except RuntimeError as exc:
        if "determinis" not in str(exc):
            raise
        # An op without a deterministic kernel: the same comparison without the demand.
        keys["full_determinism"] = False
        run = kit.train(f"{name}-2", "module", kit.recipe(name, **keys))
        run["full_determinism_failed"] = one_line(exc)
    run["full_determinism"] = "full_determinism_failed" not in run
    return run


def step_overhead(kit: Kit) -> dict:
    """Ours (python -m maxent_grpo.train, the trainer training.sh starts) against bare TRL,
    ABBA, the same recipe file; what is measured is kept as each run ends."""
    runs: list[dict] = []
    for index, side in enumerate(ABBA, 1):
        name = f"grpo-{side}-{index}"
        runs.append(kit.train(name, side, kit.recipe(name, ours=side != "bare")))
        kit.save_partial("overhead", {"runs": runs, **abba(ABBA, runs, kit.mode)})
    tokens = {json.dumps(r["num_tokens"]) for r in runs}
    return {"runs": runs, **abba(ABBA, runs, kit.mode), "same_completions": len(tokens) == 1}


def grpo_baseline(kit: Kit) -> dict:
    """Ours on GRPO: the overhead step's runs pooled, or a fresh run when it did not get there."""
    done = kit.result("overhead") or {}
    if "module" in done.get("sides", {}):
        return done["sides"]["module"]
    return kit.train("grpo-module-again", "module", kit.recipe("grpo-module-again"))


def step_maxent(kit: Kit) -> dict:
    grpo = grpo_baseline(kit)
    maxent = kit.train("maxent-module", "module", kit.recipe("maxent-module", MAXENT_RECIPE))
    return {"grpo": grpo, "maxent": maxent, "ratios": compare(kit.mode, maxent, grpo)}


def step_checkpointing(kit: Kit) -> dict:
    off = grpo_baseline(kit)
    on = kit.train("grpo-gc", "module", kit.recipe("grpo-gc", gradient_checkpointing=True))
    return {"off": off, "on": on, "ratios": compare(kit.mode, on, off)}


def step_zero2(kit: Kit) -> dict:
    if kit.mode == "cpu":
        return {"skipped": "skipped on CPU: DeepSpeed ZeRO-2 needs CUDA"}
    if importlib.util.find_spec("deepspeed") is None:
        return {"skipped": "deepspeed did not travel (not in .gpu-kit/)"}
    base = grpo_baseline(kit)
    config = str(ROOT / "recipes" / "accelerate_configs" / "zero2.yaml")
    zero2 = kit.train(
        "grpo-zero2", "training.sh", kit.recipe("grpo-zero2", accelerate_config=config)
    )
    return {"plain": base, "zero2": zero2, "ratios": compare(kit.mode, zero2, base)}


def step_signal(kit: Kit) -> dict:
    """SIGUSR1 to training.sh (the launcher, by exec) mid-run: a complete checkpoint, exit 85;
    training.sh again continues from it (not from step 1); the final weights equal an
    uninterrupted run's, and that run's weights moved (equal unmoved weights prove nothing)."""
    from maxent_grpo.errors import EXIT_CHECKPOINTED
    from maxent_grpo.rundir.checkpoints import last_complete_checkpoint, run_is_complete

    warm = kit.result("warmup") or {}
    name = "warmup" if warm.get("ok") else "signal-full"
    full = warm["run"] if warm.get("ok") else uninterrupted(kit, name)
    keys = {"full_determinism": full["full_determinism"], "max_steps": SIGNAL_STEPS[kit.mode]}
    moved = compare_weights(kit.model, kit.work / "runs" / name)
    if not moved["max_abs_diff"]:
        raise RuntimeError(f"the uninterrupted run's weights did not move: {moved}")
    recipe = kit.recipe("signal-part", **keys)
    out = kit.work / "runs" / "signal-part"
    stopped = stop_with_signal(kit, recipe, out)
    part = stopped.pop("run")
    checkpoint = last_complete_checkpoint(out)
    stopped["checkpoint"] = checkpoint.name if checkpoint else None
    if stopped["exit"] != EXIT_CHECKPOINTED or checkpoint is None or run_is_complete(out):
        raise RuntimeError(f"no clean stop: {stopped}; {kit.failure('signal-part')}")
    started = time.monotonic()
    code = kit.start("signal-resume", "training.sh", recipe).wait()
    wall = round(time.monotonic() - started, 1)
    if code != 0 or not run_is_complete(out):
        raise RuntimeError(f"resume exited {code}: {kit.failure('signal-resume')}")
    resumed = {"side": "training.sh", "wall_s": wall, **kit.figures("signal-resume", recipe)}
    require_learning("signal-resume", resumed)
    same = compare_weights(kit.work / "runs" / name, out)
    at = int(checkpoint.name.rsplit("-", 1)[1])
    if resumed["first_step"] != at + 1:
        # A restart from scratch replays the same seeded run: equal weights cannot catch it.
        raise RuntimeError(
            f"the resumed run restarted: its first step was {resumed['first_step']}, "
            f"not {at + 1} (after {checkpoint.name}); final weights equal to the full "
            f"run's: {same['weights_equal']}"
        )
    if keys["full_determinism"] and not same["weights_equal"]:
        raise RuntimeError(f"the resumed run's final weights differ from the full run's: {same}")
    return {
        "stop": stopped,
        "resumed_from": checkpoint.name,
        "resumed_steps": resumed["log_steps"],
        "moved": moved["max_abs_diff"],
        "stopped_run": part,
        "resumed_run": resumed,
        "full_determinism": keys["full_determinism"],
        "full_determinism_failed": full.get("full_determinism_failed"),
        **same,
    }


def stop_with_signal(kit: Kit, recipe: Path, out: Path) -> dict:
    """Start training.sh, send SIGUSR1 once step 2 is done, and wait for its exit."""
    started = time.monotonic()
    proc = kit.start("signal-part", "training.sh", recipe)
    deadline = started + 300
    while _steps_done(out) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is not None:
        raise RuntimeError(f"the run ended before the signal: {kit.failure('signal-part')}")
    proc.send_signal(signal.SIGUSR1)
    sent_at = _steps_done(out)
    code = proc.wait()
    wall = time.monotonic() - started
    part = kit.figures("signal-part", recipe)
    require_learning("signal-part", part)
    found = {"signal_after_step": sent_at, "exit": code, "outcome": _outcomes(out)[-1:]}
    return found | {"run": {"side": "training.sh", "wall_s": round(wall, 1), **part}}


def _steps_done(output_dir: Path) -> int:
    steps = [e["step"] for e in _events(output_dir) if e.get("event") == "step"]
    return max(steps, default=0)


def _events(output_dir: Path) -> list[dict]:
    try:
        lines = (output_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return found


def _outcomes(output_dir: Path) -> list[dict]:
    return [
        {"outcome": e.get("outcome"), "reason": e.get("reason")}
        for e in _events(output_dir)
        if e.get("event") == "outcome"
    ]


def compare_weights(a: Path, b: Path) -> dict:
    """The largest difference over the tensors both hold (a tied head is saved once)."""
    from safetensors.torch import load_file

    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    common = left.keys() & right.keys()
    if not common:
        return {"weights_equal": False, "max_abs_diff": None, "tensors": 0}
    diff = max((left[k].float() - right[k].float()).abs().max().item() for k in common)
    equal = diff == 0.0 and left.keys() == right.keys()
    return {"weights_equal": equal, "max_abs_diff": diff, "tensors": len(common)}


def step_oom(kit: Kit) -> dict:
    """A batch no card holds: the launcher's outcome is `oom`, its hint names what to lower,
    and there is one attempt only."""
    from maxent_grpo.errors import EXIT_USER_ERROR
    from maxent_grpo.launch.outcomes import OOM_HINT

    if kit.mode == "cpu":
        return {"skipped": "skipped on CPU: needs CUDA (a real CUDA out-of-memory)"}
    proc = kit.start("oom", "training.sh", kit.recipe("oom", **OOM_KEYS))
    code = proc.wait()
    outcomes = _outcomes(kit.work / "runs" / "oom")
    last = outcomes[-1] if outcomes else {}
    result = {
        "exit": code,
        "outcome": last.get("outcome"),
        "reason": last.get("reason"),
        "attempts": len(outcomes),
        "hint_names_what_to_lower": OOM_HINT in (last.get("reason") or ""),
    }
    if last.get("outcome") != "oom" or code != EXIT_USER_ERROR or len(outcomes) != 1:
        raise RuntimeError(f"not a single oom outcome: {result}; {kit.failure('oom')}")
    return result
