"""Issue 57 on a real vLLM CPU server: a stranger without the run's token is refused on every
route, and a refused weight reload leaves the server's logprobs as they were.

The session's disk-sync server (shared_servers.py, started as the launcher starts it: bound to
loopback, TokenMiddleware through --middleware, the token in its environment), asked from
loopback. The launcher's own per-attempt token during a real run, from loopback and `ps`:
test_vllm_launcher.py; from another node's namespace: tests/slurm/test_multinode_servers.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers.auth import session
from helpers.refusals import not_refused, strangers_answers
from maxent_grpo.train.vllm_sync import reload_weights
from maxent_grpo.vllm_health import probe

pytestmark = pytest.mark.vllm

TEXT = "What is the sum of 12 plus 30? <think> 12 plus 30 </think> <answer> 42 </answer>"


def prompt_logprobs(http, url: str, ids: list[int]) -> list[float]:
    model = http.get(f"{url}/v1/models", timeout=300).json()["data"][0]["id"]
    body = {"model": model, "prompt": [ids], "max_tokens": 1, "prompt_logprobs": 0}
    response = http.post(f"{url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    per_position = response.json()["choices"][0]["prompt_logprobs"]
    return [per_position[i][str(ids[i])]["logprob"] for i in range(1, len(ids))]


def strangers_weights(tiny_model, folder):
    """The tiny model with other weights: what a stranger would make the server generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    model.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(tiny_model)(TEXT)["input_ids"]


def test_a_stranger_is_refused_everywhere_and_changes_nothing(disk_server, tiny_model, tmp_path):
    url = disk_server.plan.server.url
    assert url.startswith("http://127.0.0.1:")  # one node: loopback only
    http = session()
    ids = strangers_weights(tiny_model, tmp_path / "other")
    ours = SimpleNamespace(base_url=url, session=http)
    reload_weights(ours, tiny_model)  # the base model, whatever earlier tests pushed
    http.post(f"{url}/reset_prefix_cache", timeout=300)
    before = prompt_logprobs(http, url, ids)

    for header in (None, "Bearer not-the-token", "Basic " + http.headers["Authorization"][7:]):
        answers = strangers_answers(url, str(tmp_path / "other"), header)
        assert not not_refused(answers), answers
        assert set(answers.values()) == {401}, answers  # reachable from loopback, and refused
    assert probe(f"{url}/health") == 200  # liveness stays open: it answers 200 and nothing else
    health = http.get(f"{url}/health", headers={"Authorization": ""}, timeout=10)
    assert health.status_code == 200 and health.content == b""

    # The refused reload (and sleep, reset, RPC...) left the server as it was: same logprobs.
    assert prompt_logprobs(http, url, ids) == before
    # The same reload with the token does change them (the check above can fail) ...
    reload_weights(ours, tmp_path / "other")
    http.post(f"{url}/reset_prefix_cache", timeout=300)
    moved = prompt_logprobs(http, url, ids)
    assert max(abs(a - b) for a, b in zip(moved, before, strict=True)) > 1e-3
    # ... and the base model goes back for the tests after this one.
    reload_weights(ours, tiny_model)
    http.post(f"{url}/reset_prefix_cache", timeout=300)
    back = prompt_logprobs(http, url, ids)
    assert max(abs(a - b) for a, b in zip(back, before, strict=True)) < 1e-5
