"""Evaluation with real generation on the tiny model (transformers' generate on CPU): the
`maxent-grpo eval` command, and a local training run whose benchmarks run inline after the
final save (integration: ~1-2 min on 2 CPUs). Scores that need no model: test_evaluate.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from helpers.paths import MAXENT_GRPO
from helpers.recipes import write_recipe
from helpers.runs import run
from maxent_grpo.rundir.events import read_events
from maxent_grpo.runs import collect_runs

pytestmark = pytest.mark.integration


def _evals(out: Path, kind: str = "eval") -> list[dict]:
    return [e for e in read_events(out) if e["event"] == kind]


def _yes_no_file(tmp_path: Path) -> Path:
    path = tmp_path / "yes_no.jsonl"
    rows = [("Is 2 even?", "yes"), ("Is 3 even?", "no"), ("Is 4 even?", "yes")]
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    return path


def test_eval_command_scores_a_checkpoint_once(tmp_path, tiny_model):
    # The reward only reads the reference, so the score is worked out by hand: 2 of 3 problems
    # are 'yes' -> greedy pass@1 = 2/3, and pass@2 of 4 samples = 2/3 too (all or none pass).
    data = _yes_no_file(tmp_path)
    common = {
        "dataset": str(data),
        "prompt_column": "question",
        "answer_column": "answer",
        "reward": "tests.helpers.eval_rewards:solution_is_yes",
        "max_new_tokens": 8,
    }
    benchmarks = [
        {"name": "greedy", **common},
        {"name": "sampled", **common, "num_samples": 4, "k": 2, "temperature": 1.0},
        {"name": "arithmetic", "num_examples": 4, "max_new_tokens": 8},
    ]
    recipe = write_recipe(tmp_path, model_name_or_path=str(tiny_model), benchmarks=benchmarks)
    out = tmp_path / "out"
    args = [MAXENT_GRPO, "eval", "--config", str(recipe), "--checkpoint", str(tiny_model)]
    result = run([*args, "--step", "0"], timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    scores = {e["benchmark"]: e for e in _evals(out)}
    assert scores["greedy"]["score"] == pytest.approx(2 / 3)
    assert scores["sampled"]["score"] == pytest.approx(2 / 3)
    assert (scores["sampled"]["metric"], scores["sampled"]["problems"]) == ("pass@2", 3)
    assert scores["arithmetic"]["problems"] == 4 and 0 <= scores["arithmetic"]["score"] <= 1
    assert all(e["step"] == 0 and e["backend"] == "transformers" for e in scores.values())
    assert "greedy: pass@1 0.6667 at step 0 (3 problems x 1 samples" in result.stdout
    samples = [json.loads(line) for line in (out / "eval" / "sampled" / "step-0.jsonl").open()]
    assert [len(s["completions"]) for s in samples] == [4, 4, 4]
    assert [s["rewards"] for s in samples][1] == [0.0] * 4

    # Greedy is deterministic: the same completions from a second, separate evaluation.
    again = run([*args, "--step", "1", "--benchmark", "greedy"], timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    first, second = ((out / "eval" / "greedy" / f"step-{s}.jsonl").read_text() for s in (0, 1))
    assert first == second
    # Asked again for step 0: every benchmark is scored there already, nothing is redone.
    repeat = run([*args, "--step", "0"], timeout=300)
    assert repeat.returncode == 0 and len(_evals(out)) == 4  # 3 at step 0, 1 at step 1


def test_eval_command_bad_input_is_one_line_before_any_model_loads(tmp_path, tiny_model, capfd):
    """In process (cli.main, as the console script calls it; output captured at the file
    descriptors): a subprocess of `maxent-grpo eval` cost ~13 CPU-s of imports per case."""
    from maxent_grpo import cli

    recipe = write_recipe(tmp_path, model_name_or_path=str(tiny_model), benchmarks=["arithmetic"])
    cases = [
        (["--checkpoint", str(tmp_path / "nowhere")], "--checkpoint"),
        (
            ["--checkpoint", str(tiny_model), "--step", "0", "--benchmark", "gsm8k"],
            "--benchmark gsm8k: not a benchmark of the recipe (arithmetic)",
        ),
    ]
    for extra, expected in cases:
        code = cli.main(["eval", "--config", str(recipe), *extra])
        out, err = capfd.readouterr()
        assert code == 2, err
        (line,) = err.strip().splitlines()
        assert line.startswith("error: ") and expected in line, line
        assert "Loading weights" not in out + err
    assert not _evals(tmp_path / "out")


def test_inline_evaluation_after_a_local_run(tmp_path, tiny_model):
    # save_steps 2, save_total_limit 1: checkpoint-2 is gone by the end (skipped, not an
    # error), checkpoint-4 is the final step (scored once, not again as the final model).
    recipe = write_recipe(
        tmp_path,
        model_name_or_path=str(tiny_model),
        dataset_num_rows=64,
        max_completion_length=16,
        max_steps=4,
        save_steps=2,
        save_total_limit=1,
        num_processes=1,
        benchmarks=[{"name": "arithmetic", "num_examples": 4, "max_new_tokens": 8}],
    )
    logs = tmp_path / "logs"
    result = run([MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "out"
    (skip,) = _evals(out, "eval_skip")
    assert skip["step"] == 2 and "removed by save_total_limit" in skip["reason"]
    (score,) = _evals(out, "eval")
    assert (score["step"], score["benchmark"], score["problems"]) == (4, "arithmetic", 4)
    assert score["checkpoint"] == str(out / "checkpoint-4") and score["job"] is None
    assert not _evals(out, "eval_submit") and not _evals(out, "eval_fail")

    (info,) = collect_runs([out], open_logs=())
    assert info.evals == {"arithmetic": {"step": 4, "score": score["score"]}}
    plot = run([MAXENT_GRPO, "plot", str(out), "--out", str(tmp_path / "p.png")], timeout=120)
    assert plot.returncode == 0 and "Benchmark scores" in plot.stdout, plot.stderr
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert [r["eval/arithmetic"] for r in rows if r["eval/arithmetic"]] == [repr(score["score"])]


def test_a_failure_is_recorded_and_the_other_benchmarks_still_score(tmp_path, tiny_model):
    import shutil

    from maxent_grpo.evaluate.command import load_recipe
    from maxent_grpo.evaluate.run import Target, evaluate_target
    from maxent_grpo.evaluate.schedule import benchmarks_of
    from maxent_grpo.launch.launcher import RunRequest

    data, gone = _yes_no_file(tmp_path), tmp_path / "gone.jsonl"
    shutil.copy(data, gone)
    common = {
        "prompt_column": "question",
        "answer_column": "answer",
        "max_new_tokens": 4,
        "reward": "tests.helpers.eval_rewards:solution_is_yes",
    }
    benchmarks = [
        {"name": "good", "dataset": str(data), **common},
        {"name": "bad", "dataset": str(gone), **common},
    ]
    path = write_recipe(tmp_path, model_name_or_path=str(tiny_model), benchmarks=benchmarks)
    recipe = load_recipe(RunRequest(recipe=str(path)))
    gone.unlink()  # after the check: the file goes away before the evaluation reads it
    results, failed = evaluate_target(recipe, benchmarks_of(recipe), Target(tiny_model, 3))
    assert [r["benchmark"] for r in results] == ["good"] and failed == ["bad"]
    (fail,) = _evals(tmp_path / "out", "eval_fail")
    assert fail["benchmarks"] == ["bad"] and "does not exist" in fail["reason"]
    # Weights that cannot be loaded: every benchmark of the evaluation fails, recorded.
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(tiny_model / "config.json", broken)
    results, failed = evaluate_target(recipe, benchmarks_of(recipe)[:1], Target(broken, 4))
    assert results == [] and failed == ["good"]
    assert _evals(tmp_path / "out", "eval_fail")[-1]["step"] == 4
