"""Evaluation (maxent_grpo.evaluate) without a model: pass@k and scores worked out by hand on
fixed completions, the benchmark declarations and their one-line errors, the held-out split,
the event-log decisions (due, queued, scored), the evaluation job's sbatch command and the
trainer's queueing with a stand-in sbatch, and the scores in `runs` and `plot`.

Real generation with the tiny model and real training runs: tests/test_evaluate_real.py;
real evaluation jobs on the Slurm test cluster: tests/slurm/test_evaluate_slurm.py."""

from __future__ import annotations

import csv
import json
import os
import stat
import time
import types
from pathlib import Path

import datasets
import pytest

from helpers.recipes import write_recipe
from maxent_grpo import cli
from maxent_grpo.benchmarks.data import held_out_rows
from maxent_grpo.benchmarks.spec import BUILTIN_BENCHMARKS, Benchmark, parse_benchmarks
from maxent_grpo.data import builtin_dataset, to_conversation
from maxent_grpo.errors import ConfigError
from maxent_grpo.evaluate import schedule
from maxent_grpo.evaluate.run import score_completions
from maxent_grpo.evaluate.scoring import pass_at_k, score_rewards
from maxent_grpo.rewards import get_reward_funcs
from maxent_grpo.rundir import ledger
from maxent_grpo.rundir.checkpoints import CHECKPOINT_MARKER
from maxent_grpo.rundir.events import emit, read_events
from maxent_grpo.runs import collect_runs, format_table
from maxent_grpo.runs.plot import plot_run

# ------------------------------------------------------------------ scores, worked by hand


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 2, 1, 0.5),  # c / n
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (5, 0, 3, 0.0),
        (5, 3, 3, 1.0),  # n - c = 2 < k: every draw of 3 holds a correct one
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in ((4, 5, 1), (4, 1, 5), (4, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_score_is_the_mean_pass_at_k_over_problems():
    rewards = [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    assert score_rewards(rewards, k=1).score == pytest.approx((0.5 + 0 + 1) / 3)
    two = score_rewards(rewards, k=2)
    assert two.score == pytest.approx((5 / 6 + 0 + 1) / 3)  # 11/18
    assert (two.problems, two.unscored, two.mean_reward) == (3, 0, 0.5)  # 6 of 12 samples
    # A None reward fails its sample; a problem with nothing but None is left out.
    mixed = score_rewards([[1.0, None], [None, None], [0.3, 0.9]], k=1, threshold=0.5)
    assert (mixed.score, mixed.problems, mixed.unscored) == (pytest.approx(0.5), 2, 1)
    assert score_rewards([[None]], k=1).score is None


def _rows(solutions: list[str]):
    problems = [f"problem {i}" for i in range(len(solutions))]
    table = datasets.Dataset.from_dict({"problem": problems, "solution": solutions})
    return to_conversation(table, "problem", "solution", "Answer in <answer></answer>.")


def test_fixed_completions_scored_with_answer_match_greedy_and_pass_at_2():
    reward = get_reward_funcs(["answer_match"])[0]
    rows = _rows(["4", "7", "1"])
    sampled = [
        ["<answer>4</answer>", "<answer>5</answer>", "4", "<answer> 4 </answer>"],  # 2 of 4
        ["<answer>7</answer>"] * 4,  # 4 of 4
        ["<answer>2</answer>", "no", "<answer>11</answer>", ""],  # 0 of 4
    ]
    bench = Benchmark("b", "builtin:arithmetic", num_samples=4, k=2, temperature=1.0)
    score, rewards = score_completions(reward, rows, sampled, bench)
    assert rewards[0] == [1.0, 0.0, 0.0, 1.0]
    assert score.score == pytest.approx((5 / 6 + 1 + 0) / 3)  # 11/18 = 0.6111
    greedy = [["<answer>4</answer>"], ["<answer>8</answer>"], ["<answer>1</answer>"]]
    score, _ = score_completions(reward, rows, greedy, Benchmark("g", "builtin:arithmetic"))
    assert score.score == pytest.approx(2 / 3)


def test_fixed_completions_scored_with_accuracy_and_a_custom_reward():
    accuracy = get_reward_funcs(["accuracy"])[0]
    rows = _rows(["\\frac{1}{2}", "42"])
    completions = [["<answer>0.5</answer>"], ["the answer is 41"]]
    score, rewards = score_completions(accuracy, rows, completions, Benchmark("a", "x"))
    assert rewards == [[1.0], [0.0]] and score.score == 0.5
    custom = get_reward_funcs(["tests.helpers.eval_rewards:solution_is_yes"])[0]
    rows = _rows(["yes", "no", "yes"])
    score, _ = score_completions(custom, rows, [["x"], ["y"], ["z"]], Benchmark("c", "x"))
    assert score.score == pytest.approx(2 / 3)


# ------------------------------------------------------------------ declarations


def test_builtin_names_and_mappings():
    arithmetic, pass8, mine = parse_benchmarks(
        [
            "arithmetic",
            {
                "name": "pass8",
                "dataset": "builtin:word_problems",
                "num_samples": 8,
                "k": 8,
                "temperature": 1,
            },
            {
                "name": "mine",
                "dataset": "data/test.jsonl",
                "prompt_column": "q",
                "system_prompt": None,
            },
        ],
        system_prompt="sys",
    )
    assert arithmetic == BUILTIN_BENCHMARKS["arithmetic"].__class__(
        **{**vars(BUILTIN_BENCHMARKS["arithmetic"]), "system_prompt": "sys"}
    )
    assert (arithmetic.split, arithmetic.greedy, arithmetic.metric) == ("test", True, "pass@1")
    assert (pass8.split, pass8.num_examples, pass8.temperature, pass8.metric) == (
        "test",
        200,
        1.0,
        "pass@8",
    )
    assert (mine.split, mine.system_prompt, mine.reward) == ("train", None, "accuracy")
    # A built-in's name with settings of its own: the built-in's dataset and the new settings.
    (sampled,) = parse_benchmarks([{"name": "arithmetic", "num_samples": 4, "temperature": 0.7}])
    assert (sampled.dataset, sampled.num_samples, sampled.num_examples) == (
        "builtin:arithmetic",
        4,
        200,
    )
    assert parse_benchmarks(None) == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["arithmetc"], "benchmarks[0]: unknown benchmark 'arithmetc'; use a built-in name"),
        (
            [{"name": "a", "dataset": "builtin:arithmetic", "num_sample": 4}],
            "benchmarks[0] (a): unknown field 'num_sample'; did you mean 'num_samples'?",
        ),
        (
            [
                {
                    "name": "a",
                    "dataset": "builtin:arithmetic",
                    "num_samples": 2,
                    "k": 4,
                    "temperature": 1.0,
                }
            ],
            "benchmarks[0] (a): k: 4 > num_samples: 2",
        ),
        (
            [{"name": "a", "dataset": "builtin:arithmetic", "num_samples": 4}],
            "benchmarks[0] (a): num_samples: 4 with temperature 0 (greedy) gives identical samples",
        ),
        (
            ["arithmetic", {"name": "arithmetic", "k": 1}],
            "benchmarks[1] (arithmetic): the name is used twice",
        ),
        (
            [{"name": "a", "dataset": "builtin:arithmetic", "split": "validation"}],
            "benchmarks[0] (a): split: 'validation': a built-in dataset has 'test'",
        ),
        ([{"name": "a"}], "benchmarks[0] (a): no dataset"),
        ([{"dataset": "x.jsonl"}], "benchmarks[0]: no name"),
        ([{"name": "a b", "dataset": "x.jsonl"}], "benchmarks[0]: name 'a b': use letters"),
        (
            [{"name": "a", "dataset": "x.jsonl", "num_examples": 0}],
            "benchmarks[0] (a): num_examples: 0 is invalid (an integer >= 1)",
        ),
        (
            [{"name": "a", "dataset": "x.jsonl", "temperature": "hot"}],
            "benchmarks[0] (a): temperature: 'hot' is invalid (a number)",
        ),
        ("arithmetic", "benchmarks: 'arithmetic' is invalid; give a list"),
    ],
)
def test_bad_declarations_are_one_line(raw, expected):
    with pytest.raises(ConfigError) as caught:
        parse_benchmarks(raw)
    message = str(caught.value)
    assert message.startswith(expected) and "\n" not in message, message


def test_held_out_rows_leave_out_every_training_problem():
    script = types.SimpleNamespace(dataset_num_rows=2000, dataset_seed=0)
    held = held_out_rows("arithmetic", 300, script)
    train = set(builtin_dataset("arithmetic", num_rows=2000, seed=0)["problem"])
    assert len(held) == 300 and not set(held["problem"]) & train
    assert held["problem"] == held_out_rows("arithmetic", 300, script)["problem"]  # fixed


def _check(tmp_path, tiny_model, capsys, **keys) -> tuple[int, str]:
    path = write_recipe(tmp_path, model_name_or_path=str(tiny_model), **keys)
    code = cli.main(["check", "--config", str(path)])
    return code, capsys.readouterr().err.strip()


def test_recipe_check_reports_a_bad_benchmark_in_one_line(tmp_path, tiny_model, capsys):
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    good = {
        "name": "mine",
        "dataset": str(data),
        "prompt_column": "question",
        "answer_column": "answer",
    }
    code, err = _check(tmp_path, tiny_model, capsys, benchmarks=["arithmetic", good])
    assert code == 0, err
    cases = [
        ({**good, "prompt_column": "problem"}, "column 'problem' not in"),
        ({**good, "reward": "acuracy"}, "unknown reward 'acuracy'"),
        ({**good, "split": "test"}, "a local file has one split, 'train'"),
        ({**good, "dataset": str(tmp_path / "missing.jsonl")}, "does not exist"),
    ]
    for bench, expected in cases:
        code, err = _check(tmp_path, tiny_model, capsys, benchmarks=[bench])
        assert code == 2, err
        (line,) = err.splitlines()
        assert line.startswith(f"error: {tmp_path / 'recipe.yaml'}: benchmarks[0] (mine): "), line
        assert expected in line, line


def test_hub_benchmark_offline_and_not_cached_is_one_line(
    tmp_path, tiny_model, capsys, monkeypatch
):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # datasets read the variable when it was imported (maybe by an earlier test): without this
    # it tries the hub, and with no network here that takes 20-25 s to fail.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    bench = {"name": "hub", "dataset": "no-such-org/no-such-dataset-xyz", "answer_column": None}
    code, err = _check(tmp_path, tiny_model, capsys, benchmarks=[bench])
    assert code == 2
    (line,) = err.splitlines()
    assert "benchmarks[0] (hub): cannot load hub dataset 'no-such-org/no-such-dataset-xyz'" in line
    assert "HF_HUB_OFFLINE is set and it is not cached" in line


def test_benchmark_keys_have_ranges_and_choices(tmp_path, tiny_model, capsys):
    for keys, expected in (
        ({"benchmark_every": -1}, "key 'benchmark_every': -1 is invalid (must be >= 0)"),
        ({"benchmark_mode": "later"}, "benchmark_mode"),
        ({"benchmark_cpus": 0}, "key 'benchmark_cpus': 0 is invalid (must be >= 1)"),
    ):
        code, err = _check(tmp_path, tiny_model, capsys, benchmarks=["arithmetic"], **keys)
        assert code == 2 and expected in err, err


# ------------------------------------------------------------------ the event log's decisions


def _events(tmp_path: Path) -> list[dict]:
    return list(read_events(tmp_path))


def test_due_steps_handled_and_pending(tmp_path):
    for step in (10, 20, 30, 20, 40):  # 20 twice: a requeued attempt saved it again
        emit(tmp_path, "checkpoint", step=step, path=f"checkpoint-{step}")
    events = _events(tmp_path)
    assert ledger.checkpoint_steps(events) == [10, 20, 30, 40]
    assert ledger.due_steps(events, 1) == [10, 20, 30, 40]
    assert ledger.due_steps(events, 2) == [20, 40]
    assert ledger.due_steps(events, 0) == []
    emit(tmp_path, "eval_submit", step=20, checkpoint="c", benchmarks=["a", "b"], job="5")
    emit(tmp_path, "eval", step=20, benchmark="a", score=0.25)
    emit(tmp_path, "eval_skip", step=10, checkpoint="c", benchmarks=["a"], reason="gone")
    events = _events(tmp_path)
    assert ledger.missing(events, 20, ["a", "b", "c"]) == ["c"]
    assert ledger.missing(events, 20, ["a", "b"], ("eval",)) == ["b"]
    assert ledger.missing(events, 10, ["a", "b"]) == ["b"]
    assert ledger.pending(events) == 1  # b at 20
    emit(tmp_path, "eval", step=20, benchmark="b", score=0.5)
    emit(tmp_path, "eval", step=10, benchmark="b", score=0.1)
    emit(tmp_path, "eval", step=20, benchmark="b", score=0.75)  # scored again by hand
    events = _events(tmp_path)
    assert ledger.pending(events) == 0
    assert ledger.score_series(events) == {"a": [(20, 0.25)], "b": [(10, 0.1), (20, 0.75)]}
    assert ledger.latest_scores(events) == {"a": (20, 0.25), "b": (20, 0.75)}


def _recipe(tmp_path: Path, **script) -> types.SimpleNamespace:
    settings = dict(
        benchmarks=["arithmetic"],
        benchmark_every=1,
        benchmark_at_end=True,
        benchmark_mode="auto",
        benchmark_gpus=0,
        benchmark_cpus=1,
        benchmark_time=10,
        benchmark_sbatch_args=None,
        system_prompt=None,
    )
    return types.SimpleNamespace(
        script=types.SimpleNamespace(**{**settings, **script}),
        output_dir=str(tmp_path / "out"),
        path="recipe.yaml",
        method="grpo",
        overrides=("--output_dir", str(tmp_path / "out")),
    )


def test_sbatch_command_of_an_evaluation_job(tmp_path):
    recipe = _recipe(tmp_path, benchmark_sbatch_args=["--qos=low"])
    out = (tmp_path / "out").absolute()
    command = schedule.sbatch_command(
        recipe, out / "checkpoint-20", 20, ["arithmetic"], {"SLURM_JOB_PARTITION": "gpu"}
    )
    assert command[:2] == ["sbatch", "--parsable"]
    for option in (
        "--job-name=maxent-grpo-eval-out",
        "--dependency=singleton",
        "--time=10",
        "--cpus-per-task=1",
        "--gres=none",  # benchmark_gpus 0 overrides the template's gpu:1
        f"--output={out}/eval/slurm-%j.out",
        "--partition=gpu",
        "--qos=low",
    ):
        assert option in command, command
    script = command.index(str(schedule.EVAL_SBATCH))
    assert command.index("--qos=low") < script and schedule.EVAL_SBATCH.is_file()
    assert command[script + 1 :] == [
        "--method",
        "grpo",
        "--config",
        str(Path("recipe.yaml").absolute()),
        "--checkpoint",
        str(out / "checkpoint-20"),
        "--step",
        "20",
        "--queued",
        "--benchmark",
        "arithmetic",
        "--",
        "--output_dir",
        str(tmp_path / "out"),
    ]
    gpu = schedule.sbatch_command(_recipe(tmp_path, benchmark_gpus=2), out, 30, ["a"], {})
    assert "--gres=gpu:2" in gpu and not any(o.startswith("--partition") for o in gpu)


def test_submission_environment_leaves_the_training_jobs_variables_out():
    env = schedule.submission_environ(
        {
            "SLURM_JOB_ID": "7",
            "SLURM_CONF": "/c",
            "CUDA_VISIBLE_DEVICES": "0",
            "RANK": "0",
            "MASTER_PORT": "1",
            "TORCHELASTIC_RUN_ID": "x",
            "PATH": "/bin",
            "HF_HOME": "/h",
        }
    )
    assert set(env) == {
        "SLURM_CONF",
        "PATH",
        "HF_HOME",
        "MAXENT_GRPO_PYTHON",
        "MAXENT_GRPO_WORLD_SIZE",
    }


def test_mode_auto_is_slurm_inside_a_job_only():
    assert schedule.resolve_mode("auto", {"SLURM_JOB_ID": "3"}) == "slurm"
    assert schedule.resolve_mode("auto", {}) == "inline"
    assert schedule.resolve_mode("inline", {"SLURM_JOB_ID": "3"}) == "inline"


def _fake_sbatch(tmp_path: Path) -> Path:
    """An executable named sbatch that records its arguments and answers a job id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f'echo "$@" >> {tmp_path}/sbatch.calls\n'
        f'n=$(wc -l < {tmp_path}/sbatch.calls); echo "$((100 + n))"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _checkpoint(out: Path, step: int) -> None:
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / CHECKPOINT_MARKER).write_text("{}")
    emit(out, "checkpoint", step=step, path=str(path))


def test_queueing_submits_each_due_checkpoint_once_and_skips_a_removed_one(tmp_path):
    bin_dir = _fake_sbatch(tmp_path)
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "9"}
    recipe = _recipe(tmp_path, benchmark_every=2)
    out = tmp_path / "out"
    for step in (5, 10):
        _checkpoint(out, step)
    schedule.queue_due(recipe, environ=environ)
    schedule.queue_due(recipe, environ=environ)  # a requeued job's start: nothing new
    _checkpoint(out, 15)
    _checkpoint(out, 20)
    (out / "checkpoint-20" / CHECKPOINT_MARKER).unlink()  # rotated away before queueing
    schedule.queue_due(recipe, environ=environ)
    calls = (tmp_path / "sbatch.calls").read_text().splitlines()
    assert len(calls) == 1 and "--step 10" in calls[0]
    events = _events(out)
    submits = [(e["step"], e["job"]) for e in events if e["event"] == "eval_submit"]
    assert submits == [(10, "101")]
    (skip,) = [e for e in events if e["event"] == "eval_skip"]
    assert skip["step"] == 20 and "removed by save_total_limit" in skip["reason"]
    # The final model: its own job unless a due checkpoint holds the same step.
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    schedule.queue_due(recipe, final=True, environ=environ)
    assert len((tmp_path / "sbatch.calls").read_text().splitlines()) == 1
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 22}))
    (out / "config.json").write_text("{}")  # the final model is saved
    schedule.queue_due(recipe, final=True, environ=environ)
    calls = (tmp_path / "sbatch.calls").read_text().splitlines()
    assert len(calls) == 2 and f"--checkpoint {out.absolute()} --step 22" in calls[1]


def test_a_refused_submission_is_an_event_not_an_error(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/bash\necho 'sbatch: error: Invalid qos' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = tmp_path / "out"
    _checkpoint(out, 5)
    schedule.queue_due(_recipe(tmp_path), environ=environ)
    (fail,) = [e for e in _events(out) if e["event"] == "eval_fail"]
    assert fail["step"] == 5 and fail["reason"] == "not queued: sbatch: error: Invalid qos"


# ------------------------------------------------------------------ runs and plot


def _scored_run(tmp_path: Path) -> Path:
    out = tmp_path / "outputs" / "r1"
    emit(out, "attempt_start", method="grpo", recipe="r", job="7", attempt=0, host="h")
    for step in range(1, 5):
        emit(out, "step", step=step, metrics={"reward": step / 10}, max_steps=4)
    emit(out, "eval", step=2, benchmark="arithmetic", score=0.25)
    emit(out, "eval", step=4, benchmark="arithmetic", score=0.5)
    emit(out, "eval", step=4, benchmark="digits", score=0.125)
    emit(out, "eval_submit", step=6, checkpoint="c", benchmarks=["arithmetic"], job="8")
    return out


def test_runs_shows_the_newest_score_per_benchmark(tmp_path):
    _scored_run(tmp_path)
    (run,) = collect_runs([tmp_path / "outputs"], open_logs=())
    assert run.evals == {
        "arithmetic": {"step": 4, "score": 0.5},
        "digits": {"step": 4, "score": 0.125},
    }
    assert run.evals_queued == 1
    header, row = format_table([run]).splitlines()
    assert "EVAL" in header.split()
    assert "arithmetic 0.5@4, digits 0.125@4, +1 queued" in row


def test_plot_draws_scores_beside_the_reward(tmp_path):
    out = _scored_run(tmp_path)
    png, table, info = plot_run(str(out), tmp_path / "p.png")
    assert info["panels"][:2] == ["Reward", "Benchmark scores"]
    assert png.read_bytes().startswith(b"\x89PNG")
    rows = list(csv.DictReader(table.open()))
    assert [r["eval/arithmetic"] for r in rows] == ["", "0.25", "", "0.5"]
    assert [r["eval/digits"] for r in rows] == ["", "", "", "0.125"]


# ------------------------------------------------------------------ W&B (offline / disabled)


def _wandb_recipe(tmp_path: Path) -> types.SimpleNamespace:
    training = types.SimpleNamespace(
        report_to=["wandb"], wandb_project="p", wandb_entity=None, wandb_run_group=None
    )
    return types.SimpleNamespace(training=training, output_dir=str(tmp_path / "run1"))


SCORES = [
    {"step": 20, "benchmark": "arithmetic", "score": 0.25},
    {"step": 20, "benchmark": "digits", "score": 0.5},
]


def test_scores_reach_an_offline_wandb_run_of_their_own(tmp_path, monkeypatch):
    from helpers.wandb_files import history
    from maxent_grpo.evaluate.run import report_wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_RUN_ID", "training-run")  # inherited from the training job
    monkeypatch.setenv("WANDB_SILENT", "true")
    try:
        report_wandb(_wandb_recipe(tmp_path), SCORES)
    finally:
        import wandb

        wandb.teardown()  # ends this process's wandb service (its token is in os.environ)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert "training-run" not in run_dir.name  # a run of its own, not the training run
    deadline = time.monotonic() + 10  # wandb's service may still be writing the file
    while not (rows := [r for r in history(run_dir) if "eval/arithmetic" in r]):
        assert time.monotonic() < deadline, "no eval row in the offline run"
        time.sleep(0.2)
    (row,) = rows
    assert (row["eval/arithmetic"], row["eval/digits"], row["train/global_step"]) == (0.25, 0.5, 20)


def test_wandb_disabled_or_not_asked_for_writes_nothing(tmp_path, monkeypatch):
    from maxent_grpo.evaluate.run import report_wandb

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    report_wandb(_wandb_recipe(tmp_path), SCORES)
    recipe = _wandb_recipe(tmp_path)
    recipe.training.report_to = []
    monkeypatch.setenv("WANDB_MODE", "offline")
    report_wandb(recipe, SCORES)
    assert not (tmp_path / "wandb").exists()


def test_eval_reads_a_recipe_whose_batch_needs_several_processes(tmp_path, tiny_model):
    from maxent_grpo.evaluate.command import load_recipe
    from maxent_grpo.launch.launcher import RunRequest

    # 4 completions per process x 2 processes = one group of 8: fine for training on 2.
    path = write_recipe(
        tmp_path,
        model_name_or_path=str(tiny_model),
        per_device_train_batch_size=4,
        num_generations=8,
        benchmarks=["arithmetic"],
    )
    recipe = load_recipe(RunRequest(recipe=str(path)))
    assert recipe.world_size == 8 and recipe.script.benchmarks == ["arithmetic"]
