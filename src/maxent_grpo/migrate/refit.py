"""The source's global batch re-fit to the planned training processes (pure).

A recipe counts completions per device; what a run means is counted globally: completions per
optimizer step and per generation. On another number of processes the same per-device keys make
another global batch (or none that holds whole groups), so migrate chooses the per-device batch,
gradient accumulation and steps per generation that keep the source's global batch:

    completions per optimizer step  = per_device_train_batch_size x processes x accumulation
    completions per generation      = per_device_train_batch_size x processes x steps_per_generation
    completions per evaluation batch = per_device_eval_batch_size x processes

Where no exact fit exists, the nearest one that holds whole groups, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd


@dataclass(frozen=True)
class TrainFit:
    """Per-device keys for the planned processes, and the arithmetic in words."""

    per_device: int
    accumulation: int
    steps_per_generation: int
    per_step: int  # completions per optimizer step of the fit
    per_generation: int  # completions per generation of the fit
    exact: bool
    lines: tuple[str, ...]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest_multiple(value: int, unit: int) -> int:
    return max(unit, round(value / unit) * unit)


def _nearest_train(per_step: int, per_generation: int, group: int, processes: int) -> TrainFit:
    """One completion per device per micro-step: the nearest whole groups to the source's."""
    unit = group // gcd(group, processes)  # micro-steps whose completions make whole groups
    steps = _nearest_multiple(round(per_generation / processes), unit)
    accumulation = max(1, round(per_step / processes))
    if steps % accumulation:  # a generation holds whole optimizer steps, as the source's
        accumulation = min(_divisors(steps), key=lambda d: abs(d - per_step / processes))
    why = (
        f"no exact fit: {per_step} completions per optimizer step and {per_generation} per "
        f"generation make no whole groups of {group} as per-device batch x {processes} "
        "processes x micro-steps"
    )
    fit_step, fit_gen = processes * accumulation, processes * steps
    line = (
        f"nearest: 1 x {processes} x {accumulation} = {fit_step} completions per optimizer "
        f"step (source {per_step}), 1 x {processes} x {steps} = {fit_gen} per generation "
        f"(source {per_generation})"
    )
    return TrainFit(1, accumulation, steps, fit_step, fit_gen, False, (why, line))


def refit_train(
    per_step: int, per_generation: int, group: int, processes: int, cap: int
) -> TrainFit:
    """Keys that keep `per_step` and `per_generation` completions on `processes` processes,
    with the largest per-device batch up to `cap` (the source's per-device batch: its memory).

    The source's numbers hold whole groups of `group` and a generation holds whole optimizer
    steps (per_generation a multiple of per_step), as TRL and verl both require.
    """
    common = gcd(per_step, per_generation)
    if common % processes == 0 and per_generation % group == 0:
        sizes = [d for d in _divisors(common // processes) if d <= max(cap, 1)] or [1]
        batch = max(sizes)
        accumulation = per_step // (batch * processes)
        steps = per_generation // (batch * processes)
        lines = (
            f"{batch} x {processes} processes x {accumulation} accumulation = {per_step} "
            "completions per optimizer step, as the source",
            f"{batch} x {processes} processes x {steps} steps_per_generation = "
            f"{per_generation} completions per generation ({per_generation // group} prompts x "
            f"{group}), as the source",
        )
        return TrainFit(batch, accumulation, steps, per_step, per_generation, True, lines)
    return _nearest_train(per_step, per_generation, group, processes)


def refit_eval(per_batch: int, group: int, processes: int) -> tuple[int, bool, str]:
    """per_device_eval_batch_size keeping `per_batch` completions per evaluation batch on
    `processes` processes (whole groups of `group`), or the nearest; with the arithmetic."""
    if per_batch % processes == 0 and per_batch % group == 0:
        size = per_batch // processes
        return (
            size,
            True,
            f"{size} x {processes} processes = {per_batch} completions, as the source",
        )
    unit = group // gcd(group, processes)
    size = _nearest_multiple(round(per_batch / processes), unit)
    line = (
        f"no exact fit: {per_batch} completions per evaluation batch are not whole groups of "
        f"{group} split over {processes} processes; nearest: {size} x {processes} = "
        f"{size * processes} completions"
    )
    return size, False, line
