"""`maxent-grpo plot RUN`: a PNG of a run's training curves and the same series as CSV.

The numbers come from the run's trainer_state.json log_history (the final one, or the newest
complete checkpoint's while the run is not finished): exactly what the trainer logged, so the
CSV holds the logged floats with repr precision. Resume points (vertical lines) come from the
"Resuming from .../checkpoint-N" lines of the run's train logs. matplotlib draws headless
(Agg canvas, no pyplot, no display needed).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.runs import (
    METHOD_NAMES,
    RESUME_RE,
    detect_method,
    looks_like_run_dir,
    parse_log_name,
    read_head,
    read_output_dir,
    segments,
)
from maxent_grpo.train.checkpoints import RUN_MARKER

RESUME_SEARCH_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]  # exact keys; "rewards/*/mean" expands to every reward function
    ylabel: str = ""
    log_scale: bool = False


PANELS = (
    Panel("Reward", ("reward", "rewards/*/mean"), "mean reward"),
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
        raise UserError(
            f"{candidates[0]}: nothing to plot yet: no trainer_state.json and no checkpoint"
        )
    raise UserError(
        f"{run}: no such run: neither an output directory nor a run under {outputs}/ "
        "(one with trainer_state.json or checkpoint-N/)"
    )


def load_log_history(output_dir: str | os.PathLike) -> tuple[list[dict], Path]:
    """The longest log_history of the run: its final trainer_state.json, else the newest
    complete checkpoint's (a run in progress is plotted up to its last checkpoint)."""
    out = read_output_dir(Path(output_dir))
    candidates = [out.path / "trainer_state.json"]
    candidates += [
        out.path / f"checkpoint-{step}" / "trainer_state.json"
        for step, complete, _ in reversed(out.checkpoints)
        if complete
    ]
    best: tuple[int, list[dict], Path] | None = None
    for path in candidates:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        step = state.get("global_step") or 0
        if best is None or step > best[0]:
            best = (step, state.get("log_history") or [], path)
    if best is None:
        raise UserError(
            f"{output_dir}: nothing to plot yet: no trainer_state.json and no complete checkpoint"
        )
    return best[1], best[2]


def resume_points(
    run_name: str, logs_dirs: Sequence[str | os.PathLike] = ("logs",)
) -> list[tuple[int, str]]:
    """(step, log file) for each attempt that resumed ("Resuming from .../checkpoint-N")."""
    found = []
    for logs_dir in logs_dirs:
        try:
            names = os.listdir(logs_dir)
        except OSError:
            continue
        for name in names:
            parsed = parse_log_name(name)
            if parsed is None or parsed.run != run_name or parsed.role != "train":
                continue
            path = Path(logs_dir) / name
            try:
                text = read_head(path, RESUME_SEARCH_BYTES)
            except OSError:
                continue
            for line in segments(text):
                if "Resuming from" in line and (match := RESUME_RE.search(line)):
                    found.append((parsed.stamp, int(match[2]), str(path)))
                    break
    return [(step, path) for _stamp, step, path in sorted(found)]


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
    keys = []
    for key in panel.keys:
        if key == "rewards/*/mean":
            keys += [k for k in present if _REWARD_FUNC_RE.match(k)]
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
    return key.split("/", 1)[-1] if key.startswith("maxent/") else key


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
    from matplotlib.ticker import MaxNLocator

    present = {k: None for entry in history for k in entry}
    panels = [(p, _panel_keys(p, present)) for p in PANELS]
    panels = [(p, keys) for p, keys in panels if keys]
    if not panels:
        raise UserError("nothing to plot: the log history has none of the plotted metrics")
    # The reward spans the top row (legend on its right); the rest go two per row, a last odd
    # one full width.
    rest = len(panels) - 1
    rows = 1 + math.ceil(rest / 2)
    fig = Figure(figsize=(10.5, 2.4 * rows + 0.6), dpi=dpi)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(rows, 2)
    slots = [grid[0, :]]
    for index in range(rest):
        row, col = 1 + index // 2, index % 2
        slots.append(grid[row, :] if index == rest - 1 and rest % 2 else grid[row, col])
    steps = [e["step"] for e in history if "step" in e]
    markers = len(set(steps)) <= 60
    for index, ((panel, keys), slot) in enumerate(zip(panels, slots, strict=True)):
        ax = fig.add_subplot(slot)
        if panel.title == "Completion length":
            xs, mean = _points(history, "completions/mean_length")
            lo_x, lo = _points(history, "completions/min_length")
            hi_x, hi = _points(history, "completions/max_length")
            if lo and hi and lo_x == hi_x == xs:
                ax.fill_between(xs, lo, hi, alpha=0.2, label="min-max")
            if mean:
                ax.plot(xs, mean, marker="o" if markers else None, ms=3, label="mean")
        else:
            positive = True
            for key in keys:
                xs, ys = _points(history, key)
                positive = positive and all(y > 0 for y in ys)
                style = {"lw": 2.0} if key == "reward" else {"lw": 1.2, "alpha": 0.85}
                ax.plot(xs, ys, marker="o" if markers else None, ms=3, label=_label(key), **style)
            if panel.log_scale and positive:
                ax.set_yscale("log")
        for step in resumes:
            ax.axvline(step, color="0.35", ls="--", lw=1)
        if steps:
            ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if index == len(panels) - 1 or (index == len(panels) - 2 and rest % 2 == 0 and index):
            ax.set_xlabel("step", fontsize=8)
        labeled = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        if index == 0 and len(labeled) > 1:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        elif len(labeled) > 1 or panel.title == "Completion length":
            ax.legend(fontsize=7, loc="best", framealpha=0.6)
    if resumes:
        title += "   (dashed: resumed from checkpoint " + ", ".join(map(str, resumes)) + ")"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=dpi)
    return [p.title for p, _ in panels]


def plot_run(
    run: str,
    png: str | os.PathLike | None = None,
    csv_path: str | os.PathLike | None = None,
    outputs: str | os.PathLike = "outputs",
    logs_dirs: Sequence[str | os.PathLike] = ("logs",),
) -> tuple[Path, Path, dict]:
    """Plot one run; returns (png, csv, info). Default files: ./<run>.png and the CSV beside."""
    output_dir = resolve_output_dir(run, outputs)
    history, source = load_log_history(output_dir)
    name = output_dir.resolve().name
    png = Path(png) if png is not None else Path(f"{name}.png")
    csv_path = Path(csv_path) if csv_path is not None else png.with_suffix(".csv")
    resumes = resume_points(name, logs_dirs)
    out = read_output_dir(output_dir)
    method = METHOD_NAMES.get(detect_method(out, None, None) or "", "")
    if not method and any(k.startswith("maxent/") for e in history for k in e):
        method = "MaxEnt"
    steps = [e["step"] for e in history if "step" in e]
    title = f"{name}" + (f" ({method})" if method else "")
    if steps:
        title += f", steps {min(steps)}-{max(steps)}"
    if not (output_dir / RUN_MARKER).is_file():
        title += f", not finished: up to {source.parent.name}"
    keys = series_keys(history)
    png.parent.mkdir(parents=True, exist_ok=True)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    panels = draw(history, png, title, [step for step, _ in resumes])
    rows = write_csv(csv_path, history, keys)
    return png, csv_path, {"source": str(source), "panels": panels, "rows": rows, "keys": keys}


def main(
    run: str,
    out: str | None = None,
    csv_path: str | None = None,
    outputs: str = "outputs",
    logs_dirs: Sequence[str] = ("logs",),
) -> int:
    png, table, info = plot_run(run, out, csv_path, outputs, logs_dirs)
    print(f"plot: {png} ({', '.join(info['panels'])})")
    print(f"csv: {table} ({info['rows']} steps x {len(info['keys'])} series from {info['source']})")
    return 0
