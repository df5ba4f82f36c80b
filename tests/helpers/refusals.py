"""Requests a stranger would send to a run's vLLM server, without the run's token (issue 57).

Each route of vLLM 0.31's API server that reads, changes or spends something: inference,
dev mode (weight reload, cache reset, sleep, RPC to the workers), runtime LoRA, the NCCL
weight-transfer routes, metrics and docs. A refusal is 401 (TokenMiddleware), or no answer at
all (a server bound where the asker cannot reach).
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

ROUTES = (
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/collective_rpc"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/init_weight_transfer_engine"),
    ("POST", "/start_weight_update"),
    ("POST", "/update_weights"),
    ("POST", "/finish_weight_update"),
    ("GET", "/get_world_size"),
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("POST", "/pause"),
    ("GET", "/server_info"),
    ("GET", "/metrics"),
    ("GET", "/version"),
    ("GET", "/load"),
    ("POST", "/tokenize"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/ping"),
    ("OPTIONS", "/v1/models"),
    ("GET", "/health/"),
)


def body_of(path: str, weights: str) -> dict:
    """A body that would do harm if the route ran it."""
    if path == "/collective_rpc":
        return {"method": "reload_weights", "kwargs": {"weights_path": weights}}
    if path.endswith("load_lora_adapter"):
        return {"lora_name": "stranger", "lora_path": weights}
    if path.endswith("completions"):
        return {"model": "x", "prompt": "hi", "max_tokens": 4}
    return {}


def answer(base_url: str, method: str, path: str, body: dict | None, headers: dict) -> int | None:
    """The HTTP status, or None when the connection was refused or cut (nothing answered)."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    try:
        connection.request(
            method, path, body=data, headers={"Content-Type": "application/json", **headers}
        )
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


def strangers_answers(base_url: str, weights: str = "/tmp", header: str | None = None) -> dict:
    """{"METHOD /path": status} for every route, asked without the token (or with `header` as
    the Authorization value, e.g. a wrong token)."""
    headers = {"Authorization": header} if header is not None else {}
    return {
        f"{method} {path}": answer(base_url, method, path, body_of(path, weights), headers)
        for method, path in ROUTES
    }


def not_refused(answers: dict) -> dict:
    return {route: code for route, code in answers.items() if code not in (401, None)}


def main(argv: list[str]) -> None:
    """python tests/helpers/refusals.py URL...: each server's answers as one JSON line, for a
    stranger's process (another user, another node's namespace) that imports nothing of ours."""
    print(json.dumps({url: strangers_answers(url) for url in argv}))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
