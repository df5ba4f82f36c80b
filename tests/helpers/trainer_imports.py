"""What a trainer process loads: a fresh interpreter reads a recipe, marks the libraries it
does not use absent (as train_process.py does), imports TRL's GRPO trainer within start-up
(train/startup.py) and reports, with how many times the installed packages were scanned and
how many full garbage collections ran meanwhile, and whether torch got start-up's op_source."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.runs import PYTHON, run

CODE = """
import gc, importlib.metadata, json, sys
scans = []
real_scan = importlib.metadata.packages_distributions
importlib.metadata.packages_distributions = lambda: scans.append(1) or real_scan()
from maxent_grpo.recipe import read_recipe
from maxent_grpo.train.startup import starting_up
from maxent_grpo.train.unused_libraries import mark_unused_libraries_absent
with starting_up():
    mark_unused_libraries_absent(read_recipe(["--config", sys.argv[1]]))
    import trl.trainer.grpo_trainer
    from transformers.integrations import is_wandb_available
    from transformers.utils import is_peft_available
    from trl.import_utils import is_vllm_available
    full_collections = gc.get_stats()[2]["collections"]
import torch._library.utils
from maxent_grpo.train.startup import op_source
loaded = lambda name: sys.modules.get(name) is not None
print(json.dumps({"wandb": [loaded("wandb"), is_wandb_available()],
                  "vllm": [loaded("vllm"), is_vllm_available()],
                  "peft": [loaded("peft"), is_peft_available()],
                  "package_scans": len(scans), "full_collections": full_collections,
                  "op_source": torch._library.utils.get_source is op_source}))
"""


def trainer_imports(recipe: Path) -> dict:
    """{library: [imported, TRL/transformers says available]} in a trainer of `recipe`, and
    package_scans / full_collections during its start-up."""
    result = run([PYTHON, "-c", CODE, str(recipe)], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
