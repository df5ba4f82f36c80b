"""Rewards that run elsewhere: a reward server (`http(s)://...`) and a reward model (`model:...`).

A reward server scores a batch in one POST (the contract is in docs/tools.md, "The reward
server contract"). Every request has a timeout, a failed one is retried a bounded number of
times, and when every try failed the call raises RewardServerDown: the run stops with that
line (the launcher's class `crash`, which a requeue may retry) instead of hanging or scoring
every sample None. The guard (guard.py) lets it through: retrying sample by sample cannot
bring a server back.

A reward model is a sequence-classification model with one label. By default it is loaded
and scored inside the trainer by TRL itself (a `reward_funcs` entry that is a model name or
path; TRL puts it on the trainer's devices and scores prompt + completion with its own
tokenizer). With reward_model_gpus the launcher serves it on GPUs of its own
(model_server.py) and puts the server's URL in the trainers' environment
(REWARD_MODEL_VARIABLE): the entry then becomes a RemoteReward to that URL, named as TRL names
the model. Here a `model:` entry is checked: the shape of the name, and for a local path, that
it holds a one-label model.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from maxent_grpo.rewards.common import RewardError, RewardUnavailable
from maxent_grpo.server_auth import auth_headers

SERVER_PREFIXES = ("http://", "https://")
MODEL_PREFIX = "model:"
# Keywords TRL passes that are not data: never sent (trainer_state is not JSON, the
# callables are the trainer's, token ids are the policy tokenizer's business).
_NOT_SENT = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
)
# reward_model_gpus > 0: the reward-model server's /score URL, set by the launcher's plan in
# the trainers' environment (launch/plan/reward_model.py); unset: TRL scores in the trainer.
REWARD_MODEL_VARIABLE = "MAXENT_GRPO_REWARD_MODEL_URL"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
BACKOFF_S = 0.5  # first pause between tries; doubles, at most MAX_BACKOFF_S
MAX_BACKOFF_S = 5.0


class RewardServerDown(RewardUnavailable):
    """Every try of a reward server's request failed (refused, timed out, 5xx)."""


class RewardServerError(RewardUnavailable):
    """The reward server answered, but not by the contract (4xx, not JSON, wrong length)."""


def is_server(name: str) -> bool:
    return name.startswith(SERVER_PREFIXES)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def request_body(completions: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The POST body: prompts, completions and every per-sample JSON-able dataset column."""
    n = len(completions)
    columns = {
        key: list(value)
        for key, value in kwargs.items()
        if key not in _NOT_SENT
        and isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) == n
        and _jsonable(list(value))
    }
    prompts = kwargs.get("prompts")
    return {
        "prompts": list(prompts) if prompts is not None else [None] * n,
        "completions": list(completions),
        "columns": columns,
    }


def _scores(url: str, payload: Any, n: int) -> list[float | None]:
    rewards = payload.get("rewards") if isinstance(payload, dict) else None
    if not isinstance(rewards, list) or len(rewards) != n:
        got = f"{len(rewards)} rewards" if isinstance(rewards, list) else repr(payload)[:80]
        raise RewardServerError(
            f"reward server {url}: expected {{'rewards': [{n} numbers]}}, got {got}"
        )
    out: list[float | None] = []
    for value in rewards:
        if value is None:
            out.append(None)
        elif (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ):
            out.append(float(value))
        else:
            raise RewardServerError(
                f"reward server {url}: reward {value!r} is not a finite number or null"
            )
    return out


class RemoteReward:
    """A reward scored by a server: one POST per batch, `tries` attempts of `timeout` seconds.

    The longest a call can take is `bound_s` (every try timing out, plus the pauses between
    them); the guard's own time limit is not applied on top (`bounds_itself`).
    """

    bounds_itself = True

    def __init__(
        self,
        url: str,
        timeout: float,
        retries: int,
        name: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        check_server_url(url)
        self.url, self.timeout, self.tries = url, float(timeout), int(retries) + 1
        # Authorization (server_auth.auth_headers); kept out of repr and error messages.
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        parts = urlsplit(url)
        self.__name__ = name or re.sub(r"\W+", "_", f"server_{parts.netloc}{parts.path}").strip("_")

    @property
    def bound_s(self) -> float:
        pauses = sum(min(BACKOFF_S * 2**k, MAX_BACKOFF_S) for k in range(self.tries - 1))
        return self.tries * self.timeout + pauses

    def __call__(self, completions, **kwargs) -> list[float | None]:
        data = json.dumps(request_body(completions, kwargs)).encode()
        last = ""
        for attempt in range(self.tries):
            if attempt:
                time.sleep(min(BACKOFF_S * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                payload = self._post(data)
            except urllib.error.HTTPError as exc:
                if exc.code < 500:  # the request is wrong: another try cannot help
                    raise RewardServerError(
                        f"reward server {self.url}: HTTP {exc.code} {exc.reason}"
                    ) from None
                last = f"HTTP {exc.code} {exc.reason}"
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                # refused, reset, timed out, cut short
                last = str(getattr(exc, "reason", exc)) or type(exc).__name__
            else:
                return _scores(self.url, payload, len(completions))
        raise RewardServerDown(
            f"reward server {self.url} did not answer: {self.tries} tries of "
            f"{self.timeout:g}s failed (last: {last}); start it, or raise "
            "reward_server_retries / reward_server_timeout_seconds"
        )

    def _post(self, data: bytes) -> Any:
        request = urllib.request.Request(self.url, data=data, headers=self._headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
            body = response.read()
        try:
            return json.loads(body)
        except ValueError:
            raise RewardServerError(
                f"reward server {self.url}: the answer is not JSON ({body[:60]!r})"
            ) from None


def check_server_url(url: str) -> None:
    """A reward server's URL: http(s), a host, an optional port; no query or fragment."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number or out of range
    except ValueError as exc:
        raise RewardError(f"reward server {url!r}: {exc}; write http://host:port/path") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RewardError(f"reward server {url!r}: no host; write http://host:port/path")
    if parts.query or parts.fragment or " " in url:
        raise RewardError(
            f"reward server {url!r}: a query, fragment or space is not allowed; "
            "write http://host:port/path"
        )
    del port


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or Path(name).expanduser().exists()


def reward_model_name(spec: str) -> str:
    """The model name or path of a `model:` entry, checked; TRL loads it when the trainer is
    built. A local path must hold a config.json of a one-label classifier."""
    name = spec[len(MODEL_PREFIX) :].strip()
    if not name:
        raise RewardError(f"reward {spec!r}: no model; write model:<hub id or local path>")
    if not _looks_like_path(name):
        if not _HUB_ID.match(name):
            raise RewardError(
                f"reward {spec!r}: {name!r} is neither a local directory nor a hub id (org/name)"
            )
        return name
    path = Path(name).expanduser()
    config = path / "config.json"
    if not config.is_file():
        raise RewardError(f"reward {spec!r}: no model at {path} (no config.json there)")
    values = json.loads(config.read_text())
    kinds = values.get("architectures") or []
    if kinds and not any(k.endswith("ForSequenceClassification") for k in kinds):
        raise RewardError(
            f"reward {spec!r}: the model at {path} is a {', '.join(kinds)}, not a "
            "sequence-classification model (AutoModelForSequenceClassification, num_labels=1)"
        )
    # A config saved without id2label has transformers' default: 2 labels.
    labels = len(values["id2label"]) if "id2label" in values else values.get("num_labels", 2)
    if labels != 1:
        raise RewardError(
            f"reward {spec!r}: the model at {path} has {labels} labels; a reward model "
            "has one (a sequence-classification model saved with num_labels=1)"
        )
    return str(path)


def model_metric_name(model: str) -> str:
    """The name TRL gives a reward model's metrics (rewards/<name>/mean): the last part of its
    name or path; a served model keeps it, so both placements log the same keys."""
    return model.rstrip("/").split("/")[-1]


def served_reward_model(spec: str, url: str, timeout: float, retries: int) -> RemoteReward:
    """A `model:` entry scored by the reward-model server at `url` (reward_model_gpus), which
    asks for the run's token (the launcher started it)."""
    name = model_metric_name(reward_model_name(spec))
    return RemoteReward(url, timeout, retries, name=name, headers=auth_headers())


def server_headers(variable: str | None, environ: Mapping[str, str] = os.environ) -> dict:
    """reward_server_token_env: the header a user's reward server gets (the token in the
    environment variable the recipe names), none when the recipe names none."""
    if variable is None:
        return {}
    if not environ.get(variable):
        raise RewardError(
            f"reward_server_token_env: {variable}, but {variable} is not set in the trainers' "
            f"environment; export {variable} (the token your reward server checks) before "
            "the run, or drop reward_server_token_env"
        )
    return auth_headers(environ, variable)
