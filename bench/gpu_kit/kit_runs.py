"""The GPU kit's training runs: recipes, processes, the probe's figures and what they must show.

Every run is a real one, through the entry points a user runs: `bash training.sh`,
`python -m maxent_grpo.train`, and the bare TRL script bench/bare_trl_grpo.py, each given a
recipe file made from recipes/gpu/ (the kit's model and output folder; the CPU sizes with
--cpu). The probe (bench/gpu_kit/probe/sitecustomize.py) records each trainer's step logs and
peak memory. A run that logs a zero or missing grad_norm at any step fails: it learned
nothing there, and its figures would be those of a backward pass with zero advantages.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GRPO_RECIPE = ROOT / "recipes" / "gpu" / "config_grpo.yaml"
MAXENT_RECIPE = ROOT / "recipes" / "gpu" / "config_maxent.yaml"
PROBE = ROOT / "bench" / "gpu_kit" / "probe"
BARE = ROOT / "bench" / "bare_trl_grpo.py"
# CPU: the tiny model, float32, the smallest sizes that still exercise every path. 16 tokens:
# with 8, a group of 4 completions sometimes ties on every reward (grad_norm 0).
CPU_KEYS = {
    "dtype": "float32",
    "bf16": False,
    "use_cpu": True,
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "max_completion_length": 16,
    "learning_rate": 1.0e-3,
}
DROPPED = {"gpu": 2, "cpu": 1}  # each run's first steps, left out of its step times
_CHILDREN: list[subprocess.Popen] = []


def one_line(text: str) -> str:
    return " ".join(str(text).split())[:400]


def stop_children(signum, frame):
    """gpu_kit.sh's `timeout` ends this step: end the runs it started (their own groups)."""
    for proc in _CHILDREN:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
    raise SystemExit(124)


class Kit:
    def __init__(self, work: Path, mode: str, timed_steps: int = 30):
        self.work, self.mode = work, mode
        self.python = sys.executable
        self.dropped = DROPPED[mode]
        # ABBA: each side runs twice, so each run times half of a side's steps.
        self.timed_steps = timed_steps
        self.run_steps = math.ceil(timed_steps / 2) + self.dropped
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
        data["max_steps"] = self.run_steps
        data.update(keys)
        path = self.work / "recipes" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def command(self, side: str, recipe: Path) -> tuple[list[str], dict]:
        if side == "training.sh":
            logs = ["--logs-dir", str(self.work / "logs")]  # not the checkout's logs/
            return ["bash", "training.sh", *logs], {"RECIPE": str(recipe)}
        if side == "module":
            return [self.python, "-m", "maxent_grpo.train", "--config", str(recipe)], {}
        if side == "bare":
            return [self.python, str(BARE), "--config", str(recipe)], {}
        raise ValueError(side)

    def start(self, name: str, side: str, recipe: Path) -> subprocess.Popen:
        """Start a run; `name` names its log and probe record (the recipe, its output)."""
        args, env = self.command(side, recipe)
        env = {
            **os.environ,
            **env,
            "PYTHONPATH": f"{PROBE}:{os.environ.get('PYTHONPATH', '')}",
            "GPU_KIT_PROBE_OUT": str(self.work / "probe" / name),
        }
        log = open(self.work / "logs" / f"{name}.log", "ab")
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        _CHILDREN.append(proc)
        return proc

    def train(self, name: str, side: str, recipe: Path) -> dict:
        """One whole run's figures; an exception that names why it failed or did not learn."""
        started = time.monotonic()
        code = self.start(name, side, recipe).wait()
        wall = time.monotonic() - started
        if code != 0:
            raise RuntimeError(f"{name} ({side}) exited {code}: {self.failure(name)}")
        found = {"side": side, "wall_s": round(wall, 1), **self.figures(name, recipe)}
        require_learning(name, found)
        return found

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
        """Step times (the first steps of the run left out), tokens/s, memory, grad_norm."""
        path = self.work / "probe" / name / "rank0.json"
        if not path.exists():
            raise RuntimeError(f"{name}: the probe wrote no record (no Trainer ran?)")
        record = json.loads(path.read_text())
        logs = record["logs"]
        if not logs:
            raise RuntimeError(f"{name}: no training step was logged")
        keys = yaml.safe_load(recipe.read_text())
        per_step = keys["per_device_train_batch_size"] * keys.get("gradient_accumulation_steps", 1)
        timed = logs[self.dropped :] or logs
        times = [e["step_time"] for e in timed]
        tokens = sum(e.get("completions/mean_length", 0) * per_step for e in timed)
        stamps = [s for _, s in record["step_end"]]
        return {
            "steps": len(logs),
            "first_step": logs[0]["step"],
            "timed_step_times_s": [round(t, 4) for t in times],
            "step_time_s": round(statistics.median(times), 4),
            "step_time_min_s": round(min(times), 4),
            "step_times_s": [round(e["step_time"], 4) for e in logs],
            "completion_tokens": round(tokens, 1),
            "completion_tokens_per_s": round(tokens / sum(times), 1),
            "peak_gpu_mib": _round(record.get("peak_gpu_mib")),
            "peak_rss_mib": _round(record.get("peak_rss_mib")),
            "train_s": round(stamps[-1] - record["train_begin_s"], 1) if stamps else None,
            "num_tokens": [e.get("num_tokens") for e in logs],
            "grad_norms": [e.get("grad_norm") for e in logs],
            "losses": [e.get("loss") for e in logs],
            "log_steps": [e["step"] for e in logs],
        }

    def result(self, step: str) -> dict | None:
        path = self.work / "results" / f"{step}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def save_partial(self, step: str, found: dict) -> None:
        """What a step has measured so far: its figures survive the step's time bound."""
        path = self.work / "results" / f"{step}.json"
        path.write_text(json.dumps({"partial": True, **found}, indent=1))


def _round(value):
    return None if value is None else round(value, 1)


def require_learning(name: str, run: dict) -> None:
    """Fail a run that logged a zero or missing grad_norm: it learned nothing at that step."""
    flat = [s for s, g in zip(run["log_steps"], run["grad_norms"], strict=True) if not g]
    if flat:
        raise RuntimeError(
            f"{name}: grad_norm zero or missing at step(s) {flat} of {run['log_steps']}: "
            "every completion of every group had the same reward there, nothing was learned"
        )


def memory_key(mode: str) -> str:
    return "peak_gpu_mib" if mode == "gpu" else "peak_rss_mib"


def ratio(ours: dict, base: dict, key: str) -> float | None:
    a, b = ours.get(key), base.get(key)
    return round(a / b, 3) if a and b else None


def compare(mode: str, ours: dict, base: dict) -> dict:
    return {
        "step_time": ratio(ours, base, "step_time_s"),
        "step_time_min": ratio(ours, base, "step_time_min_s"),
        "completion_tokens_per_s": ratio(ours, base, "completion_tokens_per_s"),
        "peak_memory": ratio(ours, base, memory_key(mode)),
    }


def pooled(runs: list[dict], mode: str) -> dict:
    """One side's runs as one: median and minimum over all their timed steps."""
    times = [t for run in runs for t in run["timed_step_times_s"]]
    memory = [run.get(memory_key(mode)) for run in runs if run.get(memory_key(mode))]
    tokens = sum(run["completion_tokens"] for run in runs)
    return {
        "runs": len(runs),
        "timed_steps": len(times),
        "step_time_s": round(statistics.median(times), 4),
        "step_time_min_s": round(min(times), 4),
        "completion_tokens_per_s": round(tokens / sum(times), 1),
        memory_key(mode): max(memory) if memory else None,
    }


def abba(order: list[str], runs: list[dict], mode: str, base: str = "bare") -> dict:
    """Both sides pooled, ours/bare ratios, and each round's ratio (run 2 against 1, 3 against
    4): the order in which the runs went is the same for both sides."""
    done = list(zip(order, runs, strict=False))
    sides = {s: [r for o, r in done if o == s] for s in dict.fromkeys(order)}
    found = {side: pooled(done, mode) for side, done in sides.items() if done}
    ours = next((s for s in found if s != base), None)
    if ours is None or base not in found:
        return {"order": order, "sides": found}
    rounds = [(1, 0), (2, 3)]
    return {
        "order": order,
        "sides": found,
        "ours": ours,
        "ratios": compare(mode, found[ours], found[base]),
        "round_ratios": [
            ratio(runs[a], runs[b], "step_time_s") for a, b in rounds if max(a, b) < len(runs)
        ],
    }
