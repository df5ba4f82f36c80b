"""Shared fixtures (helpers to run commands live in tests/helpers/runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.paths import REPO

# With CI set, a skip is a failure (see there); the in-process check/migrate fixtures; a test
# that leaves files in the checkout fails (helpers/clean_checkout.py).
pytest_plugins = ["helpers.ci_skips", "helpers.migrating", "helpers.clean_checkout"]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Qwen2 model, built once into the repo cache (as training.sh does)."""
    from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

    return ensure_tiny_model(REPO / DEFAULT_TINY_MODEL_DIR).resolve()
