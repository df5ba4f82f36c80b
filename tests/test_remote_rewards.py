"""Rewards that run elsewhere (rewards/remote.py): a reward server on localhost (a real stdlib
HTTP server in a thread), its failure bounds, `model:` reward models, and one real CPU run
scored by a tiny local classifier served by the launcher, whose server is killed mid-run."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers.paths import MAXENT_GRPO
from helpers.recipes import small_recipe
from helpers.reward_models import tiny_classifier
from helpers.runs import run
from maxent_grpo.rewards import GuardedReward, RewardError, get_reward_funcs
from maxent_grpo.rewards.example_server import make_server, serve_in_thread
from maxent_grpo.rewards.remote import RemoteReward, RewardServerDown, RewardServerError
from maxent_grpo.rundir.events import read_sparse


@pytest.fixture
def server():
    """The example server on a free port, recording each request body; shut down after."""
    bodies: list[dict] = []

    def scorer(body):
        bodies.append(body)
        return [float(len(c)) for c in body["completions"]]

    srv = make_server(0, scorer)
    serve_in_thread(srv)
    srv.bodies = bodies
    srv.url = f"http://127.0.0.1:{srv.server_port}/score"
    yield srv
    srv.shutdown()
    srv.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scripted(answers: list[tuple[int, bytes]], delay: float = 0.0, cut: int = 0):
    """A server answering each POST with the next (status, body); counts requests. cut: the
    answer promises that many more bytes than it sends, then the connection closes."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            code, body = answers[min(self.server.count, len(answers) - 1)]
            self.server.count += 1
            time.sleep(delay)
            try:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body) + cut))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (timeout)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.count = 0
    serve_in_thread(srv)
    return srv, f"http://127.0.0.1:{srv.server_port}/"


def test_server_scores_a_batch_in_one_post_with_prompts_and_columns(server):
    (reward,) = get_reward_funcs([server.url])
    scores = reward(
        ["ab", "abcd"],
        prompts=["p1", "p2"],
        solution=["1", "2"],
        completion_ids=[[1], [2]],
        trainer_state=object(),
        log_metric=print,
    )
    assert scores == [2.0, 4.0]
    (body,) = server.bodies
    assert body == {
        "prompts": ["p1", "p2"],
        "completions": ["ab", "abcd"],
        "columns": {"solution": ["1", "2"]},
    }
    assert reward.__name__ == f"server_127_0_0_1_{server.server_port}_score"


def test_server_down_fails_within_its_bound_with_one_line():
    url = f"http://127.0.0.1:{_free_port()}/score"
    (reward,) = get_reward_funcs([url], reward_server_timeout_seconds=0.5, reward_server_retries=2)
    guarded = GuardedReward(reward, timeout=60)  # as in training: the guard lets it through
    began = time.monotonic()
    with pytest.raises(RewardServerDown) as caught:
        guarded(["a", "b"], prompts=["p", "q"])
    took = time.monotonic() - began
    assert took <= reward.bound_s + 1.0 and reward.bound_s == pytest.approx(3 * 0.5 + 0.5 + 1.0)
    message = str(caught.value)
    assert "\n" not in message and url in message and "3 tries of 0.5s failed" in message


def test_a_server_that_hangs_is_given_up_after_timeout_x_tries():
    srv, url = _scripted([(200, b'{"rewards": [1.0]}')], delay=3.0)
    reward = RemoteReward(url, timeout=0.3, retries=1)
    began = time.monotonic()
    with pytest.raises(RewardServerDown, match="timed out"):
        GuardedReward(reward, timeout=60)(["a"])
    assert time.monotonic() - began < reward.bound_s + 1.0 and srv.count == 2
    srv.shutdown()


def test_an_answer_cut_short_is_retried_then_the_server_is_down():
    srv, url = _scripted([(200, b'{"rewards": [1.0]}')], cut=20)
    with pytest.raises(RewardServerDown, match="2 tries .* failed .*IncompleteRead"):
        RemoteReward(url, timeout=2, retries=1)(["a"])
    assert srv.count == 2
    srv.shutdown()


def test_a_5xx_is_retried_and_a_4xx_or_a_broken_answer_is_not():
    srv, url = _scripted([(503, b"busy"), (200, b'{"rewards": [0.5, null]}')])
    assert RemoteReward(url, timeout=2, retries=2)(["a", "b"]) == [0.5, None]
    assert srv.count == 2
    srv.shutdown()
    for answer, words in (
        ((400, b"bad"), "HTTP 400"),
        ((200, b"not json"), "not JSON"),
        ((200, b'{"rewards": [1.0]}'), "got 1 rewards"),
        ((200, b'{"rewards": [1.0, "x"]}'), "'x' is not a finite number"),
    ):
        srv, url = _scripted([answer])
        with pytest.raises(RewardServerError, match=words):
            GuardedReward(RemoteReward(url, timeout=2, retries=2), timeout=60)(["a", "b"])
        assert srv.count == 1
        srv.shutdown()


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://", "no host"),
        ("http://host:port/x", "Port could not be cast"),
        ("https://host/x?key=1", "query, fragment or space"),
    ],
)
def test_a_bad_server_url_is_refused_in_one_line(url, words):
    with pytest.raises(RewardError, match=words):
        get_reward_funcs([url])


def _config(folder: Path, **values) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def test_model_entries_are_checked_and_passed_to_trl_as_names(tmp_path):
    # `check` reads config.json only; the real classifier is scored in the run below.
    one = _config(
        tmp_path / "rm", architectures=["Qwen2ForSequenceClassification"], id2label={"0": "s"}
    )
    assert get_reward_funcs([f"model:{one}"]) == [str(one)]
    assert get_reward_funcs(["model:org/reward-model"]) == ["org/reward-model"]
    with pytest.raises(RewardError, match="no config.json"):
        get_reward_funcs([f"model:{tmp_path / 'missing'}"])
    two = _config(tmp_path / "rm2", architectures=["Qwen2ForSequenceClassification"])
    with pytest.raises(RewardError, match="has 2 labels; a reward model has one"):
        get_reward_funcs([f"model:{two}"])
    lm = _config(tmp_path / "lm", architectures=["Qwen2ForCausalLM"])
    with pytest.raises(RewardError, match="is a Qwen2ForCausalLM, not a sequence-classification"):
        get_reward_funcs([f"model:{lm}"])
    for spec, words in (("model:", "no model"), ("model:a b", "neither a local directory")):
        with pytest.raises(RewardError, match=words):
            get_reward_funcs([spec])


def _kill_reward_model_server(model: Path) -> int:
    """SIGKILL the launcher's reward-model server of `model` (found by its command line)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"maxent_grpo.rewards.model_server" in argv and str(model).encode() in argv:
            os.kill(int(proc.name), signal.SIGKILL)
            return int(proc.name)
    raise AssertionError(f"no reward model server of {model} is running")


@pytest.mark.integration
def test_run_scored_by_a_reward_model_whose_server_is_killed_mid_run(tmp_path, tiny_model):
    """One real CPU run (launcher, one process): a tiny local classifier, served by the
    launcher's reward-model server (reward_model_gpus: 1, on CPU here), and a reward server on
    localhost score the first steps; during step 3 the reward-model server is killed
    (SIGKILL). The launcher ends the attempt as `reward_server_lost`, one line naming that
    server and its log, whether its own poll or the trainers' RewardServerDown saw the loss
    first, within a bound (never a hang). (reward_model_gpus: 0, TRL's own in-trainer scoring
    of the model, is TRL's code; its names are checked above. A reward server that stays down:
    test_server_down_fails_within_its_bound_with_one_line.)"""
    model = tiny_classifier(tmp_path / "rm", tiny_model)
    killed: list[tuple[int, float]] = []

    def scorer(body):
        if len(seen) == 2:  # step 3: the reward model scored it already (first in the list)
            killed.append((_kill_reward_model_server(model), time.monotonic()))
        seen.append(body)
        return [float(len(c)) / 10 for c in body["completions"]]

    seen: list[dict] = []
    srv = make_server(0, scorer)
    serve_in_thread(srv)
    url = f"http://127.0.0.1:{srv.server_port}/score"
    recipe = small_recipe(
        tmp_path,
        tiny_model,
        reward_funcs=[f"model:{model}", url],
        reward_model_gpus=1,
        reward_weights=[1.0, 1.0],
        reward_server_timeout_seconds=1.0,
        reward_server_retries=1,
        max_steps=8,
        num_processes=1,
        env={"OMP_NUM_THREADS": "1"},
    )
    logs = tmp_path / "logs"
    cmd = [MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)]
    result = run(cmd, timeout=600)
    ended = time.monotonic()
    srv.shutdown()
    srv.server_close()
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert len(killed) == 1 and len(seen) == 3, out[-3000:]
    ((pid, killed_at),) = killed
    assert ended - killed_at < 120, out[-3000:]  # stop, teardown and the outcome; no hang
    events = read_sparse(tmp_path / "out", last_steps=100)
    # The training steps (TRL's end-of-training summary, logged when the launcher's stop ended
    # the trainers rather than their own RewardServerDown, carries no loss).
    steps = [e for e in events if e["event"] == "step" and "loss" in e["metrics"]]
    assert [e["step"] for e in steps] == [1, 2, 3]  # scored before the server went away
    for name in (model.name, f"server_127_0_0_1_{srv.server_port}_score"):
        assert all(f"rewards/{name}/mean" in e["metrics"] for e in steps)
    # Scored by the server the launcher started, healthy before the trainers.
    assert f"reward model server starting (pid {pid})" in out
    assert "reward model server healthy after" in out
    (rm_log,) = logs.glob("*_reward_model.log")
    scored = [line for line in rm_log.read_text().splitlines() if line.startswith("scored ")]
    assert len(scored) == 3, rm_log.read_text()[-2000:]
    (outcome,) = [e for e in events if e["event"] == "outcome"]
    assert outcome["outcome"] == "reward_server_lost", outcome
    rm_url = re.search(r"trainers score model:\S+ through (\S+)", out).group(1)
    assert outcome["reason"] == (
        f"reward model server {rm_url} (model {model}) was killed by signal 9 while training "
        f"ran; its log: {rm_log}"
    )
    assert f"reward_server_lost: {outcome['reason']}" in out
