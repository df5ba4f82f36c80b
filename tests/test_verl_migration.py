"""`maxent-grpo migrate` on verl and prime-rl runs (tests/fixtures/verl, tests/fixtures/prime_rl).

The pure parts (the shell reader, the batch re-fit) are tested on their own; every verl fixture
is then migrated and checked in-process (one TRL import for the file) on its own GPU count,
with verl's parquet layout written under a temporary $HOME/data/: the recipe passes `check` and
keeps verl's group size, learning rate, lengths, sampling, KL and entropy coefficients, and
completions per optimizer step and per generation (verl counts prompts: x rollout.n).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from helpers.migrating import run_cli
from maxent_grpo.errors import ConfigError
from maxent_grpo.migrate.refit import refit_eval, refit_train
from maxent_grpo.migrate.verl_script import flatten, read_script, shell_words

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCRIPTS = sorted((FIXTURES / "verl").glob("*.sh")) + [FIXTURES / "verl" / "ppo_trainer_grpo.yaml"]
SOURCES = {"gsm8k": "openai/gsm8k", "math": "DigitalLearningGmbH/MATH-lighteval"}


def test_shell_words_join_quote_and_expand_as_the_shell():
    env = {"HOME": "/h", "A": "x y"}
    words = shell_words("k=$HOME/d 'q=$A' \"r=$A\" s=${B:-dflt} $@ # note", env, "s.sh")
    assert words == ["k=/h/d", "q=$A", "r=x y", "s=dflt"]
    script = "X=1\nY=\"['$HOME/a', '$HOME/b']\"\npython3 -m verl.trainer.main_ppo \\\n"
    script += '    a.b=$X c.d="$Y" e=True f=1e-6 g=\'["console","wandb"]\' h=null $@\n'
    keys = read_script(script, env, "s.sh")
    assert keys == {
        "a.b": 1,
        "c.d": ["/h/a", "/h/b"],
        "e": True,
        "f": 1e-6,
        "g": ["console", "wandb"],
        "h": None,
    }


def test_an_unset_variable_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"s.sh: \$DATA is not set in the script"):
        read_script("python3 -m verl.trainer.main_ppo a=$DATA/x\n", {}, "s.sh")
    with pytest.raises(ConfigError, match="no `python3 -m verl.trainer.main_ppo` command"):
        read_script("echo hi\n", {}, "s.sh")


def test_a_verl_yaml_config_is_flattened_without_interpolations():
    data = {"a": {"b": 1, "c": "${x.y}", "d": {"e": [1, 2]}}}
    assert flatten(data) == {"a.b": 1, "a.d.e": [1, 2]}


@pytest.mark.parametrize(
    ("per_step", "per_gen", "group", "processes", "cap", "want"),
    [
        (1280, 5120, 5, 8, 40, (40, 4, 16)),  # verl 7B: 256x5 per step, 1024x5 per generation
        (80, 80, 5, 2, 40, (40, 1, 1)),  # LoRA on 2 GPUs
        (640, 5120, 5, 32, 2, (2, 10, 80)),  # 2 nodes x 16
        (48, 48, 8, 6, 8, (8, 1, 1)),
    ],
)
def test_refit_keeps_the_global_batch(per_step, per_gen, group, processes, cap, want):
    fit = refit_train(per_step, per_gen, group, processes, cap)
    assert (fit.per_device, fit.accumulation, fit.steps_per_generation) == want
    assert fit.exact
    assert fit.per_device * processes * fit.accumulation == per_step
    assert fit.per_device * processes * fit.steps_per_generation == per_gen
    assert f"= {per_step} completions per optimizer step, as the source" in fit.lines[0]


def test_refit_without_an_exact_fit_says_the_nearest_and_why():
    fit = refit_train(48, 96, 8, 7, 8)  # 48 = upstream's 6 x 8 does not split over 7
    assert not fit.exact
    assert (7 * fit.steps_per_generation) % 8 == 0  # whole groups still
    assert fit.steps_per_generation % fit.accumulation == 0
    assert fit.lines[0].startswith("no exact fit: 48 completions per optimizer step")
    assert "nearest: 1 x 7 x" in fit.lines[1]
    assert refit_eval(24, 8, 6) == (4, True, "4 x 6 processes = 24 completions, as the source")
    size, exact, line = refit_eval(28, 8, 6)
    assert not exact and (size * 6) % 8 == 0 and "nearest" in line


def _write_parquet(path: Path, source: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": path.stem, "index": i},
        }
        for i in range(4)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture
def verl_home(tmp_path, monkeypatch):
    """verl's data layout under $HOME/data (gsm8k/, math/, rlhf/gsm8k/, rlhf/math/)."""
    home = tmp_path / "home"
    for folder in ("gsm8k", "math", "rlhf/gsm8k", "rlhf/math"):
        for split in ("train", "test"):
            _write_parquet(
                home / "data" / folder / f"{split}.parquet", SOURCES[folder.split("/")[-1]]
            )
    monkeypatch.setenv("HOME", str(home))
    for name in ("MODEL", "NNODES"):
        monkeypatch.delenv(name, raising=False)
    return home


def _source_keys(path: Path, home: Path) -> dict:
    if path.suffix == ".yaml":
        return flatten(yaml.safe_load(path.read_text()))
    return read_script(path.read_text(), {"HOME": str(home)}, str(path))


def _expected(keys: dict) -> dict:
    """What the recipe must keep, from the source's own keys (verl's defaults where unset)."""
    a, r = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    group = keys[r + "n"]
    top_k = keys.get(r + "top_k", -1)
    return {
        "num_generations": group,
        "learning_rate": keys[a + "optim.lr"],
        "max_completion_length": keys["data.max_response_length"],
        "vllm_max_model_length": keys["data.max_prompt_length"] + keys["data.max_response_length"],
        "temperature": keys.get(r + "temperature", 1.0),
        "top_p": keys.get(r + "top_p", 1.0),
        "top_k": 0 if top_k == -1 else top_k,
        "beta": keys[a + "kl_loss_coef"] if keys.get(a + "use_kl_loss") else 0.0,
        "entropy_coef": keys.get(a + "entropy_coeff", 0),
        "per_step": keys[a + "ppo_mini_batch_size"] * group,
        "per_generation": keys["data.train_batch_size"] * group,
        "processes": keys["trainer.n_gpus_per_node"] * keys["trainer.nnodes"],
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_verl_runs_migrate_and_pass_check_on_their_own_gpus(
    script, verl_home, workdir, vllm_installed, capsys
):
    out = workdir / f"{script.stem}.yaml"
    code, stdout, err = run_cli(capsys, "migrate", str(script), "-o", str(out))
    want = _expected(_source_keys(script, verl_home))
    assert code == 0, stdout + err
    n = want["processes"]
    assert f"ok: {out} is valid for {n} training process(es) on gpu" in stdout, stdout
    recipe = yaml.safe_load(out.read_text())
    for key in ("num_generations", "learning_rate", "max_completion_length", "temperature"):
        assert recipe[key] == want[key], key
    for key in ("vllm_max_model_length", "top_p", "top_k", "beta", "entropy_coef"):
        assert recipe[key] == want[key], key
    batch = recipe["per_device_train_batch_size"] * n
    assert batch * recipe["gradient_accumulation_steps"] == want["per_step"]
    assert batch * recipe["steps_per_generation"] == want["per_generation"]
    assert recipe["vllm_mode"] == "colocate" and recipe["dataset_answer_column"].endswith("truth")
    assert "no counterpart for; check what it did" not in stdout  # every key has a fate
    assert "completions per optimizer step, as the source" in stdout  # the arithmetic


def test_verl_recipes_keep_lora_loss_and_rewards(verl_home, workdir, vllm_installed, capsys):
    lora = workdir / "lora.yaml"
    run_cli(capsys, "migrate", str(FIXTURES / "verl" / "qwen2_5_3b_lora.sh"), "-o", str(lora))
    data = yaml.safe_load(lora.read_text())
    assert (data["use_peft"], data["lora_r"], data["lora_alpha"]) == (True, 64, 32)
    assert data["reward_funcs"] == ["gsm8k_answer"] and data["shuffle_dataset"] is False
    config = workdir / "config.yaml"
    run_cli(capsys, "migrate", str(FIXTURES / "verl" / "ppo_trainer_grpo.yaml"), "-o", str(config))
    data = yaml.safe_load(config.read_text())
    assert data["loss_type"] == "dr_grpo" and data["scale_rewards"] == "none"
    assert (data["epsilon"], data["epsilon_high"], data["num_iterations"]) == (0.2, 0.28, 2)
    assert data["lr_scheduler_type"] == "cosine_with_min_lr" and data["warmup_steps"] == 0.05
    assert data["reward_funcs"] == ["boxed_accuracy_math"]


def test_a_verl_run_that_does_not_migrate_is_one_line(tmp_path, workdir, capsys):
    script = tmp_path / "ppo.sh"
    script.write_text("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=gae a=1\n")
    code, _, err = run_cli(capsys, "migrate", str(script), "-o", str(workdir / "x.yaml"))
    assert code == 2 and "algorithm.adv_estimator: gae: this toolkit trains GRPO" in err
    script.write_text(
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
        "actor_rollout_ref.rollout.n=1 data.train_files=x.parquet\n"
    )
    code, _, err = run_cli(capsys, "migrate", str(script), "-o", str(workdir / "x.yaml"))
    assert code == 2 and "rollout.n: 1: GRPO's advantages need at least 2" in err


def test_prime_rl_configs(workdir, vllm_installed, capsys):
    math = FIXTURES / "prime_rl" / "math_env.toml"
    out = workdir / "math.yaml"
    code, stdout, err = run_cli(capsys, "migrate", str(math), "-o", str(out))
    assert code == 0, stdout + err
    data = yaml.safe_load(out.read_text())
    assert data["num_generations"] == 8 and data["reward_funcs"] == ["boxed_accuracy_math"]
    processes = 2  # 3 GPUs: 2 train, 1 serves vLLM
    batch = data["per_device_train_batch_size"] * processes
    assert (
        batch * data["gradient_accumulation_steps"] == 128 == batch * data["steps_per_generation"]
    )
    assert f"ok: {out} is valid for {processes} training process(es)" in stdout
    assert "max_off_policy_steps" in stdout  # a behaviour difference, said
    for name, line in (
        ("reverse_text.toml", "reverse-text: this prime-rl environment has no counterpart here"),
        ("group_size_1.toml", "orchestrator.group_size: 1 (prime-rl's default is 1)"),
    ):
        code, _, err = run_cli(
            capsys, "migrate", str(FIXTURES / "prime_rl" / name), "-o", str(workdir / "x.yaml")
        )
        assert code == 2 and line in err, err


def test_verl_rows_become_prompt_and_solution(tmp_path):
    """verl's layout as the trainer reads it: the prompt's messages, the ground truth from the
    reward_model struct (dataset_answer_column: reward_model.ground_truth)."""
    import datasets  # the trainer's reader

    from maxent_grpo.data.load import to_conversation

    path = tmp_path / "train.parquet"
    _write_parquet(path, "openai/gsm8k")
    rows = datasets.load_dataset("parquet", data_files=str(path), split="train")
    out = to_conversation(rows, "prompt", "reward_model.ground_truth", None)
    assert out[1]["solution"] == "2"
    assert out[1]["prompt"] == [{"role": "user", "content": "What is 1 + 1?"}]
