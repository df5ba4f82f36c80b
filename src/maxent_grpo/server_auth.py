"""The run's secret: a token per attempt that every server the launcher starts asks for.

The launcher makes a fresh token for each attempt (`new_token`) and puts it in the
environment of the servers and trainers it starts (TOKEN_VARIABLE): never on a command line
(`ps` shows those to every user), never in a log, event, run_settings or W&B. A client sends it
as `Authorization: Bearer <token>` (`auth_headers`); a server refuses a request without it
before doing anything. vLLM servers get `TokenMiddleware` through vLLM's `--middleware`
(vLLM's own --api-key guards only /v1, /v2, /inference and /cohere, not the dev-mode routes
weight sync uses, nor /metrics); the reward servers check it with `authorized`.

`/health` stays open (GET or HEAD, that exact path): it answers 200 or 503 and nothing else,
changes nothing, and TRL's own server check asks it without headers. See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping

TOKEN_VARIABLE = "MAXENT_GRPO_SERVER_TOKEN"
MIDDLEWARE = "maxent_grpo.server_auth.TokenMiddleware"  # vLLM's --middleware value
OPEN_PATHS = ("/health",)  # GET/HEAD without the token: liveness only
SCHEME = "Bearer"


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def with_token(environ: Mapping[str, str], token: str) -> dict[str, str]:
    """environ with the attempt's token in it (any token it held replaced)."""
    return {**environ, TOKEN_VARIABLE: token}


def auth_headers(
    environ: Mapping[str, str] = os.environ, variable: str = TOKEN_VARIABLE
) -> dict[str, str]:
    """The header a client of the run's servers sends (the token in `variable`: the run's, or
    the one reward_server_token_env names); none when it is unset."""
    token = environ.get(variable)
    return {"Authorization": f"{SCHEME} {token}"} if token else {}


def _digest(value: str | bytes) -> bytes:
    return hashlib.sha256(value.encode() if isinstance(value, str) else value).digest()


def authorized(header: str | bytes | None, token: str | None) -> bool:
    """Whether an Authorization header's value carries `token` (constant time). No token
    configured: nothing is authorized (a server fails closed)."""
    if not token or not header:
        return False
    expected = f"{SCHEME} {token}".encode()
    given = header.encode("latin-1") if isinstance(header, str) else header
    return hmac.compare_digest(_digest(given), _digest(expected))


def _authorization(scope: Mapping) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            return value
    return None


def is_open(scope: Mapping) -> bool:
    """The liveness probe, the one request answered without the token."""
    return (
        scope.get("type") == "http"
        and scope.get("method") in ("GET", "HEAD")
        and scope.get("path") in OPEN_PATHS
    )


class TokenMiddleware:
    """Pure ASGI middleware (vLLM's --middleware): a request without the run's token is
    answered 401 before any route runs; a websocket is closed (1008). vLLM adds
    --middleware classes last, so this one is outermost and runs first. Reads the token from
    TOKEN_VARIABLE when vLLM builds the app; without one, every request but /health is
    refused (fail closed)."""

    def __init__(self, app, token: str | None = None):
        self.app = app
        self.token = token if token is not None else os.environ.get(TOKEN_VARIABLE)

    async def __call__(self, scope, receive, send):
        kind = scope.get("type")
        if kind not in ("http", "websocket") or is_open(scope):
            return await self.app(scope, receive, send)
        if authorized(_authorization(scope), self.token):
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = b'{"error": "Unauthorized"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        headers.append((b"www-authenticate", SCHEME.encode()))
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
