"""The fate of each key of the upstream MaxEnt-GRPO recipes (liv-daliberti/maxent-grpo).

Decided from upstream's `src/maxent_grpo/config/grpo.py` (its GRPOConfig and
GRPOScriptArguments), `config/dataset.py` and its recipes. Each row says, with keywords, what
the key becomes (kinds.py Rows):

- rename / convert (`by` converts the value; ValueError: no counterpart) / remove / fold (folded
  with others into `into` by a rule of migrate/rules.py: evaluation -> benchmarks, the
  boxed-answer penalty -> reward_weights);
- why: what the upstream run did with it and what this run does instead, one clause;
- changes: for a key that is left out or translated with a different effect, whether the
  recipe's value changes training (listed by `migrate` under "behaviour differences"); unset:
  cosmetic (upstream's own caches, chunking, logging, retries).

The keys upstream shares with TRL / open-r1 (dataset_solution_column, hub_model_revision,
callbacks, ...) are rows of open_r1.py already.
"""

from __future__ import annotations

from typing import Any

from maxent_grpo.migrate.kinds import Rows, is_number
from maxent_grpo.migrate.upstream_values import (
    dataset_config,
    loss_type,
    method_of_flag,
    method_of_objective,
    method_of_variant,
    mixup_alpha,
    server_url,
)

ORIGIN = "upstream maxent-grpo"
UP = Rows(ORIGIN)


def _nonzero(value: Any) -> bool:
    return is_number(value) and value != 0


def _true(value: Any) -> bool:
    return value is True


def _set(value: Any) -> bool:
    return value not in (None, "", [], {}, False)


_CACHE = "an upstream memory/speed knob of its own scoring loop; TRL scores in its own batches"
_VLLM_CLIENT = (
    "tuned upstream's own HTTP client of vLLM; TRL's client asks the launcher's server for "
    "exactly num_generations completions"
)
_LOGPROBS = (
    "asked upstream's vLLM server for log-probs; TRL recomputes them with the model "
    "(vllm_importance_sampling_correction corrects for the difference)"
)
_META = "upstream's tau/beta meta-controller is not part of this toolkit; tau and beta follow "
_META += "maxent_target_weight_entropy and kl_target"
_INFOSEED = "upstream's InfoSeed auxiliary loss is not part of this toolkit"
_SEED_GRPO = "upstream's SEED-GRPO advantage scaling is not part of this toolkit; plain GRPO "
_SEED_GRPO += "advantages are used"
_UPSTREAM_EVAL = "upstream's own evaluation harness; here benchmarks score saved checkpoints"
_PPO = "a PPO critic/GAE setting: GRPO has no value function; upstream's trainer had none either"

ROWS = (
    # --- same effect under TRL's name ------------------------------------------------------
    UP.rename("gen_temperature", to="temperature", why="TRL's sampling temperature"),
    UP.rename("gen_top_p", to="top_p", why="TRL's nucleus sampling"),
    UP.rename("clip_range", to="epsilon", why="TRL's PPO clip range"),
    UP.rename("ppo_clip_range", to="epsilon", why="TRL's PPO clip range"),
    UP.rename("ppo_ppo_clip_range", to="epsilon", why="a misspelt ppo_clip_range"),
    UP.rename("maxent_clip_range", to="epsilon", why="the MaxEnt loss clips with epsilon"),
    UP.rename("clip_range_high", to="epsilon_high", why="TRL's upper clip range"),
    UP.convert("grpo_loss_type", to="loss_type", by=loss_type, why="TRL's loss_type"),
    UP.rename("init_kl_coef", to="init_kl_coeff", why="the single-f spelling of init_kl_coeff"),
    UP.rename(
        "vllm_request_timeout", to="vllm_server_timeout", why="seconds to wait for the vLLM server"
    ),
    UP.convert(
        "vllm_url",
        to="vllm_server_base_url",
        by=server_url,
        why="a server this run does not start",
    ),
    UP.rename(
        "vllm_guided_regex", to="vllm_structured_outputs_regex", why="TRL's structured outputs"
    ),
    UP.convert(
        "objective",
        to="method",
        by=method_of_objective,
        why="the method: listwise MaxEnt is method maxent; maxent_entropy and "
        "grpo_entropy_bonus train GRPO with TRL's entropy bonus (entropy_coef)",
    ),
    UP.convert(
        "train_grpo_objective",
        to="method",
        by=method_of_flag,
        why="true: plain GRPO (method grpo); false: MaxEnt weights (method maxent; newer upstream "
        "with maxent_objective_variant: entropy trained an entropy loss, not part of this toolkit)",
    ),
    UP.convert(
        "maxent_objective_variant",
        to="method",
        by=method_of_variant,
        why="listwise weights are method maxent; upstream's entropy-regularized loss is GRPO "
        "with TRL's entropy bonus (entropy_coef)",
    ),
    UP.rename(
        "maxent_reference_ema_enabled",
        to="sync_ref_model",
        why="upstream moved the reference towards the policy (an EMA); TRL's sync_ref_model does",
    ),
    UP.convert(
        "maxent_reference_ema_beta",
        to="ref_model_mixup_alpha",
        by=mixup_alpha,
        why="the old reference's share; TRL's ref_model_mixup_alpha is the policy's (1 - beta)",
    ),
    UP.rename(
        "maxent_reference_ema_update_interval",
        to="ref_model_sync_steps",
        why="steps between reference updates",
    ),
    UP.convert(
        "dataset_configs",
        to="dataset_config",
        by=dataset_config,
        why="older open-r1's list of configurations",
    ),
    # --- folded by a rule of migrate/rules.py --------------------------------------
    UP.fold(
        "eval_dataset_name",
        into="benchmarks",
        why="upstream's evaluation set becomes a benchmark, scored at "
        "saved checkpoints (benchmark_every) instead of every eval_steps",
    ),
    UP.fold("eval_dataset_config", into="benchmarks", why="the benchmark's dataset_config"),
    UP.fold(
        "eval_dataset_split",
        into="benchmarks",
        why="the benchmark's split (upstream's default: validation)",
    ),
    UP.fold("eval_dataset_prompt_column", into="benchmarks", why="the benchmark's prompt_column"),
    UP.fold("eval_dataset_solution_column", into="benchmarks", why="the benchmark's answer_column"),
    UP.fold(
        "eval_reward_funcs",
        into="benchmarks",
        why="the benchmark's reward (a benchmark scores pass@k with one "
        "reward: the first one of positive weight)",
    ),
    UP.fold(
        "eval_reward_weights",
        into="benchmarks",
        why="picks the benchmark's reward (pass@k needs no weights)",
    ),
    UP.fold(
        "missing_boxed_answer_penalty",
        into="reward_weights",
        why="the size of missing_boxed_answer_penalty_math: "
        "boxed_missing_penalty gives -1, so its weight is scaled by the penalty",
    ),
    UP.remove(
        "maxent_share_reference_model",
        why="upstream could score the reference with the "
        "policy's weights; TRL keeps a frozen reference whenever beta > 0",
        changes=_true,
    ),
    # --- methods this toolkit does not have ---------------------------------------------------
    UP.remove(
        "policy_entropy_bonus_coef",
        why="only with upstream's GRPO objective, where it becomes entropy_coef; this "
        "objective has no entropy bonus",
        changes=_nonzero,
    ),
    UP.remove(
        "maxent_alpha",
        why="scaled upstream's extra MaxEnt term (0: plain GRPO; with objective "
        "maxent_entropy it becomes entropy_coef); here method maxent always weights with it",
        changes=lambda v: is_number(v) and v != 1,
    ),
    UP.remove(
        "maxent_use_clip_objective",
        why="upstream blended a clipped PPO term into the MaxEnt "
        "loss; this run's MaxEnt loss is the weighted GRPO loss",
        changes=_true,
    ),
    UP.remove("maxent_clip_objective_coef", why="only with maxent_use_clip_objective"),
    UP.remove("maxent_clip_adv_baseline", why="only with maxent_use_clip_objective"),
    UP.remove(
        "maxent_length_normalize_policy",
        why="upstream length-normalized the policy's "
        "sequence log-probs in the weights; here only the reference's can be (maxent_length_"
        "normalize_ref)",
        changes=_true,
    ),
    UP.remove(
        "maxent_target_weight_entropy_start",
        why="upstream annealed the entropy target; here it is constant "
        "(maxent_target_weight_entropy)",
        changes=_set,
    ),
    UP.remove(
        "maxent_target_weight_entropy_final",
        why="see maxent_target_weight_entropy_start",
        changes=_set,
    ),
    UP.remove(
        "maxent_target_weight_entropy_horizon",
        why="see maxent_target_weight_entropy_start",
        changes=_nonzero,
    ),
    UP.remove(
        "maxent_tau_warmup_steps",
        why="upstream held tau during a warm-up (-1: the learning "
        "rate's); here tau adapts from the first step",
        changes=lambda v: is_number(v) and v != 0,
    ),
    UP.remove(
        "maxent_reference_logprobs_source",
        why="upstream could take the reference "
        "log-probs from vLLM or the policy (auto, policy); here the reference model scores them "
        "(upstream's model)",
        changes=lambda v: str(v).lower() != "model",
    ),
    UP.remove(
        "behavior_logprobs_source",
        why="upstream could take the PPO ratio's old log-probs "
        "from vLLM; TRL recomputes them with the model (upstream's model)",
        changes=lambda v: str(v).lower() in ("vllm", "metadata", "meta"),
    ),
    UP.remove(
        "maxent_trl_reference_scoring",
        why="switched upstream to TRL's reference scoring, which is the only one here",
    ),
    UP.remove(
        "maxent_allow_stale_reference_logprobs",
        why="upstream could reuse old reference "
        "log-probs after a failure; here a failed scoring stops the step",
        changes=_true,
    ),
    UP.remove(
        "maxent_allow_empty_weight_fallback",
        why="upstream's fallback to uniform weights; the weights here are never empty",
    ),
    UP.remove(
        "maxent_score_tail_tokens",
        why="upstream scored only the last N tokens; here every completion token is scored",
        changes=_set,
    ),
    UP.remove(
        "maxent_reference_ema_warmup_steps",
        why="upstream kept the reference fixed during a warm-up; TRL's sync_ref_model mixes "
        "from the "
        "first ref_model_sync_steps",
        changes=_nonzero,
    ),
    *(
        UP.remove(
            key,
            why="upstream adapted maxent_alpha to the KL; with objective maxent_entropy it "
            "becomes the entropy_kl_* keys, without it there is no entropy term to adapt",
            changes=_true,
        )
        for key in (
            "maxent_alpha_lower_on_high_kl",
            "maxent_alpha_raise_on_low_kl",
            "maxent_alpha_disable_outside_trust_zone",
        )
    ),
    *(
        UP.remove(key, why="only with maxent_alpha_raise_on_low_kl or its siblings")
        for key in (
            "maxent_alpha_kl_threshold",
            "maxent_alpha_kl_gain",
            "maxent_alpha_kl_min_multiplier",
            "maxent_alpha_kl_max_multiplier",
        )
    ),
    *(
        UP.remove(
            key,
            why="switched upstream's beta controller; here beta adapts whenever kl_target and "
            "kl_horizon are set",
        )
        for key in ("grpo_beta_controller_enabled", "maxent_beta_controller_enabled")
    ),
    UP.remove(
        "truncate_completions_at_first_boxed_answer",
        why="upstream cut each completion after its first \\boxed{} answer; here completions are "
        "scored whole",
        changes=_true,
    ),
    UP.remove("controller_meta_enabled", why=_META, changes=_true),
    *(
        UP.remove(f"controller_meta_{name}", why="only with controller_meta_enabled")
        for name in (
            "method",
            "lr",
            "tau_lr",
            "beta_lr",
            "beta_grad_clip",
            "update_interval",
            "objective",
            "analytic_steps",
            "optimizer",
            "truncation_steps",
            "use_hessian",
        )
    ),
    UP.remove(
        "controller_overwrite_from_config",
        why="a resumed run here restores tau and beta from the checkpoint",
        changes=_true,
    ),
    UP.remove("info_seed_enabled", why=_INFOSEED, changes=_true),
    *(
        UP.remove(f"info_seed_{name}", why="only with info_seed_enabled")
        for name in (
            "num_seeds",
            "lambda",
            "temperature",
            "alpha_entropy",
            "prompt_template",
            "loss_type",
            "pooling",
        )
    ),
    UP.remove("seed_grpo_enabled", why=_SEED_GRPO, changes=_true),
    *(
        UP.remove(f"seed_grpo_{name}", why="only with seed_grpo_enabled")
        for name in ("alpha", "alpha_normalize_by_max_entropy", "length_normalize_logprobs")
    ),
    UP.remove(
        "dr_grpo_denominator_mode",
        why="upstream's Dr.GRPO could divide by the active "
        "tokens; TRL's dr_grpo divides by max_completion_length",
        changes=lambda v: str(v).lower() not in ("max_completion_length", "max_length"),
    ),
    UP.remove(
        "clip_delta",
        why="upstream widened both clip bounds by it; here epsilon and epsilon_high are the bounds",
        changes=_nonzero,
    ),
    UP.remove(
        "kl_ctl_step_size",
        why="upstream capped each beta update at this fraction; here "
        "the error is clipped to +-0.2 and scaled by the completions over kl_horizon",
        changes=_nonzero,
    ),
    UP.remove(
        "span_kl_target",
        why="a default of upstream's script arguments that its GRPO trainers did not read",
    ),
    UP.remove("span_kl_beta0", why="see span_kl_target"),
    UP.remove("span_kl_horizon", why="see span_kl_target"),
    # --- sampling upstream's client sent and TRL does not -------------------------------------
    UP.remove(
        "gen_best_of",
        why="vLLM's best_of is gone (vLLM 0.10); every sample is kept",
        changes=lambda v: is_number(v) and v > 1,
    ),
    UP.remove("vllm_best_of", why="see gen_best_of", changes=lambda v: is_number(v) and v > 1),
    *(
        UP.remove(
            key,
            why="set it in generation_kwargs ({frequency_penalty: ...} or "
            "{presence_penalty: ...}), which TRL passes to vLLM",
            changes=_nonzero,
        )
        for key in (
            "gen_frequency_penalty",
            "gen_presence_penalty",
            "vllm_frequency_penalty",
            "vllm_presence_penalty",
        )
    ),
    UP.remove(
        "vllm_stop_sequences",
        why="upstream's server stopped at these strings; here a "
        "completion ends at the end-of-sequence token or max_completion_length (generation_kwargs: "
        "{stop: [...]} sets vLLM's stop strings)",
        changes=_set,
    ),
    UP.remove(
        "vllm_guided_json",
        why="upstream constrained outputs to a JSON schema; TRL 1.16 has "
        "only vllm_structured_outputs_regex",
        changes=_set,
    ),
    UP.remove(
        "vllm_logit_bias",
        why="upstream biased vLLM's logits; TRL sends no logit bias",
        changes=_set,
    ),
    UP.remove(
        "vllm_sync_weights",
        why="upstream pushed the new weights to its server only with "
        "true; TRL syncs them before every generation",
        changes=lambda v: v is False,
    ),
    # --- upstream's own machinery (cosmetic) --------------------------------------------------
    *(
        UP.remove(key, why=_LOGPROBS)
        for key in (
            "vllm_return_logprobs",
            "vllm_request_logprobs",
            "vllm_force_logprobs",
            "vllm_logprob_fail_after",
            "vllm_logprob_fallback",
        )
    ),
    *(
        UP.remove(key, why=_VLLM_CLIENT)
        for key in (
            "vllm_max_completion_rounds",
            "vllm_rounds_cfg",
            "vllm_retry_sleep",
            "vllm_backfill_with_model",
            "vllm_backfill_local",
            "vllm_max_retries",
            "vllm_backoff",
            "vllm_request_id_prefix",
            "vllm_client_tag_fail_fast",
        )
    ),
    *(
        UP.remove(key, why=_CACHE)
        for key in (
            "maxent_logprob_chunk_size",
            "maxent_prompt_cache_size",
            "maxent_score_slice_prefetch",
        )
    ),
    UP.remove(
        "maxent_policy_entropy",
        why="upstream computed the policy entropy for its logs; TRL logs the entropy of every step",
    ),
    UP.remove("maxent_policy_entropy_mode", why="see maxent_policy_entropy"),
    UP.remove("log_like_grpo", why="chose upstream's log format; the logs here are TRL's"),
    UP.remove(
        "disable_distributed_sampler",
        why="worked around double sharding in upstream's own loop; TRL's sampler shards once",
    ),
    UP.remove(
        "init_from_checkpoint",
        why="a run here resumes from the last complete checkpoint in "
        "output_dir; to start from other weights, set model_name_or_path to them",
        changes=_set,
    ),
    *(
        UP.remove(key, why=_UPSTREAM_EVAL)
        for key in (
            "eval_before_train",
            "seed_paper_eval_enabled",
            "seed_paper_eval_fail_on_error",
            "seed_paper_eval_template",
            "greedy_eval_enabled",
            "eval_greedy_only_enabled",
            "final_model_save_enabled",
        )
    ),
    # --- PPO-style keys of older recipes ------------------------------------------------------
    *(
        UP.remove(key, why=_PPO)
        for key in ("vf_coef", "clip_range_vf", "gamma", "gae_lambda", "horizon")
    ),
    UP.remove(
        "advantage_normalization",
        why="GRPO normalizes advantages within each group (scale_rewards)",
    ),
    UP.remove(
        "reward_normalization", why="GRPO normalizes rewards within each group (scale_rewards)"
    ),
    UP.remove("reward_clip", why="rewards are not clipped here", changes=_set),
    UP.remove("advantage_clip", why="advantages are not clipped here", changes=_set),
    UP.remove("log_grad_norm_after_clip", why="the logs here have TRL's grad_norm"),
    UP.remove("log_kl_per_token", why="the logs here have TRL's kl"),
)
