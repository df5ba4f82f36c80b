"""The rows of keys that open-r1's recipes use (older TRL's and transformers' are in
older_trl.py).

Also: open-r1's keys that mean the same here, its defaults that differ, and its values that
have no counterpart.
"""

from __future__ import annotations

from typing import Any

from maxent_grpo.migrate.kinds import REMOVE, DefaultChange, Rows, ValueChange

OPEN_R1 = Rows("open-r1")

ROWS = (
    # --- open-r1's own keys -------------------------------------------------------------------
    OPEN_R1.alias(
        "dataset_solution_column",
        to="dataset_answer_column",
        why="open-r1's name of dataset_answer_column, read as dataset_answer_column",
    ),
    OPEN_R1.rename(
        "hub_model_revision",
        to="hub_revision",
        why="open-r1's branch to push to is transformers' hub_revision",
    ),
    OPEN_R1.remove(
        "push_to_hub_revision",
        why="switched open-r1's push callback; the Trainer pushes itself with push_to_hub: true, "
        "hub_strategy and hub_revision",
    ),
    OPEN_R1.remove(
        "overwrite_hub_revision",
        why="an option of open-r1's push callback; the Trainer commits on top of hub_revision",
    ),
    OPEN_R1.remove(
        "callbacks",
        why="named open-r1's callbacks (push_to_hub_revision); the Trainer pushes itself with "
        "push_to_hub: true, hub_strategy and hub_revision",
    ),
    OPEN_R1.rename(
        "max_completion_len",
        to="overlong_max_length",
        why="open-r1's length of soft_overlong_punishment is overlong_max_length",
    ),
    OPEN_R1.rename(
        "soft_punish_cache",
        to="overlong_buffer",
        why="open-r1's band of soft_overlong_punishment is overlong_buffer",
    ),
    OPEN_R1.remove(
        "e2b_router_url",
        why="code rewards run in the local sandbox here (code_provider: local), not on E2B",
    ),
    OPEN_R1.remove(
        "morph_router_url",
        why="code rewards run in the local sandbox here (code_provider: local), not on MorphCloud",
    ),
    OPEN_R1.remove(
        "ioi_provider",
        why="chose the IOI judge of ioi_code, which needs a network and is not available here",
    ),
    OPEN_R1.remove(
        "code_eval_scoring_mode",
        why="how open-r1's judged rewards (ioi_code, cf_code) score, and they are not "
        "available here",
    ),
    OPEN_R1.remove(
        "code_eval_test_batch_size",
        why="the local sandbox runs every test case of a row, parallel_code_exec_per_proc at a "
        "time",
    ),
)

#: Keys of open-r1's GRPO recipes that mean the same here (the parser accepts them as they
#: are; tests/test_migrate.py checks it). The docs list them next to the table.
UNCHANGED_KEYS = (
    "model_name_or_path",
    "model_revision",
    "attn_implementation",
    "dataset_name",
    "dataset_config",
    "dataset_mixture",
    "dataset_train_split",
    "dataset_test_split",
    "dataset_prompt_column",
    "system_prompt",
    "chat_template",
    "reward_funcs",
    "reward_weights",
    "cosine_min_value_wrong",
    "cosine_max_value_wrong",
    "cosine_min_value_correct",
    "cosine_max_value_correct",
    "cosine_max_len",
    "repetition_n_grams",
    "repetition_max_penalty",
    "code_provider",
    "code_language",
    "parallel_code_exec_per_proc",
    "bf16",
    "use_vllm",
    "vllm_mode",
    "vllm_server_timeout",
    "vllm_tensor_parallel_size",
    "beta",
    "loss_type",
    "scale_rewards",
    "epsilon",
    "epsilon_high",
    "mask_truncated_completions",
    "num_iterations",
    "num_generations",
    "temperature",
    "max_completion_length",
    "do_eval",
    "eval_strategy",
    "eval_steps",
    "per_device_eval_batch_size",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "max_grad_norm",
    "max_steps",
    "num_train_epochs",
    "seed",
    "output_dir",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "log_completions",
    "num_completions_to_print",
    "log_level",
    "logging_first_step",
    "logging_steps",
    "logging_strategy",
    "report_to",
    "wandb_entity",
    "wandb_project",
    "wandb_run_group",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
)

DEFAULT_CHANGES = (
    DefaultChange(
        "vllm_mode",
        "server",
        "use_vllm: true",
        "open-r1 ran vLLM on a GPU of its own; TRL 1.0 made colocate the default, where every "
        "GPU trains and also runs vLLM",
        lambda recipe: recipe.get("use_vllm") is True,
    ),
    DefaultChange(
        "dataset_prompt_column",
        "prompt",
        "a dataset is named (not builtin:)",
        "open-r1's default prompt column is prompt; here it is problem",
        lambda recipe: (
            bool(recipe.get("dataset_mixture"))
            or bool(recipe.get("dataset_name"))
            and not str(recipe["dataset_name"]).startswith("builtin:")
        ),
    ),
)


def _evaluates_without_test_split(recipe: dict[str, Any]) -> bool:
    strategy = recipe.get("eval_strategy", recipe.get("evaluation_strategy", "no"))
    name = recipe.get("dataset_name")
    return (
        strategy not in (None, "no")
        and "dataset_test_split" not in recipe
        and not recipe.get("dataset_mixture")
        and isinstance(name, str)
        and not name.startswith("builtin:")
    )


DEFAULT_CHANGES += (
    DefaultChange(
        "dataset_test_split",
        "test",
        "eval_strategy is not no and a hub dataset is named",
        "open-r1 (TRL's ScriptArguments) evaluated the test split by default; here there is "
        "no test split unless one is named",
        _evaluates_without_test_split,
    ),
)

#: The built-in benchmark names a recipe's `benchmarks` may list (evaluate/benchmarks.py
#: BUILTIN_BENCHMARKS defines them; tests/test_key_declarations.py checks they agree).
BUILTIN_BENCHMARK_NAMES = ("arithmetic", "word_problems")


def _lighteval_tasks_left_out(benchmarks: Any) -> Any:
    """open-r1's benchmarks are LightEval task names; keep the entries this toolkit knows."""
    kept = [b for b in benchmarks if not isinstance(b, str) or b in BUILTIN_BENCHMARK_NAMES]
    return kept or REMOVE


def _has_unknown_benchmark(benchmarks: Any) -> bool:
    entries = benchmarks if isinstance(benchmarks, list) else []
    return any(isinstance(b, str) and b not in BUILTIN_BENCHMARK_NAMES for b in entries)


VALUE_CHANGES = (
    ValueChange(
        "code_provider",
        "e2b, morph",
        "local",
        "the tests run in the local sandbox instead of on a remote provider",
        lambda value: value in ("e2b", "morph"),
        lambda value: "local",
    ),
    ValueChange(
        "code_language",
        "anything but python",
        "left out",
        "the local sandbox runs Python programs only",
        lambda value: value != "python",
        lambda value: REMOVE,
    ),
    ValueChange(
        "benchmarks",
        "open-r1's LightEval task names (aime24, math_500, gpqa, ...)",
        "left out (the built-in names and mappings stay)",
        "open-r1 queued LightEval jobs for them; here a benchmark is a built-in name or a "
        "mapping {name, dataset, ...} (docs/evaluation.md)",
        _has_unknown_benchmark,
        _lighteval_tasks_left_out,
    ),
)
