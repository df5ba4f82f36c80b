"""The launcher with a real vLLM server (CPU build): smoke run, trainer crash, server death.

Each test starts its own server through the launcher (30-75 s each on CPU): that server's
lifecycle is what is tested.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers.auth import command_lines, tokens_of_run
from helpers.paths import MAXENT_GRPO, REPO
from helpers.procs import LOADED_MARGIN, live_processes, wait_until_gone
from helpers.recipes import SMOKE_VLLM, write_recipe
from helpers.refusals import not_refused, strangers_answers
from helpers.runs import child_env, log_history
from maxent_grpo.rundir.checkpoints import run_is_complete
from maxent_grpo.rundir.events import read_events
from maxent_grpo.server_auth import TOKEN_VARIABLE

pytestmark = pytest.mark.vllm


def measured(name: str, value: float, unit: str = "s") -> None:
    print(f"\nMEASURED {name}: {value:.3g}{unit}", flush=True)


class Streamed:
    """A command's merged output, line by line, with the time each line arrived."""

    def __init__(self, args: list[str], timeout: float = 900, on_line=None, **env: str):
        self.start = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.on_line = on_line or (lambda line: None)  # called in the reader thread
        self.proc = subprocess.Popen(
            args,
            cwd=REPO,
            env=child_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        reader = threading.Thread(target=self._read, daemon=True)
        reader.start()
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.ended = time.monotonic()
        reader.join(timeout=10)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            self.on_line(line)

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, pattern: str) -> tuple[float, re.Match]:
        for when, line in self.lines:
            match = re.search(pattern, line)
            if match:
                return when, match
        raise AssertionError(f"no line matches {pattern!r} in:\n{self.text[-5000:]}")


def server_pid(run: Streamed) -> int:
    return int(run.first(r"vLLM server starting \(pid (\d+)\)")[1].group(1))


def _stranger(url: str, marker: str, seen: dict) -> None:
    """While the run trains: what a stranger gets from its server (this user without the
    token; another local user, `nobody`, when root can run one), the run's tokens as the
    trainers' environment holds them, and what `ps` shows."""
    seen["tokens"] = tokens_of_run(marker)
    seen["ps"] = command_lines()
    seen["answers"] = strangers_answers(url)
    python = "/usr/bin/python3"  # one `nobody` may run (the venv's may sit under /root)
    if os.geteuid() == 0 and shutil.which("runuser") and os.access(python, os.X_OK):
        script = str(REPO / "tests" / "helpers" / "refusals.py")
        other = ["runuser", "-u", "nobody", "--", python, "-I", script, url]
        done = subprocess.run(other, capture_output=True, text=True, timeout=60, cwd="/")
        seen["nobody"] = json.loads(done.stdout)[url] if done.returncode == 0 else done.stderr
    seen["tokens"] |= tokens_of_run(marker)


def test_training_sh_smoke_recipe_serves_trains_and_stops_everything(tmp_path, tiny_model):
    """RECIPE=recipes/smoke/config_grpo_vllm.yaml bash training.sh, shortened to 3 steps. Once
    the server is healthy, while the trainers run, a stranger is refused on every route (issue
    57); the run completes, and the attempt's token is in no file and no command line."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    seen: dict = {}

    def ask_as_a_stranger(line: str) -> None:
        if (match := re.search(r"vLLM server healthy after \S+ at (\S+)", line)) and not seen:
            seen["thread"] = threading.Thread(target=_stranger, args=(match[1], str(out), seen))
            seen["thread"].start()

    run = Streamed(
        ["bash", "training.sh", "--logs-dir", str(logs), "--", "--output_dir", str(out)]
        + ["--max_steps", "3", "--save_steps", "3"],
        on_line=ask_as_a_stranger,
        RECIPE="recipes/smoke/config_grpo_vllm.yaml",
    )
    assert run.returncode == 0, run.text[-6000:]
    seen["thread"].join(timeout=120)
    assert set(seen["answers"].values()) == {401}, seen["answers"]  # loopback: reachable
    if "nobody" in seen:
        assert isinstance(seen["nobody"], dict), seen["nobody"]
        assert not not_refused(seen["nobody"]), seen["nobody"]
    tokens = seen["tokens"] - {os.environ.get(TOKEN_VARIABLE)}  # the attempt made its own
    assert len(tokens) == 1, tokens
    (token,) = tokens
    assert token not in seen["ps"] and token not in run.text
    for file in [p for p in [*out.rglob("*"), *logs.rglob("*")] if p.is_file()]:
        assert token.encode() not in file.read_bytes(), file
    healthy = float(run.first(r"vLLM server healthy after ([\d.]+)s")[1].group(1))
    measured("training.sh: server time to healthy", healthy)
    measured("training.sh: whole run (server start, 3 steps, teardown)", run.ended - run.start)
    assert "vllm server: node localhost, CPU (vLLM's CPU build)" in run.text
    assert "weight sync disk" in run.text
    assert run_is_complete(out)

    steps = {e["step"]: e for e in log_history(out) if "loss" in e}
    assert sorted(steps) == [1, 2, 3]
    assert all(steps[s]["vllm/weight_sync_seconds"] > 0 for s in steps)
    vllm_logs = list(logs.glob("*_vllm.log"))
    assert [p.name.endswith("_vllm.log") and p.name.startswith("out_") for p in vllm_logs] == [True]
    assert "Application startup complete" in vllm_logs[0].read_text()
    assert len(list(logs.glob("*_train.log"))) == 1

    # Gone by the time the launcher exited: looked at once, nothing waited for.
    left = live_processes({server_pid(run)}, marker=str(out))
    assert not left, left


def test_trainer_crash_stops_the_server_and_leaves_no_process(tmp_path, tiny_model):
    out, logs = tmp_path / "out", tmp_path / "logs"
    recipe = write_recipe(
        tmp_path,
        base=SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        output_dir=str(out),
        reward_funcs=["tests.helpers.crashing_rewards:boom"],
        reward_weights=[1.0],
    )
    run = Streamed([MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)])
    assert run.returncode not in (0, None), run.text[-6000:]
    pid = server_pid(run)
    crashed, _ = run.first(r"boom: this reward function crashes")
    trainer_gone, _ = run.first(r"training exited with code [1-9]")
    stopped, match = run.first(r"vLLM server stopped in ([\d.]+)s")
    left, waited = wait_until_gone({pid}, marker=str(tmp_path), timeout=15)
    assert not left, left
    teardown = run.ended + waited - crashed
    measured("trainer crash (first rank exits) -> trainers exited", trainer_gone - crashed)
    measured("server stop (SIGINT to its process group -> gone)", float(match.group(1)))
    measured("trainer crash -> launcher exit, server and trainers gone", teardown)
    assert float(match.group(1)) < 9  # by the SIGINT, before the 10 s grace ends in SIGKILL
    assert teardown < 30
    assert not run_is_complete(out)


def test_server_that_dies_at_start_fails_in_seconds_with_its_log(tmp_path, tiny_model):
    """A setting only vLLM rejects (context longer than the model's): the trainers, started
    beside the server, are stopped too."""
    logs = tmp_path / "logs"
    recipe = write_recipe(
        tmp_path,
        base=SMOKE_VLLM,
        model_name_or_path=str(tiny_model),
        output_dir=str(tmp_path / "out"),
        vllm_max_model_length=4096,  # the tiny model has 1024 positions
    )
    run = Streamed([MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)])
    assert run.returncode == 2, run.text[-6000:]
    started, _ = run.first(r"vLLM server starting")
    measured("server death at start -> launcher exit", run.ended - started)
    when, match = run.first(r"^error: vLLM server exited with code (\d+) ([\d.]+)s after start")
    assert int(match.group(1)) != 0
    died_after = float(match.group(2))
    measured("server death at start: vLLM's own time to exit", died_after)
    # vLLM's own time to die is mostly its import (40 s in CI, 90 s at a load of 13): the
    # launcher's part is what follows, far below the 300 s vllm_server_timeout it must not wait.
    assert run.ended - started - died_after < 20 + LOADED_MARGIN
    measured("server exit -> error reported, trainers stopped", when - started - died_after)
    assert when - started - died_after < 20  # a poll, the trainers' 3 s grace, teardown
    error_at = [i for i, (_, line) in enumerate(run.lines) if line.startswith("error: vLLM")][0]
    tail = "\n".join(line for _, line in run.lines[error_at + 1 :])
    assert "max_model_len" in tail or "max-model-len" in tail
    assert "stopping training: the vLLM server did not start" in run.text
    assert not wait_until_gone({int(server_pid(run))}, marker=str(tmp_path), timeout=10)[0]
    assert Path(logs).is_dir()


def test_server_killed_during_start_up_stops_everything_in_seconds(tmp_path, tiny_model):
    """SIGKILL to the booting server (its API process) while the trainers load: the launcher
    stops the trainers and the server's other processes and ends the attempt as a crash (a
    signal is not the recipe's fault: retried, where a server's own exit is a user error)."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    recipe = write_recipe(
        tmp_path, base=SMOKE_VLLM, model_name_or_path=str(tiny_model), output_dir=str(out)
    )
    killed = {}

    def kill_booting_server(line: str) -> None:
        if match := re.search(r"vLLM server starting \(pid (\d+)\)", line):
            pid = int(match.group(1))
            killed["timer"] = threading.Timer(KILL_AFTER_S, _kill, (pid, killed))
            killed["timer"].start()

    run = Streamed(
        [MAXENT_GRPO, "run", "--config", str(recipe), "--logs-dir", str(logs)],
        on_line=kill_booting_server,
    )
    assert "at" in killed, run.text[-6000:]  # killed before it was healthy
    assert "vLLM server healthy" not in run.text
    assert run.returncode == 1, run.text[-6000:]
    assert re.search(r"^error: vLLM server was killed by signal 9 ", run.text, re.M)
    (outcome,) = [e for e in read_events(out) if e["event"] == "outcome"]
    assert outcome["outcome"] == "crash", outcome
    assert "stopping training: the vLLM server did not start" in run.text
    left, waited = wait_until_gone(marker=str(tmp_path), timeout=10)
    assert not left, left
    measured("server killed during start-up -> launcher exit", run.ended - killed["at"])
    assert run.ended - killed["at"] < 30  # the trainers' stop grace is 10 s
    assert not run_is_complete(out)


KILL_AFTER_S = 8  # the trainers are importing or loading by then; vLLM is not healthy yet


def _kill(pid: int, killed: dict) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        killed["at"] = time.monotonic()
    except ProcessLookupError:
        pass


# In the chaos suite, not CI's vLLM lane: under CI's load a signalled server was once alive
# 90 s without its shutdown line, which the bound counts from (CI, 2026-12-02).
@pytest.mark.chaos
def test_a_signalled_server_with_requests_in_flight_is_lost_within_its_shutdown_bound(
    tmp_path, tiny_model
):
    """vLLM 0.31 signalled while requests arrive (SIGINT: the launcher's servers keep SIGTERM
    blocked, launch/shelter.py): its engine stops, and uvicorn may wait without a bound for a
    request that came during the engine's shutdown (bench/chaos.py, seed 1837981534, then a
    SIGTERM: alive and deaf, 600 s till the hang watchdog; here 2 of 3 tries wedged). The
    launcher's watch (launch/server.py) reports it lost within SHUTDOWN_BOUND_S of its own
    shutdown line either way, its process group gone. Up to 3 servers, until one wedges."""
    import sys
    import urllib.request

    from maxent_grpo.launch.plan import ServerPlan
    from maxent_grpo.launch.processes import free_port
    from maxent_grpo.launch.server import SHUTDOWN_BOUND_S, VLLMServer

    env = {"CUDA_VISIBLE_DEVICES": "", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1")
    wedged = []
    for attempt in range(3):
        port = free_port()
        command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(tiny_model)]
        command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
        command += ["--max-model-len", "256", "--gpu-memory-utilization", "0.05"]
        plan = ServerPlan(
            node="127.0.0.1",
            gpus=(),
            port=port,
            group_port=0,
            command=tuple(command),
            env=env,
            device="cpu",
            weight_sync="disk",
            timeout=400,
        )
        server = VLLMServer(plan, tmp_path / f"vllm-{attempt}.log").start()
        stop = threading.Event()

        def ask(url=f"http://127.0.0.1:{port}/v1/completions", stop=stop):
            body = json.dumps({"model": str(tiny_model), "prompt": "1 2", "max_tokens": 64})
            while not stop.is_set():
                request = urllib.request.Request(
                    url, body.encode(), {"Content-Type": "application/json"}
                )
                try:
                    urllib.request.urlopen(request, timeout=120).read()
                except OSError:
                    time.sleep(0.05)

        try:
            server.wait_until_healthy(poll=0.5)
            askers = [threading.Thread(target=ask, daemon=True) for _ in range(4)]
            for asker in askers:
                asker.start()
            time.sleep(3)  # requests in flight
            os.kill(server.pid, signal.SIGINT)
            start, message = time.monotonic(), None
            while message is None and time.monotonic() - start < SHUTDOWN_BOUND_S + 60:
                message = server.lost(stopping=False, exited=False)
                time.sleep(0.5)
            took = time.monotonic() - start
        finally:
            stop.set()
            server.stop(grace=2)
        assert message is not None, f"alive {took:.0f}s after its SIGINT"
        assert took < SHUTDOWN_BOUND_S + LOADED_MARGIN, (took, message)
        assert not wait_until_gone({server.child.proc.pid}, timeout=10)[0]
        log = (tmp_path / f"vllm-{attempt}.log").read_text()
        wedged.append("Waiting for connections to close" in log and "killed: it logged" in message)
        measured(f"try {attempt}: SIGINT to lost (wedged: {wedged[-1]})", took)
        if wedged[-1]:
            break
