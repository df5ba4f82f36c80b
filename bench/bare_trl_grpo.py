"""A bare TRL GRPO run of a smoke recipe: the baseline of bench/bench_overhead.py.

    python bench/bare_trl_grpo.py --config recipes/smoke/config_grpo.yaml [--output_dir D]
    accelerate launch --num_processes 2 ... bench/bare_trl_grpo.py --config ...

Plain `trl.GRPOConfig` and `trl.GRPOTrainer`, as a TRL user would write it: no recipe checks,
no launcher, no complete-checkpoint markers, no stop callback, no reward guard. It reads the
same recipe YAML so that the settings cannot drift from ours: every key that is a
`trl.GRPOConfig` field goes to GRPOConfig as is; the few others (model, dtype, data, rewards)
are used the way src/grpo.py uses them. Borrowed from the toolkit, because they are the
workload and not the overhead: the built-in dataset rows (`maxent_grpo.data.builtin_dataset`)
and the reward functions (`maxent_grpo.rewards`, unguarded).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import trl
import yaml
from transformers import AutoTokenizer

from maxent_grpo.data import builtin_dataset
from maxent_grpo.rewards import get_reward_funcs
from maxent_grpo.timers import timed


class TimedSaves(trl.GRPOTrainer):
    """TRL's trainer, its checkpoint saves timed into the timer ours records them in
    ("checkpoint_save", maxent_grpo/timers.py), for bench/bench_overhead.py's comparison."""

    def _save_checkpoint(self, model, trial):
        with timed("checkpoint_save"):
            return super()._save_checkpoint(model, trial)


# Recipe keys that are not GRPOConfig fields, and what this script does with them.
OWN_KEYS = {
    "model_name_or_path",
    "dtype",
    "dataset_name",
    "dataset_num_rows",
    "dataset_seed",
    "dataset_prompt_column",
    "dataset_answer_column",
    "system_prompt",
    "reward_funcs",
    "overlong_max_length",
    "overlong_buffer",
    "repetition_n_grams",
    "repetition_max_penalty",
}


def build_dataset(recipe: dict):
    name = recipe["dataset_name"]
    if not name.startswith("builtin:"):
        sys.exit(f"bare_trl_grpo.py only runs built-in datasets, not {name!r}")
    rows = builtin_dataset(
        name.removeprefix("builtin:"),
        num_rows=recipe.get("dataset_num_rows", 4096),
        seed=recipe.get("dataset_seed", 0),
    )
    prompt_column = recipe.get("dataset_prompt_column", "problem")
    answer_column = recipe.get("dataset_answer_column", "solution")
    system = recipe.get("system_prompt")

    def to_prompt(row):
        prompt = [{"role": "user", "content": row[prompt_column]}]
        if system:
            prompt.insert(0, {"role": "system", "content": system})
        return {"prompt": prompt, "solution": str(row[answer_column])}

    return rows.map(to_prompt, remove_columns=rows.column_names)


def reward_settings(recipe: dict) -> dict:
    max_length = recipe.get("overlong_max_length") or recipe.get("max_completion_length", 256)
    settings = {"overlong_max_length": max_length}
    for key in ("overlong_buffer", "repetition_n_grams", "repetition_max_penalty"):
        if key in recipe:
            settings[key] = recipe[key]
    settings["overlong_buffer"] = min(settings.get("overlong_buffer", 256), max_length)
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="recipe YAML (a smoke recipe)")
    parser.add_argument("--output_dir", default=None, help="overrides the recipe's output_dir")
    parser.add_argument("--max_steps", type=int, default=None, help="overrides max_steps")
    args = parser.parse_args(argv)

    with open(args.config) as handle:
        recipe = yaml.safe_load(handle)
    if args.output_dir:
        recipe["output_dir"] = args.output_dir
    if args.max_steps:
        recipe["max_steps"] = args.max_steps
    grpo_fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    unknown = sorted(set(recipe) - grpo_fields - OWN_KEYS)
    if unknown:
        sys.exit(f"bare_trl_grpo.py: recipe keys it cannot reproduce: {', '.join(unknown)}")

    config_kwargs = {k: v for k, v in recipe.items() if k in grpo_fields}
    config_kwargs["model_init_kwargs"] = {
        "dtype": recipe.get("dtype", "auto"),
        **(config_kwargs.get("model_init_kwargs") or {}),
    }
    config = trl.GRPOConfig(**config_kwargs)

    model = recipe["model_name_or_path"]
    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    trainer = TimedSaves(
        model=model,
        reward_funcs=get_reward_funcs(recipe["reward_funcs"], **reward_settings(recipe)),
        args=config,
        train_dataset=build_dataset(recipe),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(config.output_dir)
    trainer.save_state()
    return 0


if __name__ == "__main__":
    sys.exit(main())
