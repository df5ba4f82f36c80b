"""The one place that touches TRL's and transformers' private members.

Our trainers (train/grpo_trainer.py, maxent/trainer.py, train/sft_trainer.py) are each one
class of ours, `HookedTrainer`, over TRL's class. `HookedTrainer` overrides every TRL hook we
need exactly once and, inside it, calls the trainer's components (train/components.py) in
their one order: each component that implements the hook gets the call and `call`, the rest
of the chain (the next component's, TRL's last). Components are plain classes; what they read
of TRL's private state they read through the functions below. Everything private we use is in
`PRIVATE`, read in the versions of `READ_IN` (pyproject.toml pins them);
tests/test_trl_overrides.py checks that each is still there, as read.
"""

from __future__ import annotations

import functools

READ_IN = {"trl": "1.16.0", "transformers": "5.17.0"}

# TRL member -> the component method that implements it (called as method(call, *args)).
HOOKS = {
    "_get_train_sampler": "train_sampler",
    "get_batch_samples": "batch_samples",
    "training_step": "training_step",
    "_prepare_inputs": "prepare_inputs",
    "_generate_and_score_completions": "generate_and_score",
    "_generate": "generate",
    "_generate_single_turn": "generate_single_turn",
    "_calculate_rewards": "rewards",
    "compute_loss": "compute_loss",
    "_compute_loss": "loss",
    "_get_per_token_logps_and_entropies": "logps_and_entropies",
    "_save_checkpoint": "save_checkpoint",
    "_save_optimizer_and_scheduler": "save_optimizer",
    "_load_optimizer_and_scheduler": "load_optimizer",
}

# Every private member of TRL / transformers we override, call, read or swap, and why no public
# hook serves (docs/architecture.md "Private members of TRL and transformers").
PRIVATE = {
    "Trainer._get_train_sampler": "the prompt order of an uninterrupted run on resume",
    "GRPOTrainer._prepare_inputs": "step time: input preparation is not training",
    "GRPOTrainer._generate_and_score_completions": "rollout rounds, MaxEnt weights",
    "GRPOTrainer._generate": "step time and heartbeat around each generation",
    "GRPOTrainer._generate_single_turn": "async: the step's first generation made ahead; "
    "rollout functions generate through it (train/rollout_func.py)",
    "GRPOTrainer._calculate_rewards": "step time; the gathered rewards for rounds, MaxEnt, replay",
    "GRPOTrainer._compute_loss": "adaptive beta, entropy bonus, MaxEnt's loss",
    "GRPOTrainer._get_per_token_logps_and_entropies": "the KL before the entropy bonus; replay",
    "Trainer._save_checkpoint": "complete checkpoints: mark, rotate, registered state",
    "Trainer._save_optimizer_and_scheduler": "the checkpoint_partial failpoint",
    "Trainer._load_optimizer_and_scheduler": "resume: CPU optimizer load, registered state",
    "Trainer._load_from_checkpoint": "a run killed after its last checkpoint (train/entry.py)",
    "GRPOTrainer._metrics": "our metrics in TRL's logged averages",
    "GRPOTrainer._tokenize_prompts": "async, rollout functions: prompts as TRL tokenizes them",
    "GRPOTrainer._last_loaded_step": "async: TRL's once-per-step weight push",
    "grpo_trainer.VLLMGeneration": "server mode: our backend (swapped during __init__)",
    "grpo_trainer.create_model_from_path": "reference_model_name_or_path (swapped in __init__)",
    "VLLMGeneration._init_vllm": "connect at first use (train/vllm_connect.py)",
    "VLLMGeneration._iter_named_params": "disk weight sync (train/vllm_sync.py)",
}


# ---- private state, read and written through here only ---------------------------------------


def metrics(trainer, mode: str = "train"):
    """TRL's per-mode metric lists (name -> values), averaged into each log."""
    return trainer._metrics[mode]


def tokenize_prompts(trainer, prompts):
    return trainer._tokenize_prompts(prompts)


def generate_single_turn(trainer, prompt_ids, num_generations: int):
    """TRL's generation of `prompt_ids` (through the hook: the components' chain applies)."""
    return trainer._generate_single_turn(prompt_ids, None, {}, num_generations)


def last_loaded_step(trainer) -> int:
    return trainer._last_loaded_step


def set_last_loaded_step(trainer, step: int) -> None:
    trainer._last_loaded_step = step


def per_token_logps_and_entropies(trainer, *args, **kwargs):
    """TRL's forward pass (through the trainer's hook: the components' chain applies)."""
    return trainer._get_per_token_logps_and_entropies(*args, **kwargs)


def load_from_checkpoint(trainer, checkpoint: str) -> None:
    trainer._load_from_checkpoint(checkpoint)


def iter_named_params(generation):
    return generation._iter_named_params()


# ---- the hooks ----------------------------------------------------------------------------


def chain(components, method: str, base):
    """`base` (TRL's) wrapped by each component implementing `method`, the first outermost."""
    call = base
    for component in reversed(components):
        own = getattr(component, method, None)
        if own is not None:
            call = functools.partial(own, call)
    return call


class _TRLOnly:
    """The chains before the components exist (TRL's __init__): TRL's own methods."""

    def __init__(self, trainer):
        self.trainer = trainer

    def __getitem__(self, name: str):
        return getattr(super(HookedTrainer, self.trainer), name)


class HookedTrainer:
    """Our trainer, before TRL's class: `class GRPOTrainer(HookedTrainer, trl.GRPOTrainer)`.

    `method` picks the components (train/components.py `plan_components`); `method_component`
    is the method's own component class (MaxEnt's), injected by the layer that defines it.
    """

    method = "grpo"
    method_component = None

    def __init__(self, *args, **kwargs):
        # The components' modules import this one (for the accessors above): imported here.
        from maxent_grpo.train.components import build_components, plan_components
        from maxent_grpo.train.vllm_sync import vllm_backend  # imports TRL's vLLM backend

        self._chains = _TRLOnly(self)
        training_args = kwargs.get("args", args[2] if len(args) > 2 else None)
        with vllm_backend(type(self), training_args, self.method):
            super().__init__(*args, **kwargs)
        plan = plan_components(self.args, self.method, self.method_component)
        self.components = build_components(self, plan)
        base = super()
        self._chains = {
            name: chain(self.components, method, getattr(base, name))
            for name, method in HOOKS.items()
            if hasattr(base, name)
        }

    def component(self, name: str):
        """The component called `name` (its class's `name`); None when the recipe has none."""
        return next((c for c in self.components if c.name == name), None)

    # ---- each hook, once: the chain of its components, TRL's last -------------------------

    def _get_train_sampler(self, dataset=None):
        return self._chains["_get_train_sampler"](dataset)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        return self._chains["get_batch_samples"](epoch_iterator, num_batches, device)

    def training_step(self, model, inputs, num_items_in_batch=None):
        return self._chains["training_step"](model, inputs, num_items_in_batch)

    def _prepare_inputs(self, generation_batch):
        return self._chains["_prepare_inputs"](generation_batch)

    def _generate_and_score_completions(self, inputs):
        return self._chains["_generate_and_score_completions"](inputs)

    def _generate(self, prompts):
        return self._chains["_generate"](prompts)

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        return self._chains["_generate_single_turn"](
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self._chains["_calculate_rewards"](inputs, prompts, completions, completion_ids_list)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return self._chains["compute_loss"](model, inputs, return_outputs, num_items_in_batch)

    def _compute_loss(self, model, inputs):
        return self._chains["_compute_loss"](model, inputs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        return self._chains["_get_per_token_logps_and_entropies"](*args, **kwargs)

    def _save_checkpoint(self, model, trial):
        return self._chains["_save_checkpoint"](model, trial)

    def _save_optimizer_and_scheduler(self, output_dir):
        return self._chains["_save_optimizer_and_scheduler"](output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint):
        return self._chains["_load_optimizer_and_scheduler"](checkpoint)
