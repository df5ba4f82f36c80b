"""`maxent-grpo plot --sweep NAME` and `maxent-grpo plot RUN RUN ...`: several runs' curves in
one figure, and the same series as CSV.

The top panel overlays each run's headline metric (the mean reward; the training loss for runs
without a reward, e.g. SFT: runs/history.py), one line per run, labelled by the point's values
(a sweep) or the run's name; below it, one panel per benchmark with each run's scores. The
series are those of `maxent-grpo plot RUN` (runs/history.py); a run that has logged nothing yet
is left out and named. Headless, as runs/plot.py.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.rundir.events import read_events
from maxent_grpo.rundir.sweeps import POINTS_SUFFIX, find_points, read_points
from maxent_grpo.runs.history import (
    EVAL_PREFIX,
    HEADLINES,
    headline,
    load_history,
    with_scores,
)
from maxent_grpo.runs.plot import resolve_output_dir


@dataclass(frozen=True)
class Curve:
    label: str  # the point's values, or the run's name
    run: str
    history: list[dict]


def curves_of(runs: Sequence[tuple[str, Path]]) -> tuple[list[Curve], list[str]]:
    """(label, output_dir) -> the runs' histories with their benchmark scores; and the labels
    of the runs that have nothing to plot yet."""
    curves, empty = [], []
    for label, output_dir in runs:
        try:
            events = list(read_events(output_dir))
            history = with_scores(load_history(output_dir, events)[0], events)
        except (UserError, OSError):
            empty.append(label)
            continue
        curves.append(Curve(label, Path(output_dir).name, history))
    return curves, empty


def sweep_runs(sweep: str, dirs: Sequence[str]) -> tuple[list[tuple[str, Path]], Path]:
    """The points of sweep NAME as (label, output_dir), and its points file."""
    path = find_points(sweep, list(dirs))
    if path is None:
        raise UserError(
            f"plot --sweep {sweep}: no {sweep}{POINTS_SUFFIX} under {', '.join(dirs)}; "
            "give --dir with the folder that holds the sweep's runs"
        )
    points = read_points(path)[1]
    labels = [" ".join(f"{k}={v}" for k, v in p.values.items()) or p.name for p in points]
    return [(label, Path(p.output_dir)) for label, p in zip(labels, points, strict=True)], path


def _series(history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [
        (int(e["step"]), float(e[key]))
        for e in history
        if "step" in e and isinstance(e.get(key), (int, float))
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plotted_keys(curves: Sequence[Curve]) -> list[str]:
    """The headline metric (the first of HEADLINES any run logged), then each benchmark."""
    metric = next((m for m in (headline(c.history) for c in curves) if m), None)
    if metric is None:
        raise UserError("nothing to plot: no run has logged a reward or a loss")
    present = {k for c in curves for e in c.history for k in e}
    return [metric, *sorted(k for k in present if k.startswith(EVAL_PREFIX))]


def draw_overlay(curves: Sequence[Curve], keys: Sequence[str], png: Path, title: str) -> None:
    """One panel per key, one line per run; the legend (the labels) right of the top panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10.5, 1.0 + 3.0 * len(keys)), dpi=80)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, squeeze=False, sharex=True)[:, 0]
    for index, (ax, key) in enumerate(zip(axes, keys, strict=True)):
        for curve in curves:
            xs, ys = _series(curve.history, key)
            dots = "o" if key.startswith(EVAL_PREFIX) or len(xs) <= 60 else None
            ax.plot(xs, ys, marker=dots, ms=3, lw=1.5, label=curve.label)
        if key.startswith(EVAL_PREFIX):
            ax.set_title(f"Benchmark {key[len(EVAL_PREFIX) :]}", fontsize=10)
            ax.set_ylim(-0.05, 1.05)  # a pass@k score
        else:
            word = "higher" if dict(HEADLINES)[key] is max else "lower"
            ax.set_title(f"{key} ({word} is better)", fontsize=10)
        ax.set_ylabel(key, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if index == 0:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[-1].set_xlabel("step", fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=80)


def write_long_csv(path: Path, curves: Sequence[Curve], keys: Sequence[str]) -> int:
    """One row per run, step and key that has a value: label, run, step, key, value (repr:
    the logged float exactly). Returns the rows."""
    rows = 0
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["label", "run", "step", "key", "value"])
        for curve in curves:
            for key in keys:
                for step, value in zip(*_series(curve.history, key), strict=True):
                    writer.writerow([curve.label, curve.run, step, key, repr(value)])
                    rows += 1
    return rows


def overlay(
    runs: Sequence[tuple[str, Path]], png: Path, csv_path: Path | None, title: str
) -> tuple[Path, Path, dict]:
    """Plot several runs in one figure; returns (png, csv, info)."""
    curves, empty = curves_of(runs)
    if not curves:
        raise UserError(f"nothing to plot yet: none of {len(runs)} run(s) has logged a step")
    keys = plotted_keys(curves)
    csv_path = csv_path or png.with_suffix(".csv")
    for path in (png, csv_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    draw_overlay(curves, keys, png, title)
    rows = write_long_csv(csv_path, curves, keys)
    return png, csv_path, {"keys": keys, "rows": rows, "plotted": len(curves), "empty": empty}


def main(
    runs: Sequence[str],
    sweep: str | None,
    out: str | None = None,
    csv_path: str | None = None,
    outputs: str = "outputs",
) -> int:
    """`plot --sweep NAME` (default files: beside the points file, NAME.png and .csv) or `plot
    RUN RUN ...` (default: <outputs>/compare.png and .csv)."""
    if bool(sweep) == bool(runs):
        raise UserError("plot: give one run, several runs (one figure), or --sweep NAME")
    if sweep:
        found, points_file = sweep_runs(sweep, list(dict.fromkeys([outputs, "outputs", "logs"])))
        default, title = points_file.parent / f"{sweep}.png", f"sweep {sweep}"
    else:
        found = [(run, resolve_output_dir(run, outputs)) for run in runs]
        default, title = Path(outputs) / "compare.png", " vs ".join(runs)
    png = Path(out) if out else default
    png, table, info = overlay(found, png, Path(csv_path) if csv_path else None, title)
    shown = ", ".join(k.removeprefix(EVAL_PREFIX) for k in info["keys"])
    print(f"plot: {png} ({info['plotted']} run(s): {shown})")
    if info["empty"]:
        print(f"not plotted (nothing logged yet): {', '.join(info['empty'])}")
    print(f"csv: {table} ({info['rows']} rows: label, run, step, key, value)")
    return 0
