"""The rehearsal's probe (`maxent-grpo rehearse`, docs/rehearse.md): a reward function that
scores nothing and records which prompts each step drew, so that a resumed rehearsal can be
compared with an uninterrupted one prompt by prompt.

It appends one JSON line per call to `$MAXENT_GRPO_REHEARSAL_DRAWS/draws-<process>.jsonl`:
the step (TRL's global step when the batch was generated), the process and a short hash of
each completion's prompt, in order. It returns None for every completion: TRL leaves None out
of the weighted sum, so training is what it would be without it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

ENV = "MAXENT_GRPO_REHEARSAL_DRAWS"


def prompt_key(prompt) -> str:
    """A short, stable hash of a prompt (text or chat messages)."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def record_draws(completions, prompts=None, trainer_state=None, **kwargs) -> list[None]:
    folder = os.environ.get(ENV)
    if folder and prompts is not None:
        process = os.environ.get("RANK", "0")
        step = getattr(trainer_state, "global_step", None)
        line = {"step": step, "process": process, "prompts": [prompt_key(p) for p in prompts]}
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder) / f"draws-{process}.jsonl", "a") as file:
            file.write(json.dumps(line) + "\n")
    return [None] * len(completions)
