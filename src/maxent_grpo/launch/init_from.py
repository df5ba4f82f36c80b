"""`init_from`: start a run from another run's model (e.g. GRPO after SFT).

The recipe names a run (under outputs/), a run directory or a checkpoint directory; the
launcher resolves it when the job starts (`resolve`), so a job submitted with
`--dependency=afterok:<the source's job>` finds the source finished. A run directory gives its
final model (the run must be complete: rundir/checkpoints.py `run_is_complete`); a checkpoint
directory must be complete (its marker). The resolved directory becomes the run's
`model_name_or_path` (an override after the others: `with_init`), so it is recorded in the
run's settings like any override, and the launcher writes an `init_from` event.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from maxent_grpo.errors import ConfigError
from maxent_grpo.launch.launcher import RunRequest
from maxent_grpo.rundir.checkpoints import CHECKPOINT_MARKER, RUN_MARKER, run_is_complete

KEY = "init_from"
OUTPUTS = Path("outputs")


def declared_init_from(request: RunRequest) -> str | None:
    """init_from as the request gives it: the last `--init_from` override, else the recipe's
    (read without parsing; a broken recipe is the parser's to report)."""
    value = None
    overrides = list(request.overrides)
    for i, arg in enumerate(overrides):
        if arg.startswith(f"--{KEY}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{KEY}" and i + 1 < len(overrides):
            value = overrides[i + 1]
    if value is not None:
        return value or None
    try:
        data = yaml.safe_load(Path(request.recipe).read_text())
    except (OSError, yaml.YAMLError):
        return None
    found = data.get(KEY) if isinstance(data, dict) else None
    return str(found) if found else None


def resolve(source: str, where: str, outputs: Path = OUTPUTS) -> Path:
    """The model directory `source` names, or a one-line ConfigError (`where`: the recipe)."""
    path = Path(source)
    if not path.is_dir() and not path.is_absolute() and (outputs / source).is_dir():
        path = outputs / source  # a run name, or run/checkpoint-N
    prefix = f"{where}: key '{KEY}' ({source!r})"
    if not path.is_dir():
        raise ConfigError(
            f"{prefix} names no directory (nor {outputs / source}); give a run name under "
            f"{outputs}/, a run directory or a checkpoint directory"
        )
    if path.name.startswith("checkpoint-"):
        if not (path / CHECKPOINT_MARKER).is_file():
            raise ConfigError(
                f"{prefix}: {path} is not a complete checkpoint (no {CHECKPOINT_MARKER}: its "
                "save did not finish); name a complete one"
            )
        return path
    if not run_is_complete(path):
        raise ConfigError(
            f"{prefix}: {path} has not finished (no {RUN_MARKER}); wait for it (sbatch "
            f"--dependency=afterok:<its job>) or name one of its complete checkpoints "
            f"({path}/checkpoint-N)"
        )
    return path


def with_init(request: RunRequest) -> tuple[RunRequest, tuple[str, Path] | None]:
    """The request starting from init_from's model, and (source, model directory); the
    request as it is when the recipe has no init_from."""
    source = declared_init_from(request)
    if source is None:
        return request, None
    path = resolve(source, request.recipe)
    overrides = (*request.overrides, f"--model_name_or_path={path}")
    return replace(request, overrides=overrides), (source, path)


def init_note(request: RunRequest) -> str | None:
    """For `check` / `sbatch`: what init_from resolves to now (the job resolves it again when
    it starts, so a source that is not there yet is a note, not an error)."""
    source = declared_init_from(request)
    if source is None:
        return None
    try:
        return f"{KEY}: starts from {resolve(source, request.recipe)} (resolved again at job start)"
    except ConfigError as exc:
        return f"{exc} (now; resolved again when the job starts)"
