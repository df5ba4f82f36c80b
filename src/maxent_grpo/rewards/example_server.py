"""A reward server that keeps the contract of docs/tools.md, on the standard library only.

    python -m maxent_grpo.rewards.example_server --port 8765    # POST http://127.0.0.1:8765/score

It scores the share of digits in each completion (the `digit_fraction` built-in, which a tiny
model can climb): an example to copy, and the server the tool smoke recipe and the tests use.
Write your own in any language; only the JSON contract matters.

It binds loopback unless told otherwise (--host). With `--token-env NAME` it answers only
requests that carry `Authorization: Bearer $NAME` (the recipe's reward_server_token_env: NAME
makes the trainers send it); GET /health stays open. docs/security.md.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from maxent_grpo.rewards.common import completion_text
from maxent_grpo.server_auth import TOKEN_VARIABLE, authorized

Scorer = Callable[[dict[str, Any]], Sequence[float | None]]


def digit_share(body: dict[str, Any]) -> list[float]:
    texts = [completion_text(c) for c in body["completions"]]
    return [sum(ch.isdigit() for ch in t) / len(t) if t else 0.0 for t in texts]


def make_server(
    port: int = 0, scorer: Scorer = digit_share, host: str = "127.0.0.1", token: str | None = None
):
    """A ThreadingHTTPServer answering POST /score by the contract; not started. With a
    token, a request without it is answered 401 before its body is read."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            if token is not None and not authorized(self.headers.get("Authorization"), token):
                self.close_connection = True  # its body is never read
                return self._answer({"error": "Unauthorized"}, 401)
            try:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                answer, code = {"rewards": list(scorer(body))}, 200
            except (ValueError, KeyError, TypeError) as exc:
                answer, code = {"error": f"{type(exc).__name__}: {exc}"}, 400
            except Exception as exc:  # noqa: BLE001 - the scorer failed: 5xx, which is retried
                answer, code = {"error": f"{type(exc).__name__}: {exc}"}, 500
            self._answer(answer, code)

        def do_GET(self):  # noqa: N802 - http.server's name
            # The launcher's start-up wait for a reward-model server (model_server.py).
            if self.path.rstrip("/") == "/health":
                self._answer({"status": "ok"}, 200)
            elif token is not None and not authorized(self.headers.get("Authorization"), token):
                self._answer({"error": "Unauthorized"}, 401)
            else:
                self._answer({"error": f"no GET {self.path}; POST to score"}, 404)

        def _answer(self, answer: dict[str, Any], code: int) -> None:
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # one line per request would flood a training log
            pass

    return ThreadingHTTPServer((host, port), Handler)


def serve_in_thread(server) -> threading.Thread:
    # A short poll: shutdown() returns within it (tests stop servers mid-run).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    return thread


def server_token(variable: str | None) -> str | None:
    """The token in environment variable `variable` (None: no check); unset: exit, one line."""
    if variable is None:
        return None
    token = os.environ.get(variable)
    if not token:
        raise SystemExit(f"--token-env {variable}: {variable} is not set; export the token")
    return token


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--token-env", help=f"check this variable's token (e.g. {TOKEN_VARIABLE})")
    args = parser.parse_args(argv)
    server = make_server(args.port, host=args.host, token=server_token(args.token_env))
    print(f"reward server on http://{args.host}:{server.server_port}/score", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
