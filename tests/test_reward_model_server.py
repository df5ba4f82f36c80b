"""A reward model on its own GPUs (reward_model_gpus): the plan's split and refusals (pure),
the server's scoring against the model scored text by text, its start-up bound, and the
trainers' client for it. The real server process in a training run: test_remote_rewards.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys

import pytest

from helpers.paths import MAXENT_GRPO
from helpers.recipes import small_recipe
from helpers.reward_models import tiny_classifier
from helpers.runs import run
from maxent_grpo.launch.plan import Environment, PlanError, Ports, RewardModelPlan, make_plan
from maxent_grpo.launch.reward_server import RewardModelServer
from maxent_grpo.recipe import read_recipe
from maxent_grpo.rewards import get_reward_funcs
from maxent_grpo.rewards.example_server import make_server, serve_in_thread
from maxent_grpo.rewards.model_server import RewardModel
from maxent_grpo.rewards.remote import REWARD_MODEL_VARIABLE, RemoteReward
from maxent_grpo.rundir.events import read_events
from maxent_grpo.vllm_health import ServerError

PORTS = Ports(vllm=18000, vllm_group=151216, main_process=29555, reward_model=18001)
RM = (
    dataclasses.replace(read_recipe([]), path="r.yaml")
    .with_values(model_name_or_path="org/model", reward_funcs=["answer_match", "model:org/rm"])
    .with_values(reward_model_gpus=2)
)
SERVER = RM.with_values(use_vllm=True, vllm_mode="server")


def gpus(n: int) -> Environment:
    return Environment(gpus=tuple(str(i) for i in range(n)))


def plan_error(environment: Environment, recipe) -> str:
    with pytest.raises(PlanError) as info:
        make_plan(environment, recipe, PORTS)
    assert "\n" not in str(info.value)
    return str(info.value)


# --- the plan (pure) ----------------------------------------------------------------------


def test_the_server_takes_the_last_gpus_and_the_trainers_get_its_url():
    plan = make_plan(gpus(8), SERVER, PORTS)
    rm = plan.reward_model
    assert rm.gpus == ("6", "7") and rm.env["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert plan.server.gpus == ("0",)
    assert plan.train.gpus == ("1", "2", "3", "4", "5") and plan.train.num_processes == 5
    assert plan.idle == ()  # every GPU serves, trains or scores
    assert plan.train.env[REWARD_MODEL_VARIABLE] == "http://127.0.0.1:18001/score"
    assert rm.command[-6:] == ("--model", "org/rm", "--port", "18001", "--host", "127.0.0.1")
    text = plan.describe()
    assert "reward model server: node localhost, GPUs 6,7, a model copy each" in text
    assert "health: http://127.0.0.1:18001/health (timeout 1200s: vllm_server_timeout)" in text


def test_no_key_no_server_and_the_trainers_score_in_process():
    plan = make_plan(gpus(8), SERVER.with_values(reward_model_gpus=0), PORTS)
    assert plan.reward_model is None and REWARD_MODEL_VARIABLE not in plan.train.env
    assert plan.train.gpus == tuple(str(i) for i in range(1, 8))
    assert "reward model server" not in plan.describe()


def test_without_gpus_it_runs_on_cpu_beside_the_trainers():
    plan = make_plan(Environment(), RM, PORTS)
    assert plan.reward_model.gpus == () and plan.reward_model.env["OMP_NUM_THREADS"] == "1"
    assert plan.device == "cpu" and REWARD_MODEL_VARIABLE in plan.train.env
    assert "reward model server: node localhost, CPU" in plan.describe()


@pytest.mark.parametrize(
    "environment, recipe, words",
    [
        (gpus(3), SERVER, "reward_model_gpus: 2 + vLLM server 1 + training at least 1 = 4 GPUs"),
        (gpus(2), RM, "reward_model_gpus: 2 + training at least 1 = 3 GPUs, but the job has 2"),
        (
            Environment(gpus=("0", "1", "2", "3"), nodes=("n0", "n1")),
            RM,
            "reward_model_gpus: 2 on 2 nodes",
        ),
        (gpus(8), RM.with_values(reward_funcs=["answer_match"]), "has no model: entry"),
        (
            gpus(8),
            RM.with_values(reward_funcs=["model:a/b", "model:c/d"]),
            "has 2 model: entries",
        ),
        (gpus(8), dataclasses.replace(RM, method="sft"), "with method sft, which scores nothing"),
    ],
)
def test_a_plan_that_does_not_fit_is_refused_in_one_line(environment, recipe, words):
    assert words in plan_error(environment, recipe)


# --- the server's scoring -----------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_model):
    """Saved without a pad token id, as many hub reward models are: the server must set it."""
    folder = tiny_classifier(tmp_path_factory.mktemp("rm") / "rm", tiny_model)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": None}))
    return folder


def test_batched_scores_equal_each_text_scored_alone(classifier):
    """Right padding must not move the score: the model reads the last non-pad token."""
    import torch

    scorer = RewardModel(str(classifier), ["cpu", "cpu"], batch=3)
    chat = [{"role": "user", "content": "What is 2 plus 3?"}]
    body = {
        "prompts": ["1 + 1 =", "What is", *[chat] * 3],
        "completions": [
            " 2",
            " the sum of 40 plus 2? 42",
            *[[{"role": "assistant", "content": c}] for c in ("5", "4 apples", "")],
        ],
    }
    scores = scorer(body)
    tokenizer, model = scorer.tokenizer, scorer.models[0]
    texts = ["1 + 1 = 2", "What is the sum of 40 plus 2? 42"] + [
        tokenizer.apply_chat_template(chat + [{"role": "assistant", "content": c}], tokenize=False)
        for c in ("5", "4 apples", "")
    ]
    with torch.inference_mode():
        alone = [
            model(**tokenizer(text=[t], return_tensors="pt", add_special_tokens=False))
            .logits[0, 0]
            .item()
            for t in texts
        ]
    assert scores == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 6) for s in scores)) == len(scores)  # a classifier with spread


def test_the_trainers_score_a_served_model_through_its_server(classifier, monkeypatch):
    """REWARD_MODEL_VARIABLE set (the plan's): the model: entry is a RemoteReward to it,
    logged under TRL's name for the model, its scores the server's."""
    scorer = RewardModel(str(classifier), ["cpu"])
    srv = make_server(0, scorer)
    serve_in_thread(srv)
    try:
        url = f"http://127.0.0.1:{srv.server_port}/score"
        monkeypatch.setenv(REWARD_MODEL_VARIABLE, url)
        (reward,) = get_reward_funcs([f"model:{classifier}"])
        assert isinstance(reward, RemoteReward) and reward.url == url
        assert reward.__name__ == classifier.name
        body = {"prompts": ["1 + 1 =", "2 + 2 ="], "completions": [" 2", " 4"]}
        assert reward(body["completions"], prompts=body["prompts"]) == scorer(body)
    finally:
        srv.shutdown()
        srv.server_close()


# --- the start-up wait --------------------------------------------------------------------


def _plan(code: str, timeout: float) -> RewardModelPlan:
    command = (sys.executable, "-c", code)
    return RewardModelPlan("127.0.0.1", (), 9, "m", command, {}, timeout)


def test_a_server_that_exits_or_never_answers_stops_the_start_in_one_line(tmp_path):
    dead = RewardModelServer(
        _plan("print('no model here'); raise SystemExit(3)", 30), tmp_path / "a.log", {}
    )
    with pytest.raises(ServerError) as info:
        dead.start().wait_until_healthy()
    assert str(info.value).startswith("reward model server exited with code 3 before it answered")
    assert "no model here" in str(info.value) and info.value.outcome == "user_error"
    killed = RewardModelServer(
        _plan("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 30), tmp_path / "k.log", {}
    )
    with pytest.raises(ServerError) as info:
        killed.start().wait_until_healthy()
    assert str(info.value).startswith("reward model server was killed by signal 9 before it")
    assert info.value.outcome == "reward_server_lost"  # retried as a loss mid-run is
    slow = RewardModelServer(_plan("import time; time.sleep(60)", 0.5), tmp_path / "b.log", {})
    try:
        with pytest.raises(
            ServerError, match=r"not healthy after 0.5s \(vllm_server_timeout\)"
        ) as info:
            slow.start().wait_until_healthy()
    finally:
        slow.stop(grace=1)
    assert slow.child.poll() is not None
    assert info.value.outcome == "user_error"  # a slow start: the hint says what to change
    # Stopped (SIGSTOP) while it starts: a hang, retried (bench/chaos.py found it permanent).
    stopped = RewardModelServer(_plan("import time; time.sleep(60)", 0.5), tmp_path / "s.log", {})
    try:
        os.kill(stopped.start().child.pid, signal.SIGSTOP)
        with pytest.raises(ServerError, match=r"is stopped \(SIGSTOP\?\), a hang") as info:
            stopped.wait_until_healthy()
    finally:
        stopped.stop(grace=1)
    assert info.value.outcome == "hang" and stopped.child.poll() is not None


def test_a_server_that_cannot_load_its_model_stops_the_run_before_any_trainer(tmp_path, tiny_model):
    """`maxent-grpo run` with a model: directory that says it is a classifier but holds no
    weights: the launcher's server exits, the attempt ends in one line with the server's log
    tail (a user_error, exit 2), and no trainer was started."""
    broken = tmp_path / "rm"
    broken.mkdir()
    (broken / "config.json").write_text(
        json.dumps({"architectures": ["Qwen2ForSequenceClassification"], "id2label": {"0": "s"}})
    )
    recipe = small_recipe(
        tmp_path,
        tiny_model,
        reward_funcs=[f"model:{broken}"],
        reward_model_gpus=1,
        reward_weights=None,
    )
    logs = tmp_path / "logs"
    result = run(
        [MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)], timeout=300
    )
    out = result.stdout + result.stderr
    assert result.returncode == 2, out[-3000:]
    assert "error: reward model server exited with code 1 before it answered" in out
    assert "reward model server healthy" not in out and not list(logs.glob("*_train.log"))
    (outcome,) = [e for e in read_events(tmp_path / "out") if e["event"] == "outcome"]
    assert outcome["outcome"] == "user_error"


# --- death mid-run ------------------------------------------------------------------------


def test_a_server_that_dies_mid_run_is_its_own_class_and_named_in_one_line(tmp_path):
    """The launcher's wait (watch_training) stops the trainers once the server is gone; the
    attempt is `reward_server_lost`, the same loss twice is permanent, and a stop signal of
    the launcher's (a preemption's SIGTERM also reaches the server) wins. The real process
    killed in a training run: test_remote_rewards.py."""
    from maxent_grpo.launch.outcomes import classify, is_permanent
    from maxent_grpo.launch.processes import Child
    from maxent_grpo.launch.watch import watch_training

    server = RewardModelServer(
        _plan("print('loaded'); raise SystemExit(5)", 30), tmp_path / "rm.log", {}
    )
    server.start().child.wait_up_to(30)
    trainer = Child("train", ["sleep", "605"], tmp_path / "train.log")
    watched = watch_training(trainer, (server,), None, poll=0.1)
    assert watched.code == -15  # stopped by the launcher, not waited for
    line = "reward model server http://127.0.0.1:9/score (model m) exited with code 5 while "
    line += f"training ran; its log: {tmp_path / 'rm.log'}"
    assert (
        watched.reward_server_died.splitlines()[0] == line
        and "loaded" in watched.reward_server_died
    )
    found = classify(tmp_path, watched, None, None, tmp_path / "train.log")
    assert (found.kind, found.reason, found.code) == ("reward_server_lost", line, 1)
    assert found.transient and not is_permanent(found)
    again = classify(tmp_path, watched, None, {"outcome": found.kind, "reason": line}, "x")
    assert again.reason == f"the same error twice: {line}" and is_permanent(again)
    # The trainers' own record of the launcher's SIGTERM is no stop; a signal to us is one.
    trainers_stop = ("SIGTERM received by the training processes", None, None, 0)
    assert classify(tmp_path, watched, trainers_stop, None, "x").kind == "reward_server_lost"
    preempted = ("SIGTERM received", "SIGTERM", None, 0)
    assert classify(tmp_path, watched, preempted, None, "x").kind == "stopped"
    cancelled = watch_training(
        Child("t", ["true"], tmp_path / "t.log"),
        (server,),
        None,
        cancelled=lambda: 15,
    )
    assert cancelled.reward_server_died is None  # a stop signal came: the server's end is no cause
