"""`maxent-grpo sweep`: a grid of recipe overrides, every point checked, then one Slurm array.

    maxent-grpo sweep --config R --grid 'learning_rate=[1e-6,3e-6] maxent_tau=[0.5,1.0]'

or the grid of the recipe's `sweep:` section (recipe/sweep_section.py), merged with --grid key
by key (`sweep_settings`).

Each point is the recipe with `--key value` overrides; its run directory sits beside the
recipe's output_dir and is named after the sweep and the point's values
(`outputs/smoke-grpo-learning_rate=1e-6-maxent_tau=0.5`). Every point gets the verdict of
`maxent-grpo check` / `sbatch` first; one problem anywhere and nothing is queued.

The points go to `<sweep>.sweep.json` beside the runs; one `sbatch --array=0-(n-1)%N
training.sh ... --sweep-points FILE` queues them, and each task's launcher picks point
$SLURM_ARRAY_TASK_ID at job start (`point_request`). A requeue restarts the same task, so
retries and resume work per point; `maxent-grpo runs --sweep NAME` reads the same file.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

from maxent_grpo.errors import ConfigProblems, UserError
from maxent_grpo.launch.attempt import declared_output_dir
from maxent_grpo.launch.launcher import Prepared, RunRequest
from maxent_grpo.launch.sbatch import (
    check_for,
    fit_gpu_request,
    node_loss_options,
    planned_environment,
    require_slurm,
    sbatch_command,
)
from maxent_grpo.launch.slurm import SWEEP_ENV
from maxent_grpo.recipe.parser import load_recipe_file, read_recipe
from maxent_grpo.recipe.sweep_section import SweepSection, check_grid_key
from maxent_grpo.rundir.sweeps import (
    POINTS_SUFFIX,
    SWEEP_JOB_NAME,
    Point,
    read_points,
    write_points,
)

_WHERE = ("--output_dir", "--run_name")  # a point's own: it sets them
_ITEMS = re.compile(r"[^\s=]+=\[[^\]]*\]|\S+")  # key=[a, b] (spaces allowed inside) or a word
_ITEM = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)=(?:\[(.*)\]|([^\[\]]*))$")


def parse_grid(text: str) -> dict[str, list[str]]:
    """`k=[a,b] k2=c` -> {"k": ["a", "b"], "k2": ["c"]}; a malformed item is one line."""
    grid: dict[str, list[str]] = {}
    for item in _ITEMS.findall(text):
        match = _ITEM.match(item)
        fix = "write it as key=[value,value] or key=value"
        if match is None:
            raise UserError(f"--grid: cannot read {item!r}; {fix}")
        key, listed, single = match.groups()
        values = [v.strip() for v in listed.split(",")] if listed is not None else [single]
        if not all(values):
            raise UserError(f"--grid: {item!r} has an empty value; {fix}")
        if key in grid:
            raise UserError(f"--grid: key {key!r} appears twice; give all its values in one list")
        if len(set(values)) != len(values):
            raise UserError(f"--grid: {item!r} repeats a value; list each value once")
        grid[key] = values
    if not grid:
        raise UserError("--grid is empty; give at least one key=[value,...]")
    return grid


def _safe(text: str) -> str:
    """A value as it may appear in a directory, log and job name."""
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", text)


def make_points(grid: dict[str, list[str]], sweep: str, parent: Path) -> list[Point]:
    """Every combination of the grid's values, in the grid's order (the last key varies
    fastest); each point's run directory is parent/<sweep>-k=v-k2=v2."""
    points = []
    for combo in itertools.product(*grid.values()):
        values = dict(zip(grid, combo))
        name = "-".join([sweep, *(f"{k}={_safe(v)}" for k, v in values.items())])
        points.append(Point(name=name, output_dir=str(parent / name), values=values))
    return points


def plan_sweep(
    request: RunRequest, grid: dict[str, list[str]], name: str | None
) -> tuple[str, list[Point]]:
    """The sweep's name (default: the recipe's output_dir's name) and its points, whose run
    directories sit beside that output_dir."""
    load_recipe_file(request.recipe)  # one line for a missing or malformed recipe
    output_dir = declared_output_dir(request) or Path("outputs/run")
    sweep = _safe(name or output_dir.name)
    return sweep, make_points(grid, sweep, output_dir.parent)


def point_run(request: RunRequest, point: Point) -> RunRequest:
    """The run request of one point: the sweep's overrides (but where it writes), then the
    point's."""
    kept, skip = [], False
    for flag in request.overrides:
        name = flag.split("=", 1)[0]
        if not skip and name not in _WHERE:
            kept.append(flag)
        skip = not skip and flag in _WHERE  # `--output_dir DIR`: DIR goes too
    return replace(request, run_name=None, overrides=(*kept, *point.flags))


def check_points(request: RunRequest, points: list[Point], environment) -> list[Prepared]:
    """`check`'s verdict on every point; all problems at once, each line once (naming the
    points it was found in), as one ConfigProblems. Nothing is queued before this passes.
    Returns the points' plans."""
    found: dict[str, list[str]] = {}
    prepared = []
    for point in points:
        try:
            prepared.append(check_for(point_run(request, point), environment)[0])
        except ConfigProblems as exc:
            for line in exc.problems:
                found.setdefault(line, []).append(point.name)
        except UserError as exc:
            found.setdefault(str(exc), []).append(point.name)
    if found:
        lines = [
            line
            if len(names) == len(points)
            else f"{line} (point{'s' * (len(names) > 1)} {', '.join(names)})"
            for line, names in found.items()
        ]
        raise ConfigProblems(f"the sweep of {request.recipe}", lines)
    return prepared


def points_path(sweep: str, points: list[Point]) -> Path:
    """Where the points are written: beside the runs, <parent>/<sweep>.sweep.json."""
    return Path(points[0].output_dir).parent / f"{sweep}{POINTS_SUFFIX}"


def write_sweep(path: Path, sweep: str, request: RunRequest, grid, points: list[Point]) -> None:
    header = {"sweep": sweep, "recipe": request.recipe, "method": request.method}
    write_points(path, {**header, "overrides": list(request.overrides), "grid": grid}, points)


def point_request(request: RunRequest, path: str, environ=os.environ) -> RunRequest:
    """The run of this array task: point $SLURM_ARRAY_TASK_ID of the points file. Marks the
    environment (SWEEP_ENV) so this task's attempts and errors count for its point alone."""
    sweep, points = read_points(path)
    index = environ.get("SLURM_ARRAY_TASK_ID", "")
    if not index.isdigit() or int(index) >= len(points):
        raise UserError(
            f"--sweep-points {path}: SLURM_ARRAY_TASK_ID is {index or 'unset'}, not one of the "
            f"{len(points)} points (0-{len(points) - 1}); queue it with maxent-grpo sweep"
        )
    environ[SWEEP_ENV] = f"{sweep}:{index}"
    return point_run(request, points[int(index)])


def sweep_command(request: RunRequest, args, path: Path, count: int, sweep: str) -> list[str]:
    """`sbatch --array=0-(n-1)%N training.sh ... --sweep-points FILE` for the sweep."""
    array = f"0-{count - 1}" + (f"%{args.throttle}" if args.throttle else "")
    with_array = argparse.Namespace(**{**vars(args), "array": array})
    # runs/queue.py finds the tasks by this name and their points by the comment
    name = f"{SWEEP_JOB_NAME}:{sweep}"
    command = sbatch_command(replace(request, run_name=None), with_array, job_name=name)
    at = command.index("training.sh")
    command[at:at] = [f"--comment={path.resolve()}"]
    tail = command.index("--") if "--" in command else len(command)
    command[tail:tail] = ["--sweep-points", str(path.resolve())]
    return command


def command_grid(texts: list[str] | None) -> dict[str, list[str]]:
    """Every --grid given, as one grid; a key given twice is one line."""
    grid: dict[str, list[str]] = {}
    for text in texts or []:
        for key, values in parse_grid(text).items():
            check_grid_key(key, "--grid")  # as the sweep: section refuses it
            if key in grid:
                raise UserError(f"--grid: key {key!r} appears twice; give its values once")
            grid[key] = values
    return grid


def sweep_settings(request: RunRequest, args) -> tuple[dict[str, list[str]], int | None, str]:
    """(grid, throttle, name): the recipe's `sweep:` section (recipe/sweep_section.py, checked
    by read_recipe) merged with the command line, key by key: a --grid key replaces the
    section's values of that key (one value pins it), --throttle and --name win."""
    keys = read_recipe(["--config", request.recipe, *request.overrides], request.method)
    section = keys.sweep or SweepSection()
    grid = {**section.grid, **command_grid(args.grid)}
    if not grid:
        raise UserError(
            f"{request.recipe}: nothing to sweep: no --grid and no sweep: section; give "
            "--grid 'key=[a,b]' or add sweep: {grid: {key: [a, b]}} to the recipe"
        )
    throttle = args.throttle if args.throttle is not None else section.throttle
    return grid, throttle, args.name or section.name


def main(request: RunRequest, args) -> int:
    """`maxent-grpo sweep`: check every point; print them (--dry-run) or queue one array."""
    if args.throttle is not None and args.throttle < 1:
        raise UserError(f"--throttle {args.throttle}: give at least 1 (points at a time)")
    if not args.dry_run:
        require_slurm("sweep")
    grid, throttle, name = sweep_settings(request, args)
    args = argparse.Namespace(**{**vars(args), "throttle": throttle})
    sweep, points = plan_sweep(request, grid, name)
    prepared = check_points(request, points, planned_environment(args.nodes, args.gpus))
    path = points_path(sweep, points)
    print(f"sweep {sweep}: {len(points)} point(s), all checked")
    for index, point in enumerate(points):
        shown = " ".join(f"{k}={v}" for k, v in point.values.items())
        print(f"  {index}  {point.name}  {shown}  -> {point.output_dir}")
    command = sweep_command(request, args, path, len(points), sweep)
    command[1:1] = node_loss_options(*prepared)
    fit_gpu_request(command, *prepared)
    if args.dry_run:
        print(f"dry run: nothing queued; would write {path} and run: {' '.join(command)}")
        return 0
    write_sweep(path, sweep, request, grid, points)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        reason = " ".join(result.stderr.split()) or f"exit code {result.returncode}"
        raise UserError(f"sbatch refused the sweep: {reason}")
    job = result.stdout.strip().split(";")[0]
    print(f"submitted array job {job} ({len(points)} tasks); points: {path}")
    return 0
