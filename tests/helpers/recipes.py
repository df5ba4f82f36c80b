"""The one way tests and bench/ write a recipe file (imported as `helpers.recipes`).

    path = write_recipe(tmp_path, max_steps=4)                  # the GRPO smoke recipe
    path = write_recipe(tmp_path, base=SMOKE_MAXENT, maxent_tau=2.0)
    path = write_recipe(tmp_path, base=None, output_dir="o")   # only the keys given
    path = small_recipe(tmp_path, tiny_model, max_steps=8)     # smoke, small, on the tiny model

The base recipe's keys, output_dir under the folder, then `keys` (a None value drops a key).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from helpers.paths import SMOKE, SMOKE_LORA, SMOKE_MAXENT, SMOKE_VLLM

__all__ = [
    "MINIMAL",
    "ONE_THREAD",
    "SMALL",
    "SMOKE",
    "SMOKE_LORA",
    "SMOKE_MAXENT",
    "SMOKE_VLLM",
    "TWO_TRAINERS",
    "recipe_data",
    "small_recipe",
    "write_recipe",
]

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
# A short real run on CPU: few rows to load, short completions, a few steps, no checkpoint
# unless a test asks for one.
SMALL = dict(dataset_num_rows=128, max_completion_length=12, max_steps=4, save_steps=1000)
# One thread per trainer, in and out of Slurm: the launcher would otherwise share out the CPUs
# a job holds (more than this machine has), and another thread count changes float sums
# enough (1e-4 after 400 steps) to fail exact-resume comparisons.
ONE_THREAD = dict(env={"OMP_NUM_THREADS": "1"})
# Two training processes on SMOKE_VLLM (which ships one, 8 completions a process), the same
# 8 completions a step: for the tests about what two ranks do against a server.
TWO_TRAINERS = dict(num_processes=2, per_device_train_batch_size=4)


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


def small_recipe(
    folder: Path,
    tiny_model: Path | None = None,
    base: Path | None = SMOKE,
    name: str = "recipe.yaml",
    **keys,
) -> Path:
    """write_recipe with SMALL's keys and, when given, the tiny model; `keys` override both."""
    model = {"model_name_or_path": str(tiny_model)} if tiny_model else {}
    return write_recipe(folder, base, name, **{**SMALL, **model, **keys})
