"""The trainer's connection to the vLLM server, deferred to its first use (fast: a stand-in
HTTP server, no vLLM). The real server is in tests/vllm_server/."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from helpers.procs import LOADED_MARGIN
from maxent_grpo.launch.processes import free_port
from maxent_grpo.train.vllm_connect import deferred_generation_class, wait_for_server
from maxent_grpo.vllm_health import ServerError


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args):
        pass


def serve_later(port: int, delay: float, status: int = 200) -> ThreadingHTTPServer:
    """A /health that starts answering `status` after `delay` seconds (a booting server)."""
    handler = type("Handler", (_Health,), {"status": status})
    holder = {}

    def run():
        time.sleep(delay)
        holder["server"] = ThreadingHTTPServer(("127.0.0.1", port), handler)
        holder["server"].serve_forever()

    threading.Thread(target=run, daemon=True).start()
    return holder


def stop(holder) -> None:
    if "server" in holder:
        holder["server"].shutdown()
        holder["server"].server_close()


def test_wait_for_server_returns_once_healthy():
    port = free_port()
    holder = serve_later(port, 1.0)
    try:
        took = wait_for_server(f"http://127.0.0.1:{port}", timeout=30, poll=0.1)
    finally:
        stop(holder)
    assert 1.0 <= took < 1.0 + LOADED_MARGIN


@pytest.mark.parametrize("status, answer", [(503, "last answer HTTP 503"), (None, "no answer")])
def test_wait_for_server_is_bounded_and_says_so_in_one_line(status, answer):
    port = free_port()
    holder = serve_later(port, 0, status) if status else {}
    start = time.monotonic()
    try:
        with pytest.raises(ServerError) as info:
            wait_for_server(f"http://127.0.0.1:{port}/", timeout=1.5, poll=0.1)
    finally:
        stop(holder)
    assert 1.5 <= time.monotonic() - start < 1.5 + LOADED_MARGIN
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"vLLM server not healthy after 1.5s (vllm_server_timeout) at "
        f"http://127.0.0.1:{port}/health ({answer})"
    )
    assert message.endswith("otherwise check that a vLLM server runs there")


def unconnected(port: int, opened: list):
    """A DeferredVLLMGeneration as TRL's __init__ leaves it in server mode (no TRL init)."""
    cls = deferred_generation_class()
    generation = cls.__new__(cls)
    generation.mode = "server"
    generation.server_base_url = f"http://127.0.0.1:{port}"
    generation.server_timeout = 30
    info = {"model_config": {"logprobs_mode": "raw_logprobs"}}
    client = SimpleNamespace(generate=lambda: "completions", get_server_info=lambda: info)

    def open_client(base_url):
        opened.append(base_url)
        generation.vllm_client = client

    generation._open_client = open_client
    generation._init_vllm()  # server mode: connects nothing yet
    return generation, client


def test_the_client_connects_at_first_use_after_the_server_answers(caplog, capsys):
    port = free_port()
    opened = []
    generation, client = unconnected(port, opened)
    # GRPOTrainer.__init__'s logprobs-mode check: answered without the server.
    info = generation.vllm_client.get_server_info()
    assert info["model_config"]["logprobs_mode"] == "processed_logprobs" and not opened
    holder = serve_later(port, 0.5)
    try:
        with caplog.at_level("INFO"):
            assert generation.vllm_client.generate() == "completions"  # waits, then connects
    finally:
        stop(holder)
    assert opened == [f"http://127.0.0.1:{port}"]
    assert generation.vllm_client is client and generation.connect() is client
    assert opened == [f"http://127.0.0.1:{port}"]  # once
    assert "Waiting for the vLLM server" in capsys.readouterr().out
    assert "--logprobs-mode raw_logprobs" in caplog.text  # the deferred check ran


def test_first_use_without_a_server_fails_after_vllm_server_timeout():
    generation, _ = unconnected(free_port(), opened := [])
    generation.server_timeout = 1
    with pytest.raises(ServerError, match=r"not healthy after 1s \(vllm_server_timeout\)"):
        generation.vllm_client.generate()
    assert not opened
