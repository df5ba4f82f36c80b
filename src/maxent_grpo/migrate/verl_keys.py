"""verl's keys: the defaults migrate reads them with (verl's ppo_trainer.yaml) and the fate of
each key it does not map, with what then differs.

Units (verl counts prompts where TRL counts completions): data.train_batch_size and
actor.ppo_mini_batch_size are prompts (x rollout.n completions); ppo_micro_batch_size_per_gpu
is completions per GPU per forward; with use_dynamic_bsz it is ppo_max_token_len_per_gpu
tokens instead. verl colocates generation and training on every GPU.
"""

from __future__ import annotations

ACTOR = "actor_rollout_ref.actor."
ROLLOUT = "actor_rollout_ref.rollout."
MODEL = "actor_rollout_ref.model."

#: verl's defaults of the keys migrate maps (a key the source leaves out means these).
DEFAULTS = {
    "algorithm.adv_estimator": "gae",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.prompt_key": "prompt",
    "data.shuffle": True,
    ACTOR + "ppo_mini_batch_size": 256,
    ACTOR + "ppo_epochs": 1,
    ACTOR + "use_dynamic_bsz": False,
    ACTOR + "ppo_max_token_len_per_gpu": 16384,
    ACTOR + "clip_ratio": 0.2,
    ACTOR + "clip_ratio_c": 3.0,
    ACTOR + "loss_agg_mode": "token-mean",
    ACTOR + "entropy_coeff": 0.0,
    ACTOR + "use_kl_loss": False,
    ACTOR + "kl_loss_coef": 0.001,
    ACTOR + "kl_loss_type": "low_var_kl",
    ACTOR + "optim.lr": 1e-6,
    ACTOR + "optim.lr_warmup_steps": -1,
    ACTOR + "optim.lr_warmup_steps_ratio": 0.0,
    ACTOR + "optim.lr_scheduler_type": "constant",
    ACTOR + "optim.min_lr_ratio": 0.0,
    ACTOR + "optim.weight_decay": 0.01,
    ACTOR + "optim.clip_grad": 1.0,
    ROLLOUT + "n": 1,
    ROLLOUT + "temperature": 1.0,
    ROLLOUT + "top_p": 1.0,
    ROLLOUT + "top_k": -1,
    ROLLOUT + "gpu_memory_utilization": 0.5,
    ROLLOUT + "tensor_model_parallel_size": 2,
    ROLLOUT + "name": "vllm",
    MODEL + "lora_rank": 0,
    MODEL + "lora_alpha": 16,
    MODEL + "target_modules": "all-linear",
    MODEL + "enable_gradient_checkpointing": True,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "trainer.total_epochs": 30,
    "trainer.save_freq": -1,
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
}

_MEMORY = "memory and speed only: TRL and accelerate manage their own (FSDP or DeepSpeed: name a "
_MEMORY += "file in accelerate_config, e.g. recipes/accelerate_configs/zero3.yaml)"
_REF = "the reference model's log-probs: TRL computes them in its own batches"
_VLLM = "a vLLM engine setting TRL sets itself when it colocates vLLM"

#: The keys (or prefixes, ending in ".") left out, with what then differs, and whether that
#: changes training (then it is listed under behaviour differences).
LEFT_OUT: dict[str, tuple[str, bool]] = {
    "data.filter_overlong_prompts": (
        "verl drops prompts longer than max_prompt_length; TRL truncates none: "
        "vllm_max_model_length bounds prompt + completion (drop long rows from the data)",
        False,
    ),
    "data.truncation": ("prompts are not truncated here (see filter_overlong_prompts)", False),
    "data.return_raw_chat": ("the chat template is applied by TRL", False),
    "data.val_files": (
        "verl validates every test_freq steps; here the validation files are not read: add "
        "benchmarks: entries with these files to score checkpoints (docs/evaluation.md)",
        True,
    ),
    "data.val_batch_size": ("no validation during training (see data.val_files)", False),
    "data.dataloader_num_workers": ("data loading speed only", False),
    "data.seed": ("seed below sets the data order", False),
    "trainer.test_freq": ("no validation during training (see data.val_files)", True),
    "trainer.val_before_train": ("no validation during training (see data.val_files)", False),
    "trainer.critic_warmup": ("GRPO has no critic", False),
    "trainer.logger": ("report_to says where metrics go", False),
    "trainer.balance_batch": ("sequence-length balancing across GPUs: speed only", False),
    "trainer.resume_mode": ("a run resumes from its last complete checkpoint", False),
    "trainer.device": ("the plan decides the device", False),
    "trainer.max_actor_ckpt_to_keep": ("save_total_limit keeps checkpoints here", False),
    ACTOR + "ppo_micro_batch_size_per_gpu": ("read as the largest per-device batch", False),
    ACTOR + "ppo_max_token_len_per_gpu": ("read as the largest per-device batch", False),
    ACTOR + "use_dynamic_bsz": ("read as the largest per-device batch", False),
    ACTOR + "fsdp_config.": (_MEMORY, False),
    ACTOR + "strategy": (_MEMORY, False),
    ACTOR + "ulysses_sequence_parallel_size": (_MEMORY, False),
    ACTOR + "use_torch_compile": ("speed only", False),
    ACTOR + "checkpoint.": ("checkpoints here are complete Trainer checkpoints", False),
    ACTOR + "shuffle": ("TRL shuffles each generation batch", False),
    ACTOR + "policy_loss.loss_mode": ("vanilla PPO clipping, TRL's loss", False),
    "actor_rollout_ref.ref.": (_REF, False),
    "actor_rollout_ref.hybrid_engine": (
        "vllm_mode: colocate: the same GPUs train and generate",
        False,
    ),
    ROLLOUT + "log_prob_micro_batch_size_per_gpu": (_REF, False),
    ROLLOUT + "log_prob_max_token_len_per_gpu": (_REF, False),
    ROLLOUT + "mode": ("TRL generates each batch with the colocated engine", False),
    ROLLOUT + "multi_turn.": ("multi-turn rollouts: single-turn here (tools: docs/tools.md)", True),
    ROLLOUT + "load_format": (_VLLM, False),
    ROLLOUT + "layered_summon": (_VLLM, False),
    ROLLOUT + "enforce_eager": (_VLLM, False),
    ROLLOUT + "free_cache_engine": (_VLLM, False),
    ROLLOUT + "max_num_batched_tokens": (_VLLM, False),
    ROLLOUT + "max_num_seqs": (_VLLM, False),
    ROLLOUT + "enable_chunked_prefill": (_VLLM, False),
    ROLLOUT + "enable_prefix_caching": (_VLLM, False),
    ROLLOUT + "dtype": ("the model's dtype: bf16 below", False),
    ROLLOUT + "val_kwargs.": ("no validation during training (see data.val_files)", False),
    MODEL + "use_remove_padding": ("padding-free batches: speed and memory only", False),
    MODEL + "use_shm": ("loading speed only", False),
    MODEL + "use_liger": ("kernels: speed only", False),
    MODEL + "use_fused_kernels": ("kernels: speed only", False),
    MODEL + "trust_remote_code": ("TRL's trust_remote_code: set it if the model needs it", False),
    "critic.": ("GRPO has no critic (verl's GRPO does not use it either)", False),
    "global_profiler.": ("profiling only", False),
    "ray_kwargs.": ("Ray is not used: the launcher starts the processes", False),
    "ray_init.": ("Ray is not used: the launcher starts the processes", False),
}


def fate(key: str) -> tuple[str, bool] | None:
    """The fate of a key left out (its own row, else its prefix's), or None."""
    if key in LEFT_OUT:
        return LEFT_OUT[key]
    prefixes = [p for p in LEFT_OUT if p.endswith(".") and key.startswith(p)]
    return LEFT_OUT[max(prefixes, key=len)] if prefixes else None
