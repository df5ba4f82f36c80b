"""The one way tests write a recipe file (imported as `helpers.recipes`).

    path = write_recipe(tmp_path, max_steps=4)                  # the GRPO smoke recipe
    path = write_recipe(tmp_path, base=SMOKE_MAXENT, maxent_tau=2.0)
    path = write_recipe(tmp_path, base=None, output_dir="o")   # only the keys given

The base recipe's keys, output_dir under the folder, then `keys` (a None value drops a key).
"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "smoke" / "config_grpo.yaml"
SMOKE_MAXENT = REPO / "recipes" / "smoke" / "config_maxent.yaml"
SMOKE_VLLM = REPO / "recipes" / "smoke" / "config_grpo_vllm.yaml"
# The few keys a small valid CPU recipe needs (write_recipe(folder, base=None, **MINIMAL)).
MINIMAL = dict(
    model_name_or_path=".cache/models/tiny-qwen2",
    dataset_name="builtin:arithmetic",
    use_cpu=True,
    bf16=False,
    num_generations=4,
    per_device_train_batch_size=4,
    report_to="none",
)


def recipe_data(folder: Path, base: Path | None = SMOKE, **keys) -> dict:
    """What write_recipe writes, as a dict."""
    data = yaml.safe_load(base.read_text()) if base else {}
    data["output_dir"] = str(Path(folder) / "out")
    data.update(keys)
    return {k: v for k, v in data.items() if v is not None}


def write_recipe(
    folder: Path, base: Path | None = SMOKE, name: str = "recipe.yaml", **keys
) -> Path:
    """A recipe file `folder/name`: see the module docstring."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(recipe_data(folder, base, **keys), sort_keys=False))
    return path
