"""Signals, leftovers and secrets, through the real launcher (2 CPU training processes).

After success, failure and signals no process of the run may remain (zombies do not count:
this machine's PID 1 does not reap orphans). With tokens in the environment and shell tracing
on, no file under logs/ or the output directory may contain them, nor the launcher's own
per-attempt server token (which no command line may show either).
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.auth import command_lines, tokens_of_run
from helpers.paths import MAXENT_GRPO, REPO
from helpers.procs import catches, wait_for, wait_until_gone
from helpers.recipes import small_recipe, write_recipe
from helpers.resume import assert_resumed_from, event_count
from helpers.runs import child_env
from maxent_grpo.rundir.checkpoints import last_complete_checkpoint, run_is_complete
from maxent_grpo.server_auth import TOKEN_VARIABLE

pytestmark = pytest.mark.integration


def launch(tmp_path: Path, path: Path, *flags: str, **env) -> subprocess.Popen:
    log = open(tmp_path / "launcher.out", "ab")
    return subprocess.Popen(
        [MAXENT_GRPO, "run", "--config", str(path), "--logs-dir", str(tmp_path / "logs"), *flags],
        cwd=REPO,
        env=child_env(**env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def launcher_out(tmp_path: Path) -> str:
    return (tmp_path / "launcher.out").read_text(errors="replace")


def assert_nothing_left(tmp_path: Path) -> None:
    left, _ = wait_until_gone(marker=str(tmp_path), timeout=20)
    assert not left, left


def wait_for_training(tmp_path: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list((tmp_path / "logs").glob("*_train.log"))
        if logs and "'loss'" in logs[0].read_text(errors="replace"):
            return
        time.sleep(0.3)
    raise AssertionError("training did not start: " + launcher_out(tmp_path)[-2000:])


def test_no_secrets_in_logs_or_outputs_even_with_shell_tracing(tmp_path, tiny_model):
    """Also the launcher's own per-attempt server token (issue 57): read from the trainers'
    environment while they run, and then found in no file and no command line (`ps`)."""
    hf, wandb = f"hf_{secrets.token_hex(16)}", secrets.token_hex(20)
    inherited = secrets.token_urlsafe(32)  # a token from outside: the attempt makes its own
    path = small_recipe(tmp_path, tiny_model)
    (tmp_path / "logs").mkdir()
    tokens, ps = set(), []
    with open(tmp_path / "logs" / "slurm_trace.out", "wb") as trace:
        proc = subprocess.Popen(
            [
                "bash",
                "-x",
                "training.sh",
                "--config",
                str(path),
                "--logs-dir",
                str(tmp_path / "logs"),
            ],
            cwd=REPO,
            env=child_env(HF_TOKEN=hf, WANDB_API_KEY=wandb, **{TOKEN_VARIABLE: inherited}),
            stdout=trace,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            tokens |= tokens_of_run(str(tmp_path))
            ps.append(command_lines())
            time.sleep(0.5)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    assert code == 0, (tmp_path / "logs" / "slurm_trace.out").read_text()[-3000:]
    assert run_is_complete(tmp_path / "out")
    tokens.discard(inherited)  # the launcher's own process still holds the inherited one
    assert len(tokens) == 1 and len(next(iter(tokens))) >= 40, tokens  # one attempt, one token
    (token,) = tokens
    files = [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]
    files += [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert len(files) > 10
    for file in files:
        data = file.read_bytes()
        assert hf.encode() not in data and wandb.encode() not in data, file
        assert token.encode() not in data, file
    assert len(ps) > 3 and not any(token in lines for lines in ps)
    assert_nothing_left(tmp_path)


def test_trainer_crash_leaves_no_process(tmp_path, tiny_model):
    proc = launch(
        tmp_path, small_recipe(tmp_path, tiny_model), MAXENT_GRPO_FAILPOINT="step_begin:2"
    )
    assert proc.wait(timeout=300) != 0
    assert not run_is_complete(tmp_path / "out")
    assert_nothing_left(tmp_path)


def test_sigterm_checkpoints_at_the_next_step_and_resumes(tmp_path, tiny_model):
    path = small_recipe(tmp_path, tiny_model, max_steps=2000)
    proc = launch(tmp_path, path)
    wait_for_training(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 85, launcher_out(tmp_path)[-3000:]
    assert "SIGTERM received: checkpointing at the next step boundary" in launcher_out(tmp_path)
    checkpoint = last_complete_checkpoint(tmp_path / "out")
    assert checkpoint is not None
    assert "not requeued: not running under Slurm" in launcher_out(tmp_path)
    assert_nothing_left(tmp_path)

    # The same command resumes from that checkpoint (a shorter max_steps, accepted).
    step = int(checkpoint.name.split("-")[1])
    write_recipe(tmp_path, base=path, max_steps=step + 2)
    before = event_count(tmp_path / "out")
    assert launch(tmp_path, path, "--accept-changes").wait(timeout=300) == 0
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*_train.log"))
    assert_resumed_from(tmp_path / "out", before, step, step + 2, log=logs)
    assert run_is_complete(tmp_path / "out")


def test_second_signal_stops_everything_at_once(tmp_path, tiny_model):
    proc = launch(tmp_path, small_recipe(tmp_path, tiny_model, max_steps=2000))
    wait_for_training(tmp_path)
    proc.send_signal(signal.SIGINT)
    # Python coalesces a signal that arrives before its handler ran: wait for the first.
    deadline = time.monotonic() + 30
    while "SIGINT received" not in launcher_out(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 85
    out = launcher_out(tmp_path)
    assert "SIGINT again: stopping everything now" in out
    # One line says it (issue 26.3): the killed processes' tracebacks stay in the train log.
    assert "Traceback" not in out and "training exited with code" not in out, out[-3000:]
    assert "training stopped by the second SIGINT" in out
    assert_nothing_left(tmp_path)
    # Whatever the kill interrupted, resume never sees an incomplete checkpoint as complete.
    checkpoint = last_complete_checkpoint(tmp_path / "out")
    if checkpoint is not None:
        assert (checkpoint / "model.safetensors").is_file()


def test_signal_during_startup_stops_before_training(tmp_path, tiny_model):
    proc = launch(tmp_path, small_recipe(tmp_path, tiny_model, max_steps=2000))
    # As soon as the launcher catches SIGUSR1 (its first handler is set once it has parsed its
    # arguments; until then the signal would kill it): it is still importing, far from training.
    wait_for(lambda: catches(proc.pid, signal.SIGUSR1), 60, "a SIGUSR1 handler", 0.02, proc)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=180) == 85, launcher_out(tmp_path)[-3000:]
    assert "SIGUSR1 received" in launcher_out(tmp_path)
    assert not run_is_complete(tmp_path / "out")
    assert_nothing_left(tmp_path)
