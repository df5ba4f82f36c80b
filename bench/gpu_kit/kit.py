"""The GPU proof kit's steps and its report (scripts/gpu_kit.sh runs them; see there).

    python bench/gpu_kit/kit.py step NAME --work W --mode gpu|cpu
    python bench/gpu_kit/kit.py report --work W --mode gpu|cpu --out OUT --total SECONDS

Each step writes W/results/NAME.json ({"ok": true, ...figures} or {"skipped": why} or
{"error": one line}); the report turns them, with the exit codes and seconds gpu_kit.sh
recorded in W/steps/NAME.rc, into OUT/gpu_kit.md, OUT/gpu_kit.json and OUT/gpu_kit_logs.txt.

Every training run is a real one, through the same entry points a user runs: `bash
training.sh` (setup_env.sh with MAXENT_GRPO_ENV=current, the launcher, accelerate),
`python -m maxent_grpo.train`, and the bare TRL script bench/bare_trl_grpo.py, each given
the same recipe file (recipes/gpu/, with the kit's model and output folder). The probe
(bench/gpu_kit/probe/sitecustomize.py) records each trainer's steps, TRL's step logs and
peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GRPO_RECIPE = ROOT / "recipes" / "gpu" / "config_grpo.yaml"
MAXENT_RECIPE = ROOT / "recipes" / "gpu" / "config_maxent.yaml"
PROBE = ROOT / "bench" / "gpu_kit" / "probe"
BARE = ROOT / "bench" / "bare_trl_grpo.py"
# CPU: the tiny model, float32, the smallest sizes that still exercise every path.
CPU_KEYS = {
    "dtype": "float32",
    "bf16": False,
    "use_cpu": True,
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "max_completion_length": 8,
    "max_steps": 4,
    "learning_rate": 1.0e-3,
}
WARMUP = {"gpu": 2, "cpu": 1}  # steps left out of the step-time medians
# A batch no card holds: 16384 completions of 32 tokens have logits of 16384 x 33 x 151936
# bf16 values (164 GB) in the training forward; an H200 has 141 GB.
OOM_KEYS = {"per_device_train_batch_size": 16384, "dataset_num_rows": 4096}
STEPS = ("model", "overhead", "signal", "oom", "maxent", "checkpointing", "zero2")
_CHILDREN: list[subprocess.Popen] = []


def one_line(text: str) -> str:
    return " ".join(str(text).split())[:400]


# ---------------------------------------------------------------- runs


def _stop_children(signum, frame):
    """gpu_kit.sh's `timeout` ends this step: end the runs it started (their own groups)."""
    for proc in _CHILDREN:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
    raise SystemExit(124)


class Kit:
    def __init__(self, work: Path, mode: str):
        self.work, self.mode = work, mode
        self.python = sys.executable
        for sub in ("recipes", "runs", "probe", "logs", "results"):
            (work / sub).mkdir(parents=True, exist_ok=True)

    @property
    def model(self) -> Path:
        return self.work / "model"

    def recipe(self, name: str, base: Path = GRPO_RECIPE, ours: bool = True, **keys) -> Path:
        """A recipe file for one run: base, the CPU sizes on CPU, the kit's model and output."""
        data = yaml.safe_load(base.read_text())
        if self.mode == "cpu":
            data.update(CPU_KEYS)
            if data.get("method") == "maxent":
                data["maxent_target_weight_entropy"] = 1.2  # below log 4 (uniform weights)
        if ours:
            # Our launcher's keys (the bare script takes GRPOConfig's only): one process, and
            # the OpenMP threads every side gets (gpu_kit.sh exports them to the others).
            data["num_processes"] = 1
            data["env"] = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        data["model_name_or_path"] = str(self.model)
        data["output_dir"] = str(self.work / "runs" / name)
        data.update(keys)
        path = self.work / "recipes" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def command(self, side: str, recipe: Path) -> tuple[list[str], dict]:
        if side == "training.sh":
            return ["bash", "training.sh"], {"RECIPE": str(recipe)}
        if side == "module":
            return [self.python, "-m", "maxent_grpo.train", "--config", str(recipe)], {}
        if side == "bare":
            return [self.python, str(BARE), "--config", str(recipe)], {}
        raise ValueError(side)

    def start(self, name: str, side: str, recipe: Path) -> subprocess.Popen:
        args, env = self.command(side, recipe)
        probe = self.work / "probe" / name
        env = {
            **os.environ,
            **env,
            "PYTHONPATH": f"{PROBE}:{os.environ.get('PYTHONPATH', '')}",
            "GPU_KIT_PROBE_OUT": str(probe),
        }
        log = open(self.work / "logs" / f"{name}.log", "ab")
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        _CHILDREN.append(proc)
        return proc

    def train(self, name: str, side: str, recipe: Path) -> dict:
        """One whole run; its figures, or an exception that names why it failed."""
        started = time.monotonic()
        code = self.start(name, side, recipe).wait()
        wall = time.monotonic() - started
        if code != 0:
            raise RuntimeError(f"{name} ({side}) exited {code}: {self.failure(name)}")
        return {"side": side, "wall_s": round(wall, 1), **self.figures(name, recipe)}

    def failure(self, name: str) -> str:
        """The last error-looking line of a run's log."""
        lines = self.log_tail(name, 80).splitlines()
        for line in reversed(lines):
            if "Error" in line or "error:" in line or "Exception" in line:
                return one_line(line)
        return one_line(lines[-1]) if lines else "no output"

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.work / "logs" / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def figures(self, name: str, recipe: Path) -> dict:
        """Step time, completion tokens/s and peak memory from the probe's record."""
        path = self.work / "probe" / name / "rank0.json"
        if not path.exists():
            raise RuntimeError(f"{name}: the probe wrote no record (no Trainer ran?)")
        record = json.loads(path.read_text())
        keys = yaml.safe_load(recipe.read_text())
        per_step = keys["per_device_train_batch_size"] * keys.get("gradient_accumulation_steps", 1)
        logs = [e for e in record["logs"] if e["step"] > WARMUP[self.mode]] or record["logs"]
        step_time = statistics.median(e["step_time"] for e in logs)
        tokens = sum(e.get("completions/mean_length", 0) * per_step for e in logs)
        stamps = [s for _, s in record["step_end"]]
        return {
            "steps": len(record["logs"]),
            "step_time_s": round(step_time, 4),
            "step_times_s": [round(e["step_time"], 4) for e in record["logs"]],
            "completion_tokens_per_s": round(tokens / sum(e["step_time"] for e in logs), 1),
            "peak_gpu_mib": _round(record.get("peak_gpu_mib")),
            "peak_rss_mib": _round(record.get("peak_rss_mib")),
            "train_s": round(stamps[-1] - record["train_begin_s"], 1) if stamps else None,
            "num_tokens": [e.get("num_tokens") for e in record["logs"]],
        }

    def result(self, step: str) -> dict | None:
        path = self.work / "results" / f"{step}.json"
        return json.loads(path.read_text()) if path.exists() else None


def _round(value):
    return None if value is None else round(value, 1)


def ratio(ours: dict, base: dict, key: str) -> float | None:
    a, b = ours.get(key), base.get(key)
    return round(a / b, 3) if a and b else None


def memory_key(mode: str) -> str:
    return "peak_gpu_mib" if mode == "gpu" else "peak_rss_mib"


def compare(kit: Kit, ours: dict, base: dict) -> dict:
    return {
        "step_time": ratio(ours, base, "step_time_s"),
        "completion_tokens_per_s": ratio(ours, base, "completion_tokens_per_s"),
        "peak_memory": ratio(ours, base, memory_key(kit.mode)),
    }


def grpo_baseline(kit: Kit, side: str) -> dict:
    """The overhead step's run of `side`, or a fresh one when that step did not get there."""
    done = kit.result("overhead") or {}
    if side in done.get("runs", {}):
        return done["runs"][side]
    return kit.train(f"grpo-{side}-again", side, kit.recipe(f"grpo-{side}-again"))


# ---------------------------------------------------------------- steps


def step_model(kit: Kit) -> dict:
    """The model every run trains, built here with random weights (nothing downloaded)."""
    import torch

    if kit.mode == "cpu":
        from maxent_grpo.tiny_model import build_tiny_model

        build_tiny_model(kit.model)
        device = "CPU"
    else:
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


def build_qwen_shape(out: Path, device: str = "cuda") -> None:
    """Qwen2.5-0.5B's architecture (its config.json's sizes), random weights in bf16, and the
    tiny model's tokenizer: ids above its vocabulary decode to nothing, which is fine for
    timing (the rewards see shorter text)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from maxent_grpo.tiny_model import (
        QWEN2_5_0_5B_SIZES,
        _build_tokenizer,  # the offline tokenizer recipe
    )

    tokenizer = _build_tokenizer()
    config = Qwen2Config(
        **QWEN2_5_0_5B_SIZES,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def step_overhead(kit: Kit) -> dict:
    """Ours (training.sh; python -m maxent_grpo.train) against bare TRL: same recipe file."""
    runs = {}
    for side in ("bare", "module", "training.sh"):
        recipe = kit.recipe(f"grpo-{side}", ours=side != "bare")
        runs[side] = kit.train(f"grpo-{side}", side, recipe)
    tokens = {json.dumps(r["num_tokens"]) for r in runs.values()}
    return {
        "runs": runs,
        "ratios": {
            side: compare(kit, runs[side], runs["bare"]) for side in ("module", "training.sh")
        },
        "same_completions": len(tokens) == 1,
    }


def step_maxent(kit: Kit) -> dict:
    grpo = grpo_baseline(kit, "module")
    maxent = kit.train("maxent-module", "module", kit.recipe("maxent-module", MAXENT_RECIPE))
    return {"grpo": grpo, "maxent": maxent, "ratios": compare(kit, maxent, grpo)}


def step_checkpointing(kit: Kit) -> dict:
    off = grpo_baseline(kit, "module")
    recipe = kit.recipe("grpo-gc", gradient_checkpointing=True)
    on = kit.train("grpo-gc", "module", recipe)
    return {"off": off, "on": on, "ratios": compare(kit, on, off)}


def step_zero2(kit: Kit) -> dict:
    import importlib.util

    if kit.mode == "cpu":
        return {"skipped": "skipped on CPU: DeepSpeed ZeRO-2 needs CUDA"}
    if importlib.util.find_spec("deepspeed") is None:
        return {"skipped": "deepspeed did not travel (not in .gpu-kit/)"}
    base = grpo_baseline(kit, "training.sh")
    config = str(ROOT / "recipes" / "accelerate_configs" / "zero2.yaml")
    zero2 = kit.train(
        "grpo-zero2", "training.sh", kit.recipe("grpo-zero2", accelerate_config=config)
    )
    return {"ddp": base, "zero2": zero2, "ratios": compare(kit, zero2, base)}


def step_signal(kit: Kit) -> dict:
    """SIGUSR1 to training.sh (the launcher, by exec) mid-run: a complete checkpoint, exit 85;
    training.sh again resumes; the final weights equal an uninterrupted run's."""
    from maxent_grpo.errors import EXIT_CHECKPOINTED
    from maxent_grpo.rundir.checkpoints import last_complete_checkpoint, run_is_complete

    # Deterministic kernels, so that equal weights are a fair demand on a GPU too; steps long
    # enough on CPU that the signal lands mid-run.
    keys = {"full_determinism": True, "max_steps": 6 if kit.mode == "gpu" else 20}
    try:
        full = kit.train("signal-full", "module", kit.recipe("signal-full", **keys))
    except RuntimeError as exc:
        if "determinis" not in str(exc):
            raise
        # An op without a deterministic kernel: the same comparison without the demand.
        keys["full_determinism"] = False
        full = kit.train("signal-full-2", "module", kit.recipe("signal-full", **keys))
        full["full_determinism_failed"] = one_line(exc)
    recipe = kit.recipe("signal-part", **keys)
    out = kit.work / "runs" / "signal-part"
    proc = kit.start("signal-part", "training.sh", recipe)
    deadline = time.monotonic() + 300
    while not _steps_done(out) >= 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is not None:
        raise RuntimeError(f"the run ended before the signal: {kit.failure('signal-part')}")
    proc.send_signal(signal.SIGUSR1)
    sent_at = _steps_done(out)
    code = proc.wait()
    checkpoint = last_complete_checkpoint(out)
    stopped = {
        "signal_after_step": sent_at,
        "exit": code,
        "checkpoint": checkpoint.name if checkpoint else None,
        "outcome": _outcomes(out)[-1:],
    }
    if code != EXIT_CHECKPOINTED or checkpoint is None or run_is_complete(out):
        raise RuntimeError(f"no clean stop: {stopped}; {kit.failure('signal-part')}")
    code = kit.start("signal-part", "training.sh", recipe).wait()
    if code != 0 or not run_is_complete(out):
        raise RuntimeError(f"resume exited {code}: {kit.failure('signal-part')}")
    same = compare_weights(kit.work / "runs" / "signal-full", out)
    return {
        "stop": stopped,
        "resumed_from": checkpoint.name,
        "full_determinism": keys["full_determinism"],
        "full_determinism_failed": full.get("full_determinism_failed"),
        **same,
    }


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
    from safetensors.torch import load_file

    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    if left.keys() != right.keys():
        return {"weights_equal": False, "max_abs_diff": None, "tensors": len(left)}
    diff = max((left[k].float() - right[k].float()).abs().max().item() for k in left)
    return {"weights_equal": diff == 0.0, "max_abs_diff": diff, "tensors": len(left)}


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


def run_step(kit: Kit, name: str) -> int:
    signal.signal(signal.SIGTERM, _stop_children)
    started = time.monotonic()
    try:
        found = globals()[f"step_{name}"](kit)
        found = found if "skipped" in found else {"ok": True, **found}
        code = 0
    except Exception as exc:  # the report says why; the other steps go on
        traceback.print_exc()
        found, code = {"error": one_line(f"{type(exc).__name__}: {exc}")}, 1
    found["seconds"] = round(time.monotonic() - started, 1)
    (kit.work / "results" / f"{name}.json").write_text(json.dumps(found, indent=1))
    print(json.dumps(found)[:2000], flush=True)
    return code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("step", "report"))
    parser.add_argument("name", nargs="?", choices=STEPS)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--total", type=float, default=0.0)
    args = parser.parse_args(argv)
    kit = Kit(args.work, args.mode)
    if args.what == "step":
        return run_step(kit, args.name)
    from report import write_report

    return write_report(kit, args.out, args.total)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
