"""A reward that records what each step trained on (loaded as module:function): per call, the
step, the process, each completion's prompt hash and token ids, appended as one JSON line to
$MAXENT_GRPO_TEST_COMPLETIONS_DIR/completions-<process>.jsonl. Returns None for every
completion: TRL leaves None out of the weighted sum, so training is unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from maxent_grpo.rewards.rehearsal import prompt_key

ENV = "MAXENT_GRPO_TEST_COMPLETIONS_DIR"


def record_completions(completions, prompts=None, completion_ids=None, trainer_state=None, **_):
    folder = os.environ.get(ENV)
    if folder and trainer_state is not None:
        process = os.environ.get("RANK", "0")
        line = {
            "step": trainer_state.global_step + 1,  # the step training on them
            "process": process,
            "prompts": [prompt_key(p) for p in prompts or []],
            "ids": [list(map(int, ids)) for ids in completion_ids or []],
        }
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder) / f"completions-{process}.jsonl", "a") as file:
            file.write(json.dumps(line) + "\n")
    return [None] * len(completions)


def recorded(folder: Path) -> dict[int, dict[str, list]]:
    """{step: {process: entry}} of what was recorded; a step recorded twice (a run resumed
    before it) keeps its last entry."""
    found: dict[int, dict[str, list]] = {}
    for path in sorted(Path(folder).glob("completions-*.jsonl")):
        for text in path.read_text().splitlines():
            entry = json.loads(text)
            found.setdefault(int(entry["step"]), {})[entry["process"]] = entry
    return found
