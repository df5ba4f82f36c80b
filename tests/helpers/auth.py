"""The run's token in the tests (issue 57): servers the tests start themselves (not through the
launcher, which makes one per attempt) get the session's token through child_env, and the
tests' own requests send it."""

from __future__ import annotations

import os

from maxent_grpo.server_auth import TOKEN_VARIABLE, auth_headers, new_token


def ensure_token() -> str:
    """The test session's token, made once and kept in os.environ (children inherit it)."""
    return os.environ.setdefault(TOKEN_VARIABLE, new_token())


def session():
    """A requests.Session that sends the token."""
    import requests  # deferred: only the suites that talk to servers need it

    http = requests.Session()
    http.headers.update(auth_headers({TOKEN_VARIABLE: ensure_token()}))
    return http


def tokens_of_run(marker: str) -> set[str]:
    """The run's tokens (TOKEN_VARIABLE) in the environments of the live processes whose
    command line holds `marker` (e.g. the test's tmp path); our own user's, as /proc allows."""
    from pathlib import Path

    found = set()
    prefix = TOKEN_VARIABLE.encode() + b"="
    for proc in Path("/proc").iterdir():
        try:
            if marker.encode() not in (proc / "cmdline").read_bytes():
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours
            continue
        found |= {v[len(prefix) :].decode() for v in environ if v.startswith(prefix)}
    return found


def command_lines() -> str:
    """Every process's command line as another user of the node sees it (`ps`)."""
    import subprocess

    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
