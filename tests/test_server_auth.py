"""Issue 57: the run's token, checked before anything runs (in-process, < 2 s).

TokenMiddleware is the ASGI layer vLLM's --middleware puts outermost (the real vLLM server's
refusals: tests/vllm_server/test_vllm_auth.py); the reward servers (example_server, the
reward-model server) check it with the same `authorized`; the trainers send it
(reward_server_token_env, the reward-model client).
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest

from maxent_grpo.rewards import RewardError, get_reward_funcs
from maxent_grpo.rewards.example_server import make_server, serve_in_thread
from maxent_grpo.rewards.remote import RewardServerError
from maxent_grpo.server_auth import (
    TOKEN_VARIABLE,
    TokenMiddleware,
    auth_headers,
    authorized,
    new_token,
    with_token,
)

TOKEN = new_token()


def call(middleware, scope: dict) -> tuple[list[dict], list[dict]]:
    """(messages sent, scopes the app saw) for one request through `middleware`."""
    seen, sent = [], []

    async def app(scope, receive, send):
        seen.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(app)(scope, receive, send))
    return sent, seen


def http(path: str, method: str = "POST", header: bytes | None = None, kind: str = "http"):
    headers = [(b"authorization", header)] if header is not None else []
    return {"type": kind, "method": method, "path": path, "headers": headers}


def guarded(app):
    return TokenMiddleware(app, token=TOKEN)


@pytest.mark.parametrize(
    "path",
    ["/v1/models", "/collective_rpc", "/reset_prefix_cache", "/v1/load_lora_adapter",
     "/init_weight_transfer_engine", "/update_weights", "/sleep", "/metrics", "/server_info",
     "/health/", "/docs", "/ping"],
)  # fmt: skip
def test_every_route_without_the_token_is_refused_before_the_app_runs(path):
    for header in (None, b"Bearer wrong", f"Basic {TOKEN}".encode(), TOKEN.encode(), b"Bearer "):
        sent, seen = call(guarded, http(path, header=header))
        assert seen == [] and sent[0]["status"] == 401, (path, header)
    sent, seen = call(guarded, http(path, header=f"Bearer {TOKEN}".encode()))
    assert len(seen) == 1 and sent[0]["status"] == 200


def test_health_is_open_for_get_and_head_only():
    for method in ("GET", "HEAD"):
        sent, seen = call(guarded, http("/health", method))
        assert len(seen) == 1
    sent, seen = call(guarded, http("/health", "POST"))
    assert seen == [] and sent[0]["status"] == 401
    sent, seen = call(guarded, http("/health", "OPTIONS"))
    assert seen == [] and sent[0]["status"] == 401


def test_a_websocket_without_the_token_is_closed():
    sent, seen = call(guarded, http("/v1/realtime", "GET", kind="websocket"))
    assert seen == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_without_a_token_configured_every_route_but_health_is_refused(monkeypatch):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    for header in (None, b"Bearer ", b"Bearer None"):
        sent, seen = call(TokenMiddleware, http("/v1/models", "GET", header=header))
        assert seen == [] and sent[0]["status"] == 401
    monkeypatch.setenv(TOKEN_VARIABLE, TOKEN)  # read when vLLM builds the app
    sent, seen = call(TokenMiddleware, http("/v1/models", "GET", f"Bearer {TOKEN}".encode()))
    assert len(seen) == 1


def test_tokens_are_fresh_and_replace_an_inherited_one():
    assert len({new_token() for _ in range(50)}) == 50 and len(TOKEN) >= 40
    assert with_token({TOKEN_VARIABLE: "old", "A": "1"}, TOKEN) == {TOKEN_VARIABLE: TOKEN, "A": "1"}
    assert auth_headers({TOKEN_VARIABLE: TOKEN}) == {"Authorization": f"Bearer {TOKEN}"}
    assert auth_headers({}) == {}
    assert not authorized(None, TOKEN) and not authorized("Bearer x", None)


@pytest.fixture
def token_server():
    seen = []

    def scorer(body):
        seen.append(body)
        return [1.0] * len(body["completions"])

    server = make_server(0, scorer, token=TOKEN)
    serve_in_thread(server)
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()
    server.server_close()


def status(url: str, data: bytes | None = None, headers: dict | None = None) -> int:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_reward_server_with_a_token_refuses_others_and_scores_the_run(token_server, monkeypatch):
    base, seen = token_server
    assert status(f"{base}/health") == 200
    assert status(f"{base}/score", b'{"completions": ["a"], "prompts": [null]}') == 401
    assert status(f"{base}/other") == 401
    assert seen == []  # refused before the scorer ran
    # Without reward_server_token_env the trainers send nothing: one line, not a retry.
    (unsent,) = get_reward_funcs([f"{base}/score"], reward_server_retries=3)
    with pytest.raises(RewardServerError, match="HTTP 401"):
        unsent(["a"], prompts=["p"])
    monkeypatch.setenv("MY_REWARD_TOKEN", TOKEN)
    (reward,) = get_reward_funcs([f"{base}/score"], reward_server_token_env="MY_REWARD_TOKEN")
    assert reward(["a", "b"], prompts=["p", "q"]) == [1.0, 1.0] and len(seen) == 1


def test_reward_server_token_env_names_a_set_variable(monkeypatch):
    monkeypatch.delenv("MY_REWARD_TOKEN", raising=False)
    url = "http://127.0.0.1:9/score"
    with pytest.raises(RewardError) as caught:
        get_reward_funcs([url], reward_server_token_env="MY_REWARD_TOKEN")
    message = str(caught.value)
    assert "\n" not in message and "reward_server_token_env: MY_REWARD_TOKEN" in message
    with pytest.raises(RewardError, match="must name an environment variable"):
        get_reward_funcs([url], reward_server_token_env="not a name")
