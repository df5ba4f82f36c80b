"""MaxEnt-GRPO trainer on the tiny model (CPU): loss gradient, learning, resume, 2 processes.

The integration tests train for real in subprocesses (a few steps each); run them with
`pytest -m integration tests/test_maxent_training.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.paths import MAXENT_GRPO, REPO, SMOKE_MAXENT
from helpers.recipes import write_recipe
from maxent_grpo.rundir.checkpoints import RUN_MARKER, last_complete_checkpoint
from maxent_grpo.tiny_model import build_tiny_model

ENTRY = REPO / "src" / "maxent-grpo.py"
# Keys that measure wall time or summarise a whole run, not one step.
UNSTABLE_KEYS = {
    "step_time",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "total_flos",
}


def comparable(key: str) -> bool:
    """Not a wall-clock figure (TRL's, or the step time split's time/*)."""
    return key not in UNSTABLE_KEYS and not key.startswith("time/")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def train(recipe: Path, *flags: str) -> str:
    """One single-process training run of src/maxent-grpo.py; its output."""
    cmd = [sys.executable, str(ENTRY), "--config", str(recipe), *flags]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def step_logs(output_dir: Path) -> dict[int, dict]:
    """Per-step training logs of the last complete checkpoint's trainer_state.json, by step."""
    checkpoint = last_complete_checkpoint(output_dir)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return {e["step"]: e for e in state["log_history"] if "loss" in e}


# ---- the loss gradient, through the trainer ---------------------------------------------------

K = 4


@pytest.fixture(scope="module")
def trainer(tiny_model, tmp_path_factory):
    """An in-process MaxEnt trainer on the tiny model in float64, no reference model."""
    from datasets import Dataset

    from maxent_grpo.maxent.trainer import MaxEntGRPOTrainer
    from maxent_grpo.recipe.maxent_keys import MaxEntConfig

    args = MaxEntConfig(
        output_dir=str(tmp_path_factory.mktemp("trainer")),
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=K,
        per_device_train_batch_size=K,
        max_completion_length=6,
        model_init_kwargs={"dtype": torch.float64},
    )
    return MaxEntGRPOTrainer(
        model=str(tiny_model),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["What is 1 + 1?"] * 4}),
    )


def test_loss_gradient_matches_finite_differences(trainer, monkeypatch):
    """d loss / d theta = -sum_i w_i grad mean_t log pi(y_i,t), checked by central differences
    of the weighted log-likelihood along a random direction (float64)."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    def rms_norm_in_input_dtype(self, hidden_states):
        # Qwen2's RMSNorm computes in float32, whose rounding would swamp the differences.
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)

    monkeypatch.setattr(Qwen2RMSNorm, "forward", rms_norm_in_input_dtype)
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    model.train()
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    prompt_length = 5
    completion_mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] * 5 + [0], [1] + [0] * 5])
    inputs = {
        "prompt_ids": torch.randint(0, vocab, (K, prompt_length)),
        "prompt_mask": torch.ones(K, prompt_length, dtype=torch.long),
        "completion_ids": torch.randint(0, vocab, (K, 6)),
        "completion_mask": completion_mask,
        "maxent_weights": torch.softmax(torch.randn(K, dtype=torch.float64), 0),
    }

    def weighted_log_likelihood() -> torch.Tensor:
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        logits = model(input_ids=ids).logits[:, prompt_length - 1 : -1]  # completion tokens
        logps = torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"].unsqueeze(-1))
        mean = (logps.squeeze(-1) * completion_mask).sum(-1) / completion_mask.sum(-1)
        return (inputs["maxent_weights"] * mean).sum()

    loss = trainer._compute_loss(model, inputs)
    # Value: the weighted NLL (the trainer's fused log-softmax returns float32).
    assert torch.isclose(loss, -weighted_log_likelihood(), rtol=1e-6)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)

    direction = [torch.randn_like(p) for p in params]
    norm = torch.sqrt(sum((d * d).sum() for d in direction))
    direction = [d / norm for d in direction]
    h = 1e-5
    with torch.no_grad():
        values = []
        for sign in (1, -1):
            for p, d in zip(params, direction):
                p.add_(sign * h * d)
            values.append(weighted_log_likelihood().item())
            for p, d in zip(params, direction):
                p.sub_(sign * h * d)
    finite_difference = (values[0] - values[1]) / (2 * h)
    analytic = -sum((g * d).sum() for g, d in zip(grads, direction)).item()
    print(
        f"directional derivative: autograd {analytic:.10f}, finite differences "
        f"{finite_difference:.10f}"
    )
    assert abs(analytic - finite_difference) <= 1e-4 * abs(finite_difference)
    assert abs(analytic) > 1e-3  # a real check, not 0 == 0


def test_controller_state_round_trip(trainer):
    maxent = trainer.component("maxent")
    maxent.kl_controller.beta, maxent.tau_controller.tau = 0.1 / 3, 2 / 7
    saved = json.loads(json.dumps(maxent.controller_state()))
    maxent.kl_controller.beta, maxent.tau_controller.tau = 1.0, 1.0
    maxent.load_controller_state(saved)
    assert (maxent.kl_controller.beta, maxent.tau_controller.tau) == (0.1 / 3, 2 / 7)
    assert trainer.beta == 0.1 / 3  # TRL's attribute follows the controller


def test_resuming_a_checkpoint_without_controller_state_is_a_user_error(trainer, tmp_path):
    from maxent_grpo.errors import UserError

    with pytest.raises(UserError, match=r"no registered_state-0\.pt"):
        trainer._load_optimizer_and_scheduler(str(tmp_path))


# ---- training runs ----------------------------------------------------------------------------


@pytest.mark.integration
def test_maxent_raises_a_climbable_reward(tiny_model, tmp_path):
    """30 steps on the fraction-of-digits reward: the mean reward must rise clearly."""
    out = tmp_path / "out"
    recipe = write_recipe(
        tmp_path,
        SMOKE_MAXENT,
        model_name_or_path=str(tiny_model),
        reward_funcs=["digit_fraction"],
        reward_weights=[1.0],
        overlong_buffer=None,
        num_generations=8,
        per_device_train_batch_size=16,
        max_completion_length=16,
        maxent_q_temperature=0.1,
        maxent_tau=0.5,
        learning_rate=3.0e-3,
        max_steps=30,
        save_steps=30,
    )
    train(recipe)
    logs = step_logs(out)
    rewards = [logs[s]["reward"] for s in sorted(logs)]
    before, after = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"mean reward: first 5 steps {before:.4f}, last 5 steps {after:.4f}")
    assert after >= before + 0.05


@pytest.mark.integration
def test_two_process_run_through_the_launcher(tiny_model, tmp_path):
    """`maxent-grpo run` with 2 CPU processes; 2 completions per process, so every group of 4
    spans both processes and the weights need the gathered rewards and log-likelihoods."""
    out = tmp_path / "out"
    cmd = [
        MAXENT_GRPO,
        "run",
        "--method",
        "maxent",
        "--config",
        str(SMOKE_MAXENT),
        "--run-name",
        "maxent-two-proc",
        "--logs-dir",
        str(tmp_path / "logs"),
        "--",
        "--output_dir",
        str(out),
        "--model_name_or_path",
        str(tiny_model),
        "--max_steps",
        "2",
        "--save_steps",
        "2",
        "--per_device_train_batch_size",
        "2",
        "--maxent_tau",
        "1000",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 processes" in proc.stdout
    assert (out / RUN_MARKER).is_file()
    assert (out / "checkpoint-2" / "registered_state-1.pt").is_file()
    logs = step_logs(out)
    for key in ("maxent/weight_entropy", "maxent/ess", "maxent/max_weight", "maxent/kl"):
        assert key in logs[1] and key in logs[2]
    # tau = 1000 makes the weights near-uniform over the whole group of 4 (ESS <= 2 if the
    # processes had weighted their halves separately).
    assert logs[1]["maxent/ess"] > 3.9
