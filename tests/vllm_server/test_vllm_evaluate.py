"""Evaluation through vLLM's offline engine (benchmark_backend: vllm) on the CPU build, with
scores known in advance (tests/helpers/eval_rewards.py). The transformers path, and the
rest of evaluation: tests/test_evaluate*.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.paths import REPO
from helpers.recipes import write_recipe
from maxent_grpo.rundir.events import read_events


def test_vllm_backend_scores_a_checkpoint(tmp_path, tiny_model):
    data = tmp_path / "yes_no.jsonl"
    rows = [("Is 2 even?", "yes"), ("Is 3 even?", "no"), ("Is 4 even?", "yes")]
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    common = {
        "dataset": str(data),
        "prompt_column": "question",
        "answer_column": "answer",
        "reward": "tests.helpers.eval_rewards:solution_is_yes",
        "max_new_tokens": 8,
    }
    recipe = write_recipe(
        tmp_path,
        model_name_or_path=str(tiny_model),
        benchmark_backend="vllm",
        vllm_server_gpu_memory_utilization=0.1,  # CPU: of NUMA node 0's memory
        vllm_server_enforce_eager=True,
        benchmarks=[
            {"name": "greedy", **common},
            {"name": "sampled", **common, "num_samples": 4, "k": 2, "temperature": 1.0},
        ],
    )
    command = [sys.executable, "-m", "maxent_grpo.cli", "eval", "--config", str(recipe)]
    command += ["--checkpoint", str(tiny_model), "--step", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    scores = {e["benchmark"]: e for e in read_events(tmp_path / "out") if e["event"] == "eval"}
    assert {name: (e["backend"], e["score"]) for name, e in scores.items()} == {
        "greedy": ("vllm", 2 / 3),
        "sampled": ("vllm", 2 / 3),
    }
    sampled = (tmp_path / "out" / "eval" / "sampled" / "step-0.jsonl").read_text().splitlines()
    assert [len(json.loads(line)["completions"]) for line in sampled] == [4, 4, 4]
