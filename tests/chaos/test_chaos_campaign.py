"""The chaos campaign's short fixed-seed share (bench/chaos.py): a few trials of tiny real
runs on CPU, no server (`make test-chaos`; root, for the full-disk trials' tmpfs). The long
campaign: `make chaos CHAOS_TRIALS=60` (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers.paths import PYTHON, REPO
from helpers.runs import child_env

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(
        os.environ.get("MAXENT_GRPO_CHAOS_TESTS") != "1",
        reason="real chaos trials: make test-chaos (MAXENT_GRPO_CHAOS_TESTS=1; root)",
    ),
]
# Seed 54, 3 trials, no server, from the cheap moments and faults: a stopped launcher at
# generation, a full disk at scoring, a rank killed mid-checkpoint (bench/chaos.py --list).
ONLY = "generation,checkpoint_write,scoring,sigkill_trainer,sigterm_launcher,disk_full"
ARGS = ["--seed", "54", "--trials", "3", "--no-servers", "--only", ONLY, "--jobs", "2"]


def test_the_short_campaign_keeps_every_invariant(tmp_path):
    output = tmp_path / "chaos.json"
    command = [PYTHON, "bench/chaos.py", *ARGS, "--output", str(output)]
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=1500
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = json.loads(output.read_text())
    summary = report["summary"]
    assert summary["trials"] == 3 and summary["survived"] == 3, summary
    assert (summary["steps_lost"], summary["orphans"], summary["corrupted"]) == (0, 0, 0)
    assert all(r["reached"] and r["applied"] and r["recovered"] for r in report["rows"])
    assert {r["fault"] for r in report["rows"]} == set(ONLY.split(",")[3:])
