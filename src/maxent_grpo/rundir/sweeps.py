"""What a queued job or a sweep leaves for `maxent-grpo runs` to read: Slurm job names and a
sweep's points file, `<sweep>.sweep.json` beside the points' run directories.

Written by the launcher (launch/sweep.py, launch/sbatch.py), read by runs/ (runs/queue.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxent_grpo.errors import UserError

POINTS_SUFFIX = ".sweep.json"
# Slurm job names: `maxent-grpo:<run>` (maxent-grpo sbatch), `maxent-grpo-sweep:<sweep>` (an
# array, one task per point; the points file in the job's comment), `maxent-grpo` (training.sh's
# header: a plain `sbatch training.sh`, whose run is not known until it writes).
JOB_NAME = "maxent-grpo"
SWEEP_JOB_NAME = "maxent-grpo-sweep"


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its run name, run directory and the values that make it."""

    name: str
    output_dir: str
    values: dict[str, str]

    @property
    def flags(self) -> tuple[str, ...]:
        """The point's recipe flags as `--key=value` (a value may start with '-'), its values
        first, then where it writes."""
        pairs = [*self.values.items(), ("output_dir", self.output_dir), ("run_name", self.name)]
        return tuple(f"--{key}={value}" for key, value in pairs)


def write_points(path: Path, header: dict[str, Any], points: list[Point]) -> None:
    """The points file: `header` (sweep, recipe, grid ...) and the points, in index order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        **header,
        "points": [
            {"name": p.name, "output_dir": p.output_dir, "values": p.values} for p in points
        ],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def read_points(path: str | os.PathLike) -> tuple[str, list[Point]]:
    """A points file's sweep name and points; one line when it cannot be read."""
    try:
        data = json.loads(Path(path).read_text())
        points = [Point(p["name"], p["output_dir"], dict(p["values"])) for p in data["points"]]
        return str(data["sweep"]), points
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: cannot read the sweep's points ({exc})") from None


def find_points(sweep: str, dirs: list[str]) -> Path | None:
    """`<sweep>.sweep.json` in the first of `dirs` that has it."""
    for folder in dirs:
        path = Path(folder) / f"{sweep}{POINTS_SUFFIX}"
        if path.is_file():
            return path
    return None
