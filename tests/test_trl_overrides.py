"""What we override or replace inside TRL and transformers is still there, as we read it.

train/trl_adapter.py is the one module that touches TRL's private members: `PRIVATE` lists
each, `READ_IN` the versions read; docs/architecture.md "Private members of TRL and
transformers" says why no public hook serves and which behaviour tests exercise each. This
test fails first, in seconds, when an upgrade renames, moves or re-signs one of them: re-read
the row, then update EXPECTED. It also fails when a module other than the adapter reaches
into TRL's private state.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import transformers
import trl
from trl import GRPOTrainer
from trl.generation import vllm_generation
from trl.trainer import grpo_trainer

from maxent_grpo.train import trl_adapter

# The versions the rows were read against (pyproject.toml pins them).
READ = {"trl": "1.16.0", "transformers": "5.17.0"}
SRC = Path(__file__).resolve().parents[1] / "src" / "maxent_grpo"
# member of GRPOTrainer (or its bases) -> its parameters, as our overrides and calls use them
EXPECTED = {
    "_save_checkpoint": ["self", "model", "trial"],
    "_save_optimizer_and_scheduler": ["self", "output_dir"],
    "_load_optimizer_and_scheduler": ["self", "checkpoint"],
    "_load_from_checkpoint": ["self", "resume_from_checkpoint", "model"],
    "_generate": ["self", "prompts"],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
    "_prepare_inputs": ["self", "generation_batch"],
    "training_step": ["self", "model", "inputs", "num_items_in_batch"],
    "_compute_loss": ["self", "model", "inputs"],
    "_get_train_sampler": ["self", "dataset"],
    "compute_loss": ["self", "model", "inputs", "return_outputs", "num_items_in_batch"],
    "get_batch_samples": ["self", "epoch_iterator", "num_batches", "device"],
    "_generate_single_turn": [
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ],
    "_tokenize_prompts": ["self", "prompts"],
}


def test_the_versions_read_are_the_ones_installed():
    assert {"trl": trl.__version__, "transformers": transformers.__version__} == READ
    assert trl_adapter.READ_IN == READ


def test_every_private_member_the_adapter_lists_is_there():
    owners = {
        "Trainer": transformers.Trainer,
        "GRPOTrainer": GRPOTrainer,
        "VLLMGeneration": vllm_generation.VLLMGeneration,
        "grpo_trainer": grpo_trainer,
    }
    init = inspect.getsource(GRPOTrainer.__init__)
    for member in trl_adapter.PRIVATE:
        owner, name = member.split(".")
        found = hasattr(owners[owner], name) or f"self.{name} =" in init  # attributes
        assert found, member


def test_each_hook_the_adapter_overrides_is_trls_and_listed():
    for hook in trl_adapter.HOOKS:
        assert hasattr(GRPOTrainer, hook), hook
        if hook.startswith("_"):
            assert any(m.endswith(f".{hook}") for m in trl_adapter.PRIVATE), hook
    assert len(trl_adapter.PRIVATE) == 19  # 23 before the adapter: see its docs row


# TRL's private state that components read or call: through the adapter's functions only.
_REACHED = re.compile(
    r"\.(_metrics|_tokenize_prompts|_last_loaded_step|_get_per_token_logps_and_entropies|"
    r"_load_from_checkpoint|_iter_named_params|_get_output_dir|_tokenizer)\b"
)


def test_no_module_but_the_adapter_reaches_into_trls_private_state():
    reached = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "trl_adapter.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _REACHED.search(line)
    ]
    assert reached == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_member_we_override_or_call_keeps_its_signature(name):
    params = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    assert params == EXPECTED[name]


def test_grpo_trainer_builds_vllm_generation_through_its_module_global():
    """train/vllm_sync.py swaps `grpo_trainer.VLLMGeneration` while GRPOTrainer.__init__ runs."""
    assert grpo_trainer.VLLMGeneration is vllm_generation.VLLMGeneration
    assert "VLLMGeneration(" in inspect.getsource(GRPOTrainer.__init__)


def test_grpo_trainer_loads_the_policy_then_the_reference_through_its_module_global():
    """train/reference_model.py swaps `grpo_trainer.create_model_from_path` while
    GRPOTrainer.__init__ runs: the first call (a model given as a path) loads the policy, the
    second the reference."""
    from trl.trainer.utils import create_model_from_path

    assert grpo_trainer.create_model_from_path is create_model_from_path
    source = inspect.getsource(GRPOTrainer.__init__)
    policy = source.index("model = create_model_from_path(model, **model_init_kwargs)")
    reference = source.index("self.ref_model = create_model_from_path(")
    assert policy < reference and source.count("create_model_from_path(") == 2


def test_vllm_generation_keeps_what_our_subclasses_use():
    """train/vllm_connect.py defers `_init_vllm`; train/vllm_sync.py calls these."""
    cls = vllm_generation.VLLMGeneration
    for name in ("_init_vllm", "sync_weights", "_iter_named_params"):
        assert callable(getattr(cls, name, None)), name
    assert "self.vllm_client =" in inspect.getsource(cls._init_vllm)


def test_grpo_trainer_keeps_the_metrics_we_read_and_write():
    """train/adaptive_kl.py reads `_metrics[mode]["kl"]` (through the adapter); the other
    components write to it."""
    source = inspect.getsource(GRPOTrainer)
    assert 'self._metrics[mode]["kl"]' in source
    assert "self._metrics = {" in source


def test_grpo_trainer_keeps_what_the_rollout_rounds_rely_on():
    """train/rollout_rounds.py: `_prepare_inputs` generates once per generation batch through
    `_generate_and_score_completions` and splits its output; the rounds read the reward
    weights, EOS ids and tokenizer (the processing class), and replace the reward metrics of
    the trained groups; a skipped step drops the gradients in `on_pre_optimizer_step`."""
    source = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "self._generate_and_score_completions(generation_batch)" in source
    assert "split_tensor_dict(generation_batch, self.args.steps_per_generation)" in source
    init = inspect.getsource(GRPOTrainer.__init__)
    for attribute in ("self.reward_weights", "self.eos_token_ids", "self.processing_class"):
        assert attribute in init, attribute
    scoring = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for metric in ("reward", "reward_std", "frac_reward_zero_std"):
        assert f'self._metrics[mode]["{metric}"]' in scoring, metric
    epoch = inspect.getsource(transformers.Trainer._run_epoch)
    assert epoch.index("on_pre_optimizer_step") < epoch.index("self.optimizer.step()")
