"""`maxent-grpo plot RUN`: a PNG of a run's training curves and the same series as CSV.

The numbers are the trainer's logged scalars: the run's `step` events (every logged step, also
while it runs), or for a run without events its trainer_state.json log_history (the final one,
or the newest complete checkpoint's). JSON keeps floats exact, so the CSV holds the logged
floats with repr precision. Resume points (vertical lines) come from the events too, and so
do the benchmark scores (`eval` events: score vs step, under the reward).
matplotlib draws headless (Agg canvas, no pyplot, no display needed).
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.rundir.events import read_events
from maxent_grpo.runs.history import (
    EVAL_PREFIX,
    history_from_events,  # noqa: F401 - its older home
    load_history,
    with_scores,
)
from maxent_grpo.runs.sources import looks_like_run_dir, read_output_dir
from maxent_grpo.runs.state import detect_method, resume_points, split_attempts
from maxent_grpo.runs.table import METHOD_LABELS


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]  # exact keys; "rewards/*/mean" expands to every reward function
    ylabel: str = ""
    log_scale: bool = False
    unless: str | None = None  # left out when the history has this key


PANELS = (
    Panel("Reward", ("reward", "rewards/*/mean"), "mean reward"),
    # a run without a reward (SFT) is judged by its loss; a GRPO loss says little, left out
    Panel("Training loss", ("loss",), "loss", unless="reward"),
    Panel("Token accuracy", ("mean_token_accuracy",), "share of tokens"),
    Panel("Benchmark scores", ("eval/*",), "score (mean pass@k)"),
    Panel("KL to the reference", ("kl", "maxent/kl"), "KL (per token)"),
    Panel("Policy entropy", ("entropy",), "nats / token"),
    Panel(
        "Completion length",
        ("completions/mean_length", "completions/min_length", "completions/max_length"),
        "tokens",
    ),
    Panel("MaxEnt weight entropy", ("maxent/weight_entropy",), "nats"),
    Panel("MaxEnt effective sample size", ("maxent/ess",), "ESS"),
    Panel("MaxEnt beta and tau", ("maxent/beta", "maxent/tau"), "", log_scale=True),
    Panel(
        "Rollout groups per step",
        (
            "rollouts/groups_generated",
            "rollouts/groups_kept",
            "rollouts/groups_trained",
            "rollouts/carried_in",
            "rollouts/rounds",
        ),
        "groups (rounds)",
    ),
    Panel("Kept fraction per filter", ("rollouts/kept_fraction/*",), "fraction of groups"),
    Panel(
        "Time per step",
        # not the server's start (time/server_start_s): once, and it would dwarf the steps
        tuple(f"time/{part}_s" for part in ("generation", "rewards", "training", "sync", "other")),
        "seconds (stacked)",
    ),
    Panel("Busy share", ("time/trainer_busy", "time/server_busy"), "share of the step"),
)
_REWARD_FUNC_RE = re.compile(r"^rewards/(.+)/mean$")


def resolve_output_dir(run: str | os.PathLike, outputs: str | os.PathLike = "outputs") -> Path:
    """RUN as a path to an output directory, else as a run name under `outputs`."""
    path = Path(run)
    candidates = [c for c in (path, Path(outputs) / str(run)) if c.is_dir()]
    for candidate in candidates:
        if looks_like_run_dir(os.listdir(candidate)):
            return candidate
    if candidates:
        raise UserError(f"{candidates[0]}: nothing to plot yet: no events and no trainer state")
    raise UserError(
        f"{run}: no such run: neither an output directory nor a run under {outputs}/ "
        "(one with events.jsonl, trainer_state.json or checkpoint-N/)"
    )


def series_keys(history: Sequence[dict]) -> list[str]:
    """The plotted keys present in the history, in panel order."""
    present: dict[str, None] = {}
    for entry in history:
        present.update(dict.fromkeys(entry))
    keys = []
    for panel in PANELS:
        keys += _panel_keys(panel, present)
    return keys


def _panel_keys(panel: Panel, present) -> list[str]:
    if panel.unless is not None and panel.unless in present:
        return []
    keys = []
    for key in panel.keys:
        if key == "rewards/*/mean":
            keys += [k for k in present if _REWARD_FUNC_RE.match(k)]
        elif key.endswith("/*"):  # eval/*, rollouts/kept_fraction/*
            keys += sorted(k for k in present if k.startswith(key[:-1]))
        elif key in present:
            keys.append(key)
    return keys


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same float
    return str(value)


def write_csv(path: str | os.PathLike, history: Sequence[dict], keys: Sequence[str]) -> int:
    """One row per logged step: step, then each key (empty where not logged). Returns rows."""
    rows = 0
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", *keys])
        for entry in history:
            if "step" not in entry or not any(k in entry for k in keys):
                continue
            writer.writerow([_cell(entry["step"]), *(_cell(entry.get(k)) for k in keys)])
            rows += 1
    return rows


def _points(history: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for entry in history:
        value = entry.get(key)
        if "step" in entry and isinstance(value, int | float):
            xs.append(entry["step"])
            ys.append(float(value))
    return xs, ys


def _label(key: str) -> str:
    if key == "reward":
        return "mean (weighted sum)"
    if match := _REWARD_FUNC_RE.match(key):
        return match[1]
    if key.startswith(EVAL_PREFIX):
        return key[len(EVAL_PREFIX) :]
    if key.startswith("rollouts/"):
        return key.rsplit("/", 1)[-1]
    if key.startswith("time/"):
        return key[len("time/") :].removesuffix("_s")
    return key.split("/", 1)[-1] if key.startswith("maxent/") else key


def _slots(fig, count: int) -> list:
    """The reward spans the top row (legend on its right); the rest go two per row, a last odd
    one full width."""
    rest = count - 1
    grid = fig.add_gridspec(1 + math.ceil(rest / 2), 2)
    slots = [grid[0, :]]
    for index in range(rest):
        row, col = 1 + index // 2, index % 2
        slots.append(grid[row, :] if index == rest - 1 and rest % 2 else grid[row, col])
    return slots


def _plot_panel(ax, panel: Panel, keys: Sequence[str], history: Sequence[dict], marker) -> None:
    if panel.title == "Completion length":
        xs, mean = _points(history, "completions/mean_length")
        lo_x, lo = _points(history, "completions/min_length")
        hi_x, hi = _points(history, "completions/max_length")
        if lo and hi and lo_x == hi_x == xs:
            ax.fill_between(xs, lo, hi, alpha=0.2, label="min-max")
        if mean:
            ax.plot(xs, mean, marker=marker, ms=3, label="mean")
        return
    if panel.title == "Time per step":
        _stacked(ax, keys, history)
        return
    positive = True
    for key in keys:
        xs, ys = _points(history, key)
        positive = positive and all(y > 0 for y in ys)
        style = {"lw": 2.0} if key == "reward" else {"lw": 1.2, "alpha": 0.85}
        dots = "o" if key.startswith(EVAL_PREFIX) else marker  # a few points: always marked
        ax.plot(xs, ys, marker=dots, ms=3, label=_label(key), **style)
    if panel.title == "Busy share":
        ax.set_ylim(0, 1.05)
    if panel.log_scale and positive:
        ax.set_yscale("log")
    if keys and keys[0].startswith(EVAL_PREFIX):
        ax.set_ylim(-0.05, 1.05)  # a pass@k score


def _stacked(ax, keys: Sequence[str], history: Sequence[dict]) -> None:
    """The parts of each step's time stacked, so the top line is the step's wall clock."""
    xs = [int(h["step"]) for h in history if "time/step_s" in h]
    if not xs:
        return
    rows = [h for h in history if "time/step_s" in h]
    parts = [[float(h.get(key) or 0.0) for h in rows] for key in keys]
    ax.stackplot(xs, parts, labels=[_label(k) for k in keys], alpha=0.8)
    ax.set_ylim(bottom=0)


def _dress(ax, panel: Panel, steps: Sequence[int], resumes: Sequence[int], first: bool) -> None:
    """Resume lines, limits, labels, grid and legend of one panel."""
    from matplotlib.ticker import MaxNLocator

    for step in resumes:
        ax.axvline(step, color="0.35", ls="--", lw=1)
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    ax.set_title(panel.title, fontsize=10)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    labeled = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    if first and len(labeled) > 1:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    elif len(labeled) > 1 or panel.title in ("Completion length", "Time per step", "Busy share"):
        ax.legend(fontsize=7, loc="best", framealpha=0.6)


def draw(
    history: Sequence[dict],
    png: str | os.PathLike,
    title: str,
    resumes: Sequence[int] = (),
    dpi: int = 80,
) -> list[str]:
    """Draw the panels that have data into `png`; returns the titles of the panels drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    present = {k: None for entry in history for k in entry}
    panels = [(p, _panel_keys(p, present)) for p in PANELS]
    panels = [(p, keys) for p, keys in panels if keys]
    if not panels:
        raise UserError("nothing to plot: the log history has none of the plotted metrics")
    fig = Figure(figsize=(10.5, 2.4 * (1 + math.ceil((len(panels) - 1) / 2)) + 0.6), dpi=dpi)
    FigureCanvasAgg(fig)
    steps = [e["step"] for e in history if "step" in e]
    marker = "o" if len(set(steps)) <= 60 else None
    slots = _slots(fig, len(panels))
    for index, ((panel, keys), slot) in enumerate(zip(panels, slots, strict=True)):
        ax = fig.add_subplot(slot)
        _plot_panel(ax, panel, keys, history, marker)
        _dress(ax, panel, steps, resumes, first=index == 0)
        # the x label under the bottom row: the last panel, and its left neighbour if paired
        rest = len(panels) - 1
        if index == len(panels) - 1 or (index == len(panels) - 2 and rest % 2 == 0 and index):
            ax.set_xlabel("step", fontsize=8)
    if resumes:
        title += "   (dashed: resumed from checkpoint " + ", ".join(map(str, resumes)) + ")"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=dpi)
    return [p.title for p, _ in panels]


def _title(output_dir: Path, events: Sequence[dict], history: Sequence[dict]) -> str:
    """`<run> (<method>), steps A-B[, not finished: up to step B]`."""
    out = read_output_dir(output_dir)
    attempts = split_attempts(events)
    steps = [e for e in events if e["event"] == "step"]
    latest = attempts[-1] if attempts else None
    method = detect_method(out.marker, latest, steps, out)
    if method is None and any(k.startswith("maxent/") for e in history for k in e):
        method = "maxent"
    label = METHOD_LABELS.get(method or "", "")
    numbers = [e["step"] for e in history if "step" in e]
    title = output_dir.resolve().name + (f" ({label})" if label else "")
    if numbers:
        title += f", steps {min(numbers)}-{max(numbers)}"
        if out.marker is None:
            title += f", not finished: up to step {max(numbers)}"
    return title


def plot_run(
    run: str,
    png: str | os.PathLike | None = None,
    csv_path: str | os.PathLike | None = None,
    outputs: str | os.PathLike = "outputs",
) -> tuple[Path, Path, dict]:
    """Plot one run; returns (png, csv, info). Default files: <output_dir>/<run>.png and the
    CSV beside it (next to what they plot, not wherever the command ran)."""
    output_dir = resolve_output_dir(run, outputs)
    events = list(read_events(output_dir))
    history, source = load_history(output_dir, events)
    history = with_scores(history, events)
    png = Path(png) if png is not None else output_dir / f"{output_dir.resolve().name}.png"
    csv_path = Path(csv_path) if csv_path is not None else png.with_suffix(".csv")
    keys = series_keys(history)
    png.parent.mkdir(parents=True, exist_ok=True)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    resumes = resume_points(events)
    panels = draw(history, png, _title(output_dir, events, history), resumes)
    rows = write_csv(csv_path, history, keys)
    info = {"source": str(source), "panels": panels, "rows": rows, "keys": keys}
    return png, csv_path, {**info, "resumed_from": resumes}


def main(
    run: str, out: str | None = None, csv_path: str | None = None, outputs: str = "outputs"
) -> int:
    png, table, info = plot_run(run, out, csv_path, outputs)
    print(f"plot: {png} ({', '.join(info['panels'])})")
    print(f"csv: {table} ({info['rows']} steps x {len(info['keys'])} series from {info['source']})")
    return 0
