"""The fate of each key of the upstream MaxEnt-GRPO recipes (liv-daliberti/maxent-grpo).

Decided from upstream's `src/maxent_grpo/config/grpo.py` (its GRPOConfig and
GRPOScriptArguments), `config/dataset.py` and its recipes. Plain rows, read by
recipe/migrations.py into the one table (`MIGRATIONS`); each row is
(key, action, why, target, convert, changes):

- action: as in migrations.Migration ("rename", "convert", "remove"), or "fold": the key is
  folded with others into `target` by a rule of recipe/migrate.py (evaluation -> benchmarks,
  the boxed-answer penalty -> reward_weights);
- why: what the upstream run did with it and what this run does instead, one clause;
- changes: for a key that is left out or translated with a different effect, whether the
  recipe's value changes training (listed by `migrate` under "behaviour differences");
  None: cosmetic (upstream's own caches, chunking, logging, retries).

The keys upstream shares with TRL / open-r1 (dataset_solution_column, hub_model_revision,
callbacks, ...) are rows of migrations.py already.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

ORIGIN = "upstream maxent-grpo"
_LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "0.0.0.0", "::1"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _nonzero(value: Any) -> bool:
    return _number(value) and value != 0


def _true(value: Any) -> bool:
    return value is True


def _set(value: Any) -> bool:
    return value not in (None, "", [], {}, False)


def _loss_type(value: Any) -> str:
    """grpo_loss_type -> loss_type: upstream's three aggregations are TRL's of the same name."""
    name = str(value).strip().lower()
    if name not in ("grpo", "bnpo", "dr_grpo"):
        raise ValueError(f"{value!r} is not one of upstream's grpo, bnpo, dr_grpo")
    return name


def _server_url(value: Any) -> str:
    """vllm_url (upstream's /generate endpoint) -> vllm_server_base_url (the server's root)."""
    url = urlparse(str(value).strip())
    if url.hostname in _LOCAL_HOSTS or url.hostname is None:
        raise ValueError(
            f"{value} is the server upstream's Slurm helper started beside the trainers; the "
            "launcher starts its own vLLM server and connects to it"
        )
    return f"{url.scheme or 'http'}://{url.netloc}"


_OBJECTIVES = {"grpo": "grpo", "maxent_listwise": "maxent", "maxent_entropy": "grpo"}


def _method_of_objective(value: Any) -> str:
    """objective -> method: listwise MaxEnt is method maxent; the entropy-bonus objective
    trains GRPO here (its bonus, policy_entropy_bonus_coef, is left out)."""
    name = str(value).strip().lower()
    if name not in _OBJECTIVES:
        raise ValueError(f"objective {value!r} has no counterpart (grpo or maxent_listwise)")
    return _OBJECTIVES[name]


def _method_of_flag(value: Any) -> str:
    return "grpo" if value is True else "maxent"


def _method_of_variant(value: Any) -> str:
    """maxent_objective_variant -> method: listwise weights are method maxent; the entropy
    loss is not part of this toolkit (method grpo)."""
    name = str(value).strip().lower()
    if name not in ("listwise", "entropy"):
        raise ValueError(f"maxent_objective_variant {value!r} is neither listwise nor entropy")
    return "maxent" if name == "listwise" else "grpo"


def _mixup_alpha(value: Any) -> float:
    """maxent_reference_ema_beta (the old reference's share) -> TRL's ref_model_mixup_alpha
    (the policy's share)."""
    if not _number(value) or not 0 <= value < 1:
        raise ValueError(f"an EMA beta of {value!r} is not in [0, 1)")
    return round(1 - value, 12)


def _dataset_config(value: Any) -> Any:
    """Older open-r1's dataset_configs (a list) -> dataset_config (one name)."""
    configs = value if isinstance(value, list) else [value]
    if len(configs) != 1:
        raise ValueError(
            f"{len(configs)} configurations; name each in a dataset_mixture entry instead"
        )
    return configs[0]


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

#: (key, action, why, target, convert, changes)
UPSTREAM = (
    # --- same effect under TRL's name ------------------------------------------------------
    ("gen_temperature", "rename", "TRL's sampling temperature", "temperature", None, None),
    ("gen_top_p", "rename", "TRL's nucleus sampling", "top_p", None, None),
    ("gen_top_k", "rename", "TRL's top-k (0: off, as upstream)", "top_k", None, None),
    ("vllm_top_k", "rename", "TRL's top-k (0: off)", "top_k", None, None),
    ("clip_range", "rename", "TRL's PPO clip range", "epsilon", None, None),
    ("ppo_clip_range", "rename", "TRL's PPO clip range", "epsilon", None, None),
    ("ppo_ppo_clip_range", "rename", "a misspelt ppo_clip_range", "epsilon", None, None),
    ("maxent_clip_range", "rename", "the MaxEnt loss clips with epsilon", "epsilon", None, None),
    ("clip_range_high", "rename", "TRL's upper clip range", "epsilon_high", None, None),
    ("grpo_loss_type", "convert", "TRL's loss_type", "loss_type", _loss_type, None),
    (
        "init_kl_coef",
        "rename",
        "the single-f spelling of init_kl_coeff",
        "init_kl_coeff",
        None,
        None,
    ),
    (
        "vllm_request_timeout",
        "rename",
        "seconds to wait for the vLLM server",
        "vllm_server_timeout",
        None,
        None,
    ),
    (
        "vllm_url",
        "convert",
        "a server this run does not start",
        "vllm_server_base_url",
        _server_url,
        None,
    ),
    (
        "vllm_guided_regex",
        "rename",
        "TRL's structured outputs",
        "vllm_structured_outputs_regex",
        None,
        None,
    ),
    (
        "objective",
        "convert",
        "the method: listwise MaxEnt is method maxent; maxent_entropy "
        "(GRPO plus an entropy bonus) trains GRPO",
        "method",
        _method_of_objective,
        None,
    ),
    (
        "train_grpo_objective",
        "convert",
        "true: plain GRPO (method grpo); false: MaxEnt weights (method maxent; newer upstream "
        "with maxent_objective_variant: entropy trained an entropy loss, not part of this toolkit)",
        "method",
        _method_of_flag,
        None,
    ),
    (
        "maxent_objective_variant",
        "convert",
        "listwise weights are method maxent; upstream's entropy-regularized loss is not part of "
        "this toolkit, so entropy trains GRPO",
        "method",
        _method_of_variant,
        lambda v: str(v).strip().lower() == "entropy",
    ),
    (
        "maxent_reference_ema_enabled",
        "rename",
        "upstream moved the reference towards the policy (an EMA); TRL's sync_ref_model does",
        "sync_ref_model",
        None,
        None,
    ),
    (
        "maxent_reference_ema_beta",
        "convert",
        "the old reference's share; TRL's ref_model_mixup_alpha is the policy's (1 - beta)",
        "ref_model_mixup_alpha",
        _mixup_alpha,
        None,
    ),
    (
        "maxent_reference_ema_update_interval",
        "rename",
        "steps between reference updates",
        "ref_model_sync_steps",
        None,
        None,
    ),
    (
        "dataset_configs",
        "convert",
        "older open-r1's list of configurations",
        "dataset_config",
        _dataset_config,
        None,
    ),
    # --- folded by a rule of recipe/migrate.py -----------------------------------------------
    (
        "eval_dataset_name",
        "fold",
        "upstream's evaluation set becomes a benchmark, scored at "
        "saved checkpoints (benchmark_every) instead of every eval_steps",
        "benchmarks",
        None,
        None,
    ),
    ("eval_dataset_config", "fold", "the benchmark's dataset_config", "benchmarks", None, None),
    (
        "eval_dataset_split",
        "fold",
        "the benchmark's split (upstream's default: validation)",
        "benchmarks",
        None,
        None,
    ),
    (
        "eval_dataset_prompt_column",
        "fold",
        "the benchmark's prompt_column",
        "benchmarks",
        None,
        None,
    ),
    (
        "eval_dataset_solution_column",
        "fold",
        "the benchmark's answer_column",
        "benchmarks",
        None,
        None,
    ),
    (
        "eval_reward_funcs",
        "fold",
        "the benchmark's reward (a benchmark scores pass@k with one "
        "reward: the first one of positive weight)",
        "benchmarks",
        None,
        None,
    ),
    (
        "eval_reward_weights",
        "fold",
        "picks the benchmark's reward (pass@k needs no weights)",
        "benchmarks",
        None,
        None,
    ),
    (
        "missing_boxed_answer_penalty",
        "fold",
        "the size of missing_boxed_answer_penalty_math: "
        "boxed_missing_penalty gives -1, so its weight is scaled by the penalty",
        "reward_weights",
        None,
        None,
    ),
    (
        "maxent_share_reference_model",
        "remove",
        "upstream could score the reference with the "
        "policy's weights; TRL keeps a frozen reference whenever beta > 0",
        None,
        None,
        _true,
    ),
    # --- methods this toolkit does not have ---------------------------------------------------
    (
        "policy_entropy_bonus_coef",
        "remove",
        "upstream added a policy-entropy bonus to the rewards; this run has no entropy bonus",
        None,
        None,
        _nonzero,
    ),
    (
        "maxent_alpha",
        "remove",
        "scaled upstream's extra MaxEnt term (0: plain GRPO); here "
        "method maxent always weights with it and method grpo never does",
        None,
        None,
        lambda v: _number(v) and v != 1,
    ),
    (
        "maxent_use_clip_objective",
        "remove",
        "upstream blended a clipped PPO term into the MaxEnt "
        "loss; this run's MaxEnt loss is the weighted GRPO loss",
        None,
        None,
        _true,
    ),
    (
        "maxent_clip_objective_coef",
        "remove",
        "only with maxent_use_clip_objective",
        None,
        None,
        None,
    ),
    ("maxent_clip_adv_baseline", "remove", "only with maxent_use_clip_objective", None, None, None),
    (
        "maxent_length_normalize_policy",
        "remove",
        "upstream length-normalized the policy's "
        "sequence log-probs in the weights; here only the reference's can be (maxent_length_"
        "normalize_ref)",
        None,
        None,
        _true,
    ),
    (
        "maxent_target_weight_entropy_start",
        "remove",
        "upstream annealed the entropy target; here it is constant (maxent_target_weight_entropy)",
        None,
        None,
        _set,
    ),
    (
        "maxent_target_weight_entropy_final",
        "remove",
        "see maxent_target_weight_entropy_start",
        None,
        None,
        _set,
    ),
    (
        "maxent_target_weight_entropy_horizon",
        "remove",
        "see maxent_target_weight_entropy_start",
        None,
        None,
        _nonzero,
    ),
    (
        "maxent_tau_warmup_steps",
        "remove",
        "upstream held tau during a warm-up (-1: the learning "
        "rate's); here tau adapts from the first step",
        None,
        None,
        lambda v: _number(v) and v != 0,
    ),
    (
        "maxent_reference_logprobs_source",
        "remove",
        "upstream could take the reference "
        "log-probs from vLLM or the policy (auto, policy); here the reference model scores them "
        "(upstream's model)",
        None,
        None,
        lambda v: str(v).lower() != "model",
    ),
    (
        "behavior_logprobs_source",
        "remove",
        "upstream could take the PPO ratio's old log-probs "
        "from vLLM; TRL recomputes them with the model (upstream's model)",
        None,
        None,
        lambda v: str(v).lower() in ("vllm", "metadata", "meta"),
    ),
    (
        "maxent_trl_reference_scoring",
        "remove",
        "switched upstream to TRL's reference scoring, which is the only one here",
        None,
        None,
        None,
    ),
    (
        "maxent_allow_stale_reference_logprobs",
        "remove",
        "upstream could reuse old reference "
        "log-probs after a failure; here a failed scoring stops the step",
        None,
        None,
        _true,
    ),
    (
        "maxent_allow_empty_weight_fallback",
        "remove",
        "upstream's fallback to uniform weights; the weights here are never empty",
        None,
        None,
        None,
    ),
    (
        "maxent_score_tail_tokens",
        "remove",
        "upstream scored only the last N tokens; here every completion token is scored",
        None,
        None,
        _set,
    ),
    (
        "maxent_reference_ema_warmup_steps",
        "remove",
        "upstream kept the reference fixed during a warm-up; TRL's sync_ref_model mixes from the "
        "first ref_model_sync_steps",
        None,
        None,
        _nonzero,
    ),
    *(
        (
            key,
            "remove",
            "upstream adapted maxent_alpha to the KL; its entropy term is not part of this toolkit",
            None,
            None,
            _true,
        )
        for key in (
            "maxent_alpha_lower_on_high_kl",
            "maxent_alpha_raise_on_low_kl",
            "maxent_alpha_disable_outside_trust_zone",
        )
    ),
    *(
        (
            key,
            "remove",
            "switched upstream's beta controller; here beta adapts whenever kl_target and "
            "kl_horizon are set",
            None,
            None,
            None,
        )
        for key in ("grpo_beta_controller_enabled", "maxent_beta_controller_enabled")
    ),
    (
        "truncate_completions_at_first_boxed_answer",
        "remove",
        "upstream cut each completion after its first \\boxed{} answer; here completions are "
        "scored whole",
        None,
        None,
        _true,
    ),
    ("controller_meta_enabled", "remove", _META, None, None, _true),
    *(
        (f"controller_meta_{name}", "remove", "only with controller_meta_enabled", None, None, None)
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
    (
        "controller_overwrite_from_config",
        "remove",
        "a resumed run here restores tau and beta from the checkpoint",
        None,
        None,
        _true,
    ),
    ("info_seed_enabled", "remove", _INFOSEED, None, None, _true),
    *(
        (f"info_seed_{name}", "remove", "only with info_seed_enabled", None, None, None)
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
    ("seed_grpo_enabled", "remove", _SEED_GRPO, None, None, _true),
    *(
        (f"seed_grpo_{name}", "remove", "only with seed_grpo_enabled", None, None, None)
        for name in ("alpha", "alpha_normalize_by_max_entropy", "length_normalize_logprobs")
    ),
    (
        "dr_grpo_denominator_mode",
        "remove",
        "upstream's Dr.GRPO could divide by the active "
        "tokens; TRL's dr_grpo divides by max_completion_length",
        None,
        None,
        lambda v: str(v).lower() not in ("max_completion_length", "max_length"),
    ),
    (
        "clip_delta",
        "remove",
        "upstream widened both clip bounds by it; here epsilon and epsilon_high are the bounds",
        None,
        None,
        _nonzero,
    ),
    (
        "kl_ctl_step_size",
        "remove",
        "upstream capped each beta update at this fraction; here "
        "the error is clipped to +-0.2 and scaled by the completions over kl_horizon",
        None,
        None,
        _nonzero,
    ),
    (
        "span_kl_target",
        "remove",
        "a default of upstream's script arguments that its GRPO trainers did not read",
        None,
        None,
        None,
    ),
    ("span_kl_beta0", "remove", "see span_kl_target", None, None, None),
    ("span_kl_horizon", "remove", "see span_kl_target", None, None, None),
    # --- sampling upstream's client sent and TRL does not -------------------------------------
    (
        "gen_best_of",
        "remove",
        "vLLM's best_of is gone (vLLM 0.10); every sample is kept",
        None,
        None,
        lambda v: _number(v) and v > 1,
    ),
    ("vllm_best_of", "remove", "see gen_best_of", None, None, lambda v: _number(v) and v > 1),
    *(
        (
            key,
            "remove",
            "set it in generation_kwargs ({frequency_penalty: ...} or "
            "{presence_penalty: ...}), which TRL passes to vLLM",
            None,
            None,
            _nonzero,
        )
        for key in (
            "gen_frequency_penalty",
            "gen_presence_penalty",
            "vllm_frequency_penalty",
            "vllm_presence_penalty",
        )
    ),
    (
        "vllm_stop_sequences",
        "remove",
        "upstream's server stopped at these strings; here a "
        "completion ends at the end-of-sequence token or max_completion_length (generation_kwargs: "
        "{stop: [...]} sets vLLM's stop strings)",
        None,
        None,
        _set,
    ),
    (
        "vllm_guided_json",
        "remove",
        "upstream constrained outputs to a JSON schema; TRL 1.16 has "
        "only vllm_structured_outputs_regex",
        None,
        None,
        _set,
    ),
    (
        "vllm_logit_bias",
        "remove",
        "upstream biased vLLM's logits; TRL sends no logit bias",
        None,
        None,
        _set,
    ),
    (
        "vllm_sync_weights",
        "remove",
        "upstream pushed the new weights to its server only with "
        "true; TRL syncs them before every generation",
        None,
        None,
        lambda v: v is False,
    ),
    # --- upstream's own machinery (cosmetic) --------------------------------------------------
    *(
        (key, "remove", _LOGPROBS, None, None, None)
        for key in (
            "vllm_return_logprobs",
            "vllm_request_logprobs",
            "vllm_force_logprobs",
            "vllm_logprob_fail_after",
            "vllm_logprob_fallback",
        )
    ),
    *(
        (key, "remove", _VLLM_CLIENT, None, None, None)
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
        (key, "remove", _CACHE, None, None, None)
        for key in (
            "maxent_logprob_chunk_size",
            "maxent_prompt_cache_size",
            "maxent_score_slice_prefetch",
        )
    ),
    (
        "maxent_policy_entropy",
        "remove",
        "upstream computed the policy entropy for its logs; TRL logs the entropy of every step",
        None,
        None,
        None,
    ),
    ("maxent_policy_entropy_mode", "remove", "see maxent_policy_entropy", None, None, None),
    (
        "log_like_grpo",
        "remove",
        "chose upstream's log format; the logs here are TRL's",
        None,
        None,
        None,
    ),
    (
        "disable_distributed_sampler",
        "remove",
        "worked around double sharding in upstream's own loop; TRL's sampler shards once",
        None,
        None,
        None,
    ),
    (
        "init_from_checkpoint",
        "remove",
        "a run here resumes from the last complete checkpoint in "
        "output_dir; to start from other weights, set model_name_or_path to them",
        None,
        None,
        _set,
    ),
    *(
        (key, "remove", _UPSTREAM_EVAL, None, None, None)
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
        (key, "remove", _PPO, None, None, None)
        for key in ("vf_coef", "clip_range_vf", "gamma", "gae_lambda", "horizon")
    ),
    (
        "advantage_normalization",
        "remove",
        "GRPO normalizes advantages within each group (scale_rewards)",
        None,
        None,
        None,
    ),
    (
        "reward_normalization",
        "remove",
        "GRPO normalizes rewards within each group (scale_rewards)",
        None,
        None,
        None,
    ),
    ("reward_clip", "remove", "rewards are not clipped here", None, None, _set),
    ("advantage_clip", "remove", "advantages are not clipped here", None, None, _set),
    ("log_grad_norm_after_clip", "remove", "the logs here have TRL's grad_norm", None, None, None),
    ("log_kl_per_token", "remove", "the logs here have TRL's kl", None, None, None),
)


#: Upstream keys that are keys here too, with upstream's meaning, which migrate keeps as they
#: are (the parser reads them). Each row is (key, what it does here); the docs list them.
KEPT = (
    (
        "reference_model_name_or_path",
        "the KL reference when beta > 0, instead of a frozen copy of the starting policy; "
        "its tokenizer must have the policy's vocabulary (checked before the models load)",
    ),
    ("reference_model_revision", "the hub revision of reference_model_name_or_path"),
    (
        "vllm_sync_interval_steps",
        "the weights go to the vLLM server every N optimizer steps, as upstream's; with N > 1 "
        "TRL's importance-sampling correction (required) reweights the older policy's samples",
    ),
    (
        "prompt_template",
        "upstream's named templates (r1, qwen_math, no) or a text with {prompt} (and {system}), "
        "sent as a plain-text prompt; upstream's r1 also stopped generation at </answer>, which "
        "here is vllm_stop_sequences' difference",
    ),
)
