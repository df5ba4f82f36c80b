"""`maxent-grpo sbatch --chain` (launch/chain.py): every recipe checked before anything is
queued, then each job queued behind the previous one (afterok). The real chain on Slurm:
tests/slurm/test_sweep_slurm.py. The `sbatch` here is a script on PATH that records each call and
answers job ids 100, 101, ... (Slurm's own runs in the slurm suite)."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.paths import REPO, SMOKE
from maxent_grpo import cli

QWEN = REPO / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_math.yaml"


def fake_sbatch(tmp_path: Path, monkeypatch) -> Path:
    calls = tmp_path / "sbatch-calls"
    script = tmp_path / "bin" / "sbatch"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nn=$(wc -l < {calls})\necho $((99 + n))\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return calls


def recipe(tmp_path: Path, name: str, extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SMOKE.read_text() + f"\noutput_dir: {tmp_path}/{name}\n{extra}")
    return path


def test_chain_queues_each_job_after_the_previous(tmp_path, monkeypatch, capsys):
    calls = fake_sbatch(tmp_path, monkeypatch)
    first, second = recipe(tmp_path, "a"), recipe(tmp_path, "b", f"init_from: {tmp_path}/a\n")
    argv = ["sbatch", "--config", str(first), "--gpus", "1", "--chain", str(second)]
    assert cli.main(argv) == 0
    sent = [line.split() for line in calls.read_text().splitlines()]
    assert len(sent) == 2
    assert not any(a.startswith("--dependency") for a in sent[0])
    assert "--dependency=afterok:100" in sent[1] and "--kill-on-invalid-dep=yes" in sent[1]
    assert sent[1].index("--dependency=afterok:100") < sent[1].index("training.sh")
    assert sent[1][-2:] == ["--config", str(second)]
    out = capsys.readouterr().out
    assert "submitted job 100:" in out and "submitted job 101:" in out


def test_a_bad_chained_recipe_queues_nothing(tmp_path, monkeypatch, capsys):
    calls = fake_sbatch(tmp_path, monkeypatch)
    first, second = recipe(tmp_path, "a"), recipe(tmp_path, "b", "num_generations: 3\n")
    argv = ["sbatch", "--config", str(first), "--gpus", "1", "--chain", str(second)]
    assert cli.main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {second}:") and "num_generations (3)" in line
    assert not calls.exists()


def test_a_job_with_several_servers_outlives_a_failed_node_the_others_do_not(
    tmp_path, monkeypatch, capsys
):
    """--no-kill only for the chained job whose plan has a vLLM server on each of 2 nodes
    (docs/scaling-generation.md); the first, one server, is ended and requeued by Slurm."""
    calls = fake_sbatch(tmp_path, monkeypatch)
    text = QWEN.read_text()
    first, second = tmp_path / "one.yaml", tmp_path / "two.yaml"
    first.write_text(f"{text}\noutput_dir: {tmp_path}/one\n")
    second.write_text(f"{text}\noutput_dir: {tmp_path}/two\nvllm_nodes: 2\n")
    argv = ["sbatch", "--config", str(first), "--gpus", "8", "--nodes", "4", "--chain"]
    assert cli.main([*argv, str(second)]) == 0, capsys.readouterr().err
    sent = [line.split() for line in calls.read_text().splitlines()]
    assert ["--no-kill" in args for args in sent] == [False, True]
