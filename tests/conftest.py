"""Shared fixtures (helpers to run commands live in tests/helpers/runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.paths import REPO

# With CI set, a skip is a failure (see there); the in-process check/migrate fixtures; a test
# that leaves files in the checkout fails (helpers/clean_checkout.py).
pytest_plugins = ["helpers.ci_skips", "helpers.migrating", "helpers.clean_checkout"]


def pytest_collection_modifyitems(items):
    """Files with real training runs (marker integration) first, the rest keep their order.

    `make test` gives whole files to two workers (xdist, --dist loadfile) in this order: the
    long files start early and the short ones fill in beside them, instead of one long file
    finishing alone while the other worker idles.
    """
    slow = {item.path for item in items if item.get_closest_marker("integration")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Qwen2 model, built once into the repo cache (as training.sh does)."""
    from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

    return ensure_tiny_model(REPO / DEFAULT_TINY_MODEL_DIR).resolve()
