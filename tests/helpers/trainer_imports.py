"""What a trainer process loads: a fresh interpreter reads a recipe, marks the libraries it
does not use absent (as train/entry.py does), imports TRL's GRPO trainer and reports."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.runs import PYTHON, run

CODE = """
import json, sys
from maxent_grpo.recipe import read_recipe
from maxent_grpo.train.unused_libraries import mark_unused_libraries_absent
mark_unused_libraries_absent(read_recipe(["--config", sys.argv[1]]))
import trl.trainer.grpo_trainer
from transformers.integrations import is_wandb_available
from transformers.utils import is_peft_available
from trl.import_utils import is_vllm_available
loaded = lambda name: sys.modules.get(name) is not None
print(json.dumps({"wandb": [loaded("wandb"), is_wandb_available()],
                  "vllm": [loaded("vllm"), is_vllm_available()],
                  "peft": [loaded("peft"), is_peft_available()]}))
"""


def trainer_imports(recipe: Path) -> dict[str, list[bool]]:
    """{library: [imported, TRL/transformers says available]} in a trainer of `recipe`."""
    result = run([PYTHON, "-c", CODE, str(recipe)], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
