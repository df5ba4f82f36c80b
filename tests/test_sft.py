"""method: sft (TRL's SFTTrainer): its recipe keys and checks, its plan without a vLLM server,
its built-in data, and one real CPU run stopped at a step boundary and resumed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from helpers.paths import REPO
from helpers.resume import assert_resumed_from, event_count
from helpers.runs import child_env
from maxent_grpo.errors import EXIT_CHECKPOINTED, ConfigError
from maxent_grpo.launch.launcher import RunRequest, prepare
from maxent_grpo.recipe import read_recipe
from maxent_grpo.rundir.checkpoints import (
    clear_stop_request,
    last_complete_checkpoint,
    request_stop,
    run_is_complete,
)

SMOKE_SFT = REPO / "recipes" / "smoke" / "config_sft.yaml"


def sft_recipe(tmp_path, **keys):
    data = {**yaml.safe_load(SMOKE_SFT.read_text()), "output_dir": str(tmp_path / "out"), **keys}
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def problems_of(path) -> list[str]:
    with pytest.raises(ConfigError) as error:
        read_recipe(["--config", str(path)])
    return list(getattr(error.value, "problems", None) or [str(error.value)])


def test_the_smoke_recipe_reads_as_sft_with_trl_sft_keys():
    keys = read_recipe(["--config", str(SMOKE_SFT)])
    assert keys.method == "sft"
    assert keys.max_length == 128  # TRL's SFTConfig key
    assert keys.dataset_name == "builtin:arithmetic_sft"
    assert "num_generations" not in keys.values and "reward_funcs" not in keys.values


def test_grpo_keys_in_an_sft_recipe_are_one_line_each(tmp_path):
    path = sft_recipe(tmp_path, reward_funcs=["accuracy"], num_generations=8, learning_rat=1.0)
    lines = problems_of(path)
    assert len(lines) == 3, lines
    for key in ("reward_funcs", "num_generations"):
        (line,) = [x for x in lines if f"'{key}'" in x]
        assert "belongs to method grpo and maxent" in line and f"remove {key}" in line, line
        assert str(path) in line
    assert any("unknown key 'learning_rat'; did you mean 'learning_rate'" in x for x in lines)


def test_a_maxent_key_in_a_grpo_recipe_names_its_method(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump({"maxent_tau": 2.0}))
    (line,) = problems_of(path)
    assert "'maxent_tau' belongs to method maxent" in line and "set method: maxent" in line


def test_an_sft_recipe_without_answers_is_one_line_from_check(tmp_path, tiny_model):
    from maxent_grpo.recipe import parse_recipe  # builds the sections: imports TRL

    path = sft_recipe(tmp_path, model_name_or_path=str(tiny_model), dataset_answer_column=None)
    with pytest.raises(ConfigError, match=r"dataset_answer_column: null: an SFT run trains on"):
        parse_recipe(["--config", str(path)])
    assert parse_recipe(["--config", str(sft_recipe(tmp_path))]).method == "sft"


def test_the_plan_of_an_sft_recipe_starts_no_server_and_runs_src_sft(tmp_path, tiny_model):
    path = sft_recipe(tmp_path, model_name_or_path=str(tiny_model))
    prepared = prepare(RunRequest(recipe=str(path)), packages=False)
    assert prepared.plan.servers == ()
    text = prepared.describe()
    assert "vllm server: none" in text
    assert "src/sft.py" in " ".join(prepared.plan.train.command), text


def test_the_sft_builtin_data_are_the_plain_problems_with_worked_replies():
    from maxent_grpo.data.builtin import builtin_dataset

    plain = builtin_dataset("mixed", num_rows=40, seed=3)
    worked = builtin_dataset("mixed_sft", num_rows=40, seed=3)
    assert plain["problem"] == worked["problem"]
    for answer, reply in zip(plain["solution"], worked["solution"], strict=True):
        assert reply.endswith(f" = {answer}</think>\n<answer>{answer}</answer>"), reply
        assert reply.startswith("<think>")


def test_rows_become_prompt_completion_with_the_answer_as_the_reply():
    import datasets

    from maxent_grpo.data.sft_rows import prompt_completion

    chat = datasets.Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": "What is 1 + 1?"}]], "solution": ["2"]}
    )
    row = prompt_completion(chat)[0]
    assert row["completion"] == [{"role": "assistant", "content": "2"}]
    assert "solution" not in row and row["prompt"][0]["content"] == "What is 1 + 1?"
    text = datasets.Dataset.from_dict({"prompt": ["Q: 1 + 1\nA:"], "solution": [" 2"]})
    assert prompt_completion(text)[0]["completion"] == " 2"


# ---- one real CPU run ---------------------------------------------------------------------------


def train(path) -> subprocess.CompletedProcess:
    """The trainer process alone (src/sft.py, one CPU process), as the launcher starts it."""
    return subprocess.run(
        [sys.executable, str(REPO / "src" / "sft.py"), "--config", str(path)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.integration
def test_stopped_at_a_step_boundary_then_resumed_equals_an_uninterrupted_run(tmp_path, tiny_model):
    """The stop file is what SIGTERM's handler and the launcher's Slurm signal write
    (rundir/checkpoints.py request_stop); written before the start, the run stops after step 1
    with a complete checkpoint, and the next attempt resumes there."""
    from safetensors.torch import load_file

    keys = dict(model_name_or_path=str(tiny_model), dataset_num_rows=64, max_length=128)
    keys.update(per_device_train_batch_size=4, max_steps=4, save_steps=1000)
    full, part = tmp_path / "full", tmp_path / "part"
    for folder in (full, part):
        folder.mkdir()
        sft_recipe(folder, **keys)
    done = train(full / "sft.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    request_stop(part / "out", "test: stop at the first step boundary")
    stopped = train(part / "sft.yaml")
    assert stopped.returncode == EXIT_CHECKPOINTED, stopped.stderr[-3000:]
    assert last_complete_checkpoint(part / "out") == part / "out" / "checkpoint-1"
    assert not run_is_complete(part / "out")
    clear_stop_request(part / "out")  # what the launcher does before the next attempt
    before = event_count(part / "out")
    resumed = train(part / "sft.yaml")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed_from(part / "out", before, checkpoint=1, max_steps=4, log=resumed.stdout)
    assert run_is_complete(part / "out")
    a, b = (
        load_file(full / "out" / "model.safetensors"),
        load_file(part / "out" / "model.safetensors"),
    )
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert tensor.equal(b[name]), name
