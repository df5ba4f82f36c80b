"""A stand-in vLLM server in this process, speaking the HTTP TRL's VLLMClient and our weight
sync use (/health, /v1/models, /v1/completions, /collective_rpc reload_weights,
/reset_prefix_cache). Each completion is [weights version, the prompt's first token], so a
test sees which server state answered; the server can be stopped (connection refused) and
started again on its port with the base weights, as a restarted vLLM comes back. `silent`:
every request (/health included) waits without an answer, as a node whose network is cut."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BASE_VERSION = 0


class FakeVLLM:
    def __init__(self, delay: float = 0.0, port: int = 0):
        self.delay = delay  # seconds per completion request
        self.version = BASE_VERSION  # the weights: reload_weights sets it from the path
        self.requests = 0
        self.silent = False
        self.reload_delay = 0.0  # seconds per reload_weights
        self.reloads: list[tuple[float, float]] = []  # each reload's (start, end), monotonic
        self._start(port)

    def _start(self, port: int) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _hold(self) -> None:
                while fake.silent:
                    time.sleep(0.05)

            def do_GET(self):  # noqa: N802 (http.server's naming)
                self._hold()
                if self.path == "/health":
                    return self._answer(200, {})
                if self.path == "/v1/models":
                    return self._answer(200, {"data": [{"id": "fake"}]})
                return self._answer(404, {})

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self._hold()
                if self.path == "/v1/completions":
                    if body.get("max_tokens", 1) < 1:
                        return self._answer(400, {"error": "max_tokens must be at least 1"})
                    time.sleep(fake.delay)
                    fake.requests += 1
                    choices = [
                        {
                            "prompt_token_ids": prompt,
                            "token_ids": [fake.version, prompt[0]],
                            "logprobs": None,
                        }
                        for prompt in body["prompt"]
                        for _ in range(body["n"])
                    ]
                    return self._answer(200, {"choices": choices})
                if self.path == "/collective_rpc":
                    start = time.monotonic()
                    time.sleep(fake.reload_delay)
                    fake.reloads.append((start, time.monotonic()))
                    path = body["kwargs"]["weights_path"]
                    fake.version = int(path.rsplit("-", 1)[-1])
                    return self._answer(200, {})
                if self.path == "/reset_prefix_cache":
                    return self._answer(200, {})
                return self._answer(404, {})

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.http.server_port
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.silent = False  # lets held requests end
        self.http.shutdown()
        self.http.server_close()

    def restart(self) -> None:
        """Back on the same port with the base weights (a restarted server loads the model)."""
        self.version = BASE_VERSION
        self._start(self.port)
