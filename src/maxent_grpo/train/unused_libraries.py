"""Libraries a run does not use are marked absent in a trainer before TRL is imported.

transformers and TRL import some optional libraries at import time, whenever they are
installed, only to ask whether they are: wandb (0.5 s), peft (0.4 s: transformers' trainer
utilities import it) and vLLM, which TRL's GRPO trainer imports whole (about 5 s and 200 MiB
per process on the CI machine). Every trainer pays that at every start and requeue. A None in
sys.modules is Python's own mark of an absent module: importlib.util.find_spec answers None,
and an `import vllm` raises ModuleNotFoundError naming it.
"""

from __future__ import annotations

import sys

from maxent_grpo.recipe.needs import recipe_needs, reports_to_wandb


def unused_libraries(keys) -> list[str]:
    """The optional libraries a recipe's run never calls (keys: RecipeKeys). vLLM stays for
    generation (use_vllm) and for benchmarks, which an inline evaluation in this process runs
    with vLLM on a GPU; peft when the recipe needs it (recipe/needs.py: use_peft; a
    model that is an adapter is refused by recipe/checks.py: check_model_path)."""
    unused = []
    if not reports_to_wandb(keys.report_to):
        unused.append("wandb")
    if not keys.values.get("use_vllm") and not keys.values.get("benchmarks"):  # none: SFT
        unused.append("vllm")
    if "peft" not in {need.module for need in recipe_needs(keys.values)}:
        unused.append("peft")
    return unused


def mark_unused_libraries_absent(keys) -> None:
    """Call before TRL is imported; a library already imported stays."""
    for name in unused_libraries(keys):
        sys.modules.setdefault(name, None)
