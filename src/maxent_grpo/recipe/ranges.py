"""What TRL's and transformers' keys accept beyond their types: choices, ranges, packages.

TRL and transformers declare these keys (name, type, default, help); what we add to each is
declared once here and gathered into TRL_KEYS (recipe/declare.py Accepts). Our own keys declare
theirs in their fields (recipe/declare.py). Each entry names the library code that rejects (or
silently misuses) a value outside it; most of those checks run only once the model is loaded,
some only at the first training step. The parser enforces the choices (argparse choices,
recipe/schema.py) and `recipe.checks.check_ranges` the ranges, both when a recipe is read: on
every path, before any model is loaded. The schema (schema.json) carries both; regenerate it
after a change here.

Keys whose field type is a Literal or an Enum get their choices from the type (TrlParser).
tests/test_recipe_values.py checks that every enumerated field of GRPOConfig and ModelConfig
has choices or is in UNCHECKED.

Paths: trl/ and transformers/ are site-packages/ paths of the pinned versions (pyproject.toml).
"""

from __future__ import annotations

from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

from maxent_grpo.recipe.declare import Accepts, Package

# Choices of TRL- and transformers-owned keys. The parser enforces them like our keys' own.
TRL_CHOICES: dict[str, tuple[str, ...]] = {
    # trl/generation/vllm_generation.py: "vllm_mode must be either 'server' or 'colocate'"
    "vllm_mode": ("colocate", "server"),
    # trl/trainer/grpo_config.py help; "auto" is vLLM's own default (LLM(model_impl=)).
    "vllm_model_impl": ("vllm", "transformers", "auto"),
    # trl/trainer/grpo_trainer.py _compute_loss: "Unknown importance sampling level" (step 1)
    "importance_sampling_level": ("token", "sequence"),
    # trl/trainer/grpo_trainer.py _compute_loss: "Unknown loss type" (step 1)
    "loss_type": ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
    # trl/trainer/grpo_trainer.py _generate_and_score_completions (step 1)
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
    # trl/trainer/grpo_trainer.py: "Unknown vLLM importance sampling level" (step 1)
    "vllm_importance_sampling_mode": (
        "token_truncate",
        "token_mask",
        "sequence_truncate",
        "sequence_mask",
    ),
    # transformers/integrations/integration_utils.py get_reporting_integration_callbacks
    # (GRPOTrainer.__init__, after the model is loaded); also each entry of a list.
    "report_to": ("none", "all", *INTEGRATION_TO_CALLBACK),
    # transformers/generation/configuration_utils.py GenerationConfig.validate (step 1)
    "cache_implementation": tuple(ALL_CACHE_IMPLEMENTATIONS),
    # transformers/training_args.py help; torch.compile(mode=) raises at the first step.
    "torch_compile_mode": (
        "default",
        "reduce-overhead",
        "max-autotune",
        "max-autotune-no-cudagraphs",
    ),
    # peft/utils/peft_types.py TaskType (trl get_peft_config -> LoraConfig, before the model).
    "lora_task_type": (
        "SEQ_CLS",
        "SEQ_2_SEQ_LM",
        "CAUSAL_LM",
        "TOKEN_CLS",
        "QUESTION_ANS",
        "FEATURE_EXTRACTION",
    ),
}

# Enumerated-looking fields left without choices, and why (tests/test_recipe_values.py).
UNCHECKED: dict[str, str] = {
    "trackio_static_space_id": "a Space id, or false (the Literal[False] of its type)",
    "scale_rewards": "its converter (recipe/converters.py) checks group | batch | none | bool",
    "include_num_input_tokens_seen": "all | non_padding | no, or a bool: its bool type parses it",
    "lr_scheduler_kwargs": "a mapping, checked by the scheduler",
    "attn_implementation": "free-form: a kernel of the Hub ('kernels-community/...') is valid",
    "torch_compile_backend": "depends on the installed torch (torch._dynamo.list_backends())",
}

# Ranges of TRL- and transformers-owned keys: key -> (operator, bound) or (operator, bound,
# operator, bound) for an interval. Checked when a recipe is read (recipe.checks.check_ranges);
# None means unset.
TRL_RANGES: dict[str, tuple] = {
    # TRL GRPOConfig: vLLM tensor-parallel group size (vllm serve --tensor-parallel-size).
    "vllm_tensor_parallel_size": (">=", 1),
    # --- transformers/training_args.py (TrainingArguments) ---
    # torch.optim AdamW raises "Invalid learning rate" etc. when the optimizer is built (step 1).
    "learning_rate": (">=", 0),
    "weight_decay": (">=", 0),
    "adam_beta1": (">=", 0, "<", 1),
    "adam_beta2": (">=", 0, "<", 1),
    "adam_epsilon": (">=", 0),
    "max_grad_norm": (">=", 0),  # Trainer clips only when > 0: a negative one silently never
    "num_train_epochs": (">=", 0),
    "warmup_steps": (">=", 0),  # _validate_args
    "logging_steps": (">", 0),  # _validate_args (steps strategy); a ratio when < 1
    "save_steps": (">", 0),
    "eval_steps": (">", 0),
    "save_total_limit": (">=", 0),  # 0: keep every checkpoint (train/checkpoints.py)
    "per_device_train_batch_size": (">=", 1),
    "per_device_eval_batch_size": (">=", 1),
    "gradient_accumulation_steps": (">=", 1),
    "eval_accumulation_steps": (">=", 1),
    "dataloader_num_workers": (">=", 0),  # torch DataLoader
    "dataloader_prefetch_factor": (">=", 1),
    "torch_empty_cache_steps": (">", 0),  # _validate_args
    # transformers set_seed -> numpy.random.seed: 0 <= seed < 2**32 (GRPOTrainer.__init__).
    "seed": (">=", 0, "<", 2**32),
    "data_seed": (">=", 0, "<", 2**32),
    "ddp_timeout": (">", 0),
    # --- trl/trainer/grpo_config.py (GRPOConfig) and where grpo_trainer.py uses it ---
    "num_generations": (">=", 2),  # __post_init__: "GRPO requires at least 2 generations"
    "num_generations_eval": (">=", 1),
    "generation_batch_size": (">=", 1),
    "steps_per_generation": (">=", 1),
    "max_completion_length": (">=", 1),
    "temperature": (">", 0),  # logits / temperature in _get_per_token_logps_and_entropies
    "top_p": (">", 0, "<=", 1),  # help: "Must be in (0, 1]" (vLLM SamplingParams too)
    "top_k": (">=", 0),  # help: 0 disables top-k
    "min_p": (">=", 0, "<=", 1),  # help: "a value between 0.0 and 1.0"
    "repetition_penalty": (">", 0),  # vLLM SamplingParams / transformers' processor
    "vllm_server_port": (">=", 1, "<=", 65535),
    "vllm_group_port": (">=", 1, "<=", 65535),
    "vllm_gpu_memory_utilization": (">", 0, "<=", 1),
    "vllm_max_model_length": (">=", 1),
    "beta": (">=", 0),  # the KL coefficient
    "num_iterations": (">=", 1),
    "epsilon": (">=", 0),  # clip range [1 - epsilon, 1 + epsilon_high]
    "epsilon_high": (">=", 0),
    "sapo_temperature_neg": (">", 0),  # divides in the sapo loss
    "sapo_temperature_pos": (">", 0),
    "top_entropy_quantile": (">=", 0, "<=", 1),  # help: "Range: [0.0-1.0]"
    "ref_model_mixup_alpha": (">=", 0, "<=", 1),  # TR-DPO's alpha, a mixing weight
    "ref_model_sync_steps": (">=", 1),
    "vllm_importance_sampling_clip_min": (">=", 0),
    "vllm_importance_sampling_clip_max": (">", 0),
    "off_policy_mask_threshold": (">=", 0),
    "num_completions_to_print": (">=", 0),
    "max_tool_calling_iterations": (">=", 0),
    # --- trl/trainer/model_config.py (ModelConfig) -> peft LoraConfig ---
    "lora_r": (">=", 1),
    "lora_alpha": (">", 0),
    "lora_dropout": (">=", 0, "<", 1),
}

# Optional packages TRL-owned keys ask for (launch/requirements.py decides when).
TRL_PACKAGES: dict[str, tuple[Package, ...]] = {
    "use_vllm": (Package("vllm", "vllm", "true (colocate, or a server on a GPU)"),),
    "use_peft": (Package("peft", "peft", "true"),),
}

#: What we add to each TRL- and transformers-owned key, declared once here.
TRL_KEYS: dict[str, Accepts] = {
    name: Accepts(
        range=TRL_RANGES.get(name, ()),
        choices=TRL_CHOICES.get(name, ()),
        packages=TRL_PACKAGES.get(name, ()),
    )
    for name in {**TRL_CHOICES, **TRL_RANGES, **TRL_PACKAGES}
}
