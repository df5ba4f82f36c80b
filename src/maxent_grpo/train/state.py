"""One registry for the trainer state that lives between steps and is not TRL's or HF's.

Each component that owns such state (the adaptive KL controller, MaxEnt's beta and tau
controllers, rollout carry-over and the extra-prompt position, and whatever comes later)
registers it once, by name, with a function that returns it and one that restores it:

    state_registry(trainer).register("kl_controller", controller.state_dict, load)

The CompleteCheckpoints component (train/checkpoints.py) is the one place that uses the
registry: it writes every piece into the checkpoint before the completion marker, and reads
every piece back on resume, on every back end (HF Trainer calls `_load_optimizer_and_scheduler`
once on a resume whatever the back end; the component loads the registry after it, on every
path).
Each process writes its own file (`registered_state-<process>.pt`): per-process pieces (the
carried groups of that process) differ between processes, the others are the same in every
file. A registered piece that the checkpoint lacks, or cannot be restored, is an error naming
it: never a silent fresh start of that piece.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import UserError

STATE_FILE = "registered_state-{}.pt"
FORMAT = 1

logger = logging.getLogger("maxent_grpo")


@dataclass(frozen=True)
class StatePiece:
    """One registered piece: its name, how to read it and restore it, and whether it differs
    between processes."""

    name: str
    state_dict: Callable[[], dict]
    load_state_dict: Callable[[dict], None]
    per_process: bool  # differs between processes: needs the same process count on resume


class StateRegistry:
    """The pieces of a trainer's state, by name; saves and restores them all."""

    def __init__(self) -> None:
        self._pieces: dict[str, StatePiece] = {}

    def register(
        self,
        name: str,
        state_dict: Callable[[], dict],
        load_state_dict: Callable[[dict], None],
        per_process: bool = False,
    ) -> None:
        if name in self._pieces:
            raise ValueError(f"trainer state {name!r} is registered twice")
        self._pieces[name] = StatePiece(name, state_dict, load_state_dict, per_process)

    @property
    def names(self) -> list[str]:
        return sorted(self._pieces)

    def save(self, checkpoint: Path, process: int, processes: int) -> Path | None:
        """Write this process's file into `checkpoint` (atomically); None when nothing is
        registered."""
        if not self._pieces:
            return None
        import torch

        state = {
            "format": FORMAT,
            "processes": processes,
            "pieces": {name: piece.state_dict() for name, piece in self._pieces.items()},
        }
        checkpoint.mkdir(parents=True, exist_ok=True)
        path = checkpoint / STATE_FILE.format(process)
        torch.save(state, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        return path

    def load(self, checkpoint: Path, process: int, processes: int) -> None:
        """Restore every registered piece from `checkpoint`; UserError naming the first piece
        that is missing or does not load."""
        if not self._pieces:
            return
        saved, own = _read(checkpoint, process)
        pieces = saved["pieces"]
        for name, piece in self._pieces.items():
            if name not in pieces:
                raise UserError(
                    f"{checkpoint}: no saved trainer state {name!r} (saved with another recipe "
                    "or an older maxent-grpo); resume with the recipe it was saved with, or "
                    "train into a new output_dir"
                )
            if piece.per_process and not (own and saved["processes"] == processes):
                raise UserError(
                    f"{checkpoint}: trainer state {name!r} was saved by {saved['processes']} "
                    f"processes and this run has {processes}; it is kept per process, so "
                    f"resume with {saved['processes']} processes"
                )
            try:
                piece.load_state_dict(pieces[name])
            except (KeyError, TypeError, ValueError) as exc:
                raise UserError(
                    f"{checkpoint}: trainer state {name!r} does not load ({exc!r}); the "
                    "checkpoint was changed or written by another version"
                ) from exc
        ignored = sorted(set(pieces) - set(self._pieces))
        if ignored:
            logger.warning("%s: trainer state %s not used by this recipe", checkpoint, ignored)
        logger.info("Restored trainer state %s from %s", self.names, checkpoint)


def _read(checkpoint: Path, process: int) -> tuple[dict, bool]:
    """The saved state for `process`, and whether it is that process's own file (a run
    resumed on more processes than saved reads process 0's: shared pieces only)."""
    import torch

    checkpoint = Path(checkpoint)
    own = checkpoint / STATE_FILE.format(process)
    path = own if own.is_file() else checkpoint / STATE_FILE.format(0)
    if not path.is_file():
        raise UserError(
            f"{checkpoint}: no {STATE_FILE.format(process)} (saved with another recipe or an "
            "older maxent-grpo); resume with the recipe it was saved with, or train into a "
            "new output_dir"
        )
    saved = torch.load(path, weights_only=True)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise UserError(f"{path}: not a trainer state file of format {FORMAT}")
    return saved, path == own


def state_registry(trainer) -> StateRegistry:
    """The trainer's registry (made on first use: components register from their __init__)."""
    registry = trainer.__dict__.get("_state_registry")
    if registry is None:
        registry = trainer.__dict__["_state_registry"] = StateRegistry()
    return registry
