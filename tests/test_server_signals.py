"""A server the launcher runs outlives Slurm's job-wide SIGTERM until the launcher stops it.

Slurm's SIGTERM (a requeue, a preemption, scancel, the time limit's end) reaches every
process of the job; a vLLM server that stopped on it left the trainers unable to end the step
they were saving at, and KillWait's SIGKILL took the step (bench/chaos.py, seed 5296057401).
The server keeps SIGTERM blocked, in every process it spawns, whatever handler they install
(vLLM installs its own) and after multiprocessing's resource tracker unblocked it (vLLM
starts one with its engine); the launcher stops it with SIGINT, and its death still stops
it. Real processes: a program that installs SIGTERM and SIGINT handlers as vLLM's do and
starts the resource tracker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from maxent_grpo.launch.plan import RewardModelPlan, ServerPlan
from maxent_grpo.launch.processes import SERVER_STOP, SHELTER, Child, server_child
from maxent_grpo.launch.reward_server import RewardModelServer
from maxent_grpo.launch.server import VLLMServer

# Installs handlers as vLLM does (each signal ends it, naming the signal), starts the
# resource tracker as vLLM's engine start does (which unblocks SIGTERM) and a child that
# installs the same handlers, which it stops as vLLM's API server stops its engine:
# SIGTERM, then SIGKILL after a grace (vllm/v1/utils.py shutdown).
SERVER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from multiprocessing import resource_tracker
    engine = None
    def ended(signum, frame):
        print(f"{sys.argv[1]} ended by {signal.Signals(signum).name}", flush=True)
        if engine is not None:
            engine.terminate()
            try:
                engine.wait(2)
            except subprocess.TimeoutExpired:
                engine.kill()
        sys.exit(0)
    signal.signal(signal.SIGTERM, ended)
    signal.signal(signal.SIGINT, ended)
    if sys.argv[1] == "server":  # (vLLM's engine finds it running: multiprocessing says so)
        resource_tracker.ensure_running()
        engine = subprocess.Popen([sys.executable, "-c", sys.argv[2], "engine"])
    print(f"{sys.argv[1]} up", flush=True)
    time.sleep(120)
    """
)
COMMAND = [sys.executable, "-c", SERVER, "server", SERVER]


def _wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _up(child: Child, log: Path) -> list[int]:
    """The server's processes (its own, its engine's, the engine's resource tracker) once
    both are up: what Slurm would signal."""
    assert _wait_for(lambda: log.read_text().count(" up") == 2), log.read_text()
    members = child.members()
    assert len(members) >= 2, members
    return members


def _slurm_sigterm(pids: list[int]) -> None:
    """What slurmstepd does to a job it requeues or ends: SIGTERM to every process."""
    for pid in pids:
        os.kill(pid, signal.SIGTERM)


def test_a_server_outlives_the_job_wide_sigterm_and_stops_on_the_launchers_stop(tmp_path):
    log = tmp_path / "server.log"
    server = server_child("vllm", tuple(COMMAND), log, {})
    members = _up(server, log)
    _slurm_sigterm(members)
    time.sleep(1.0)
    assert server.members() == members, log.read_text()  # both still there, no handler ran
    assert "ended" not in log.read_text()
    started = time.monotonic()
    server.stop(grace=10)
    took = time.monotonic() - started
    assert not server.members()
    assert "server ended by SIGINT" in log.read_text() and took < 5, (took, log.read_text())


def test_a_server_stops_on_sigint_that_its_launcher_ignores_and_blocks(tmp_path):
    """A launcher started by a shell's `cmd &` ignores SIGINT, and one in a state change
    (attempt.py move) blocks it: both survive exec. The server still takes the stop (exit -2:
    Python's default SIGINT handler), not the SIGKILL after the grace (-9)."""
    log = tmp_path / "server.log"
    program = "import time; print('server up', flush=True); time.sleep(120)"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        server = server_child("vllm", (sys.executable, "-c", program), log, {})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, before)
    assert _wait_for(lambda: "server up" in log.read_text()), log.read_text()
    assert server.stop(grace=30) == -signal.SIGINT, log.read_text()
    assert not server.members()


def test_a_trainer_child_still_stops_on_sigterm(tmp_path):
    """Only servers block it: the trainers take Slurm's SIGTERM as a stop at the step end."""
    log = tmp_path / "trainer.log"
    trainer = Child("train", COMMAND, log)
    _slurm_sigterm(_up(trainer, log))
    assert _wait_for(lambda: not trainer.members()), log.read_text()
    assert "server ended by SIGTERM" in log.read_text()
    trainer.stop(grace=1)


def test_the_launchers_death_still_stops_the_server(tmp_path):
    """A launcher SIGKILLed (no handler runs): its server gets SIGINT (its parent-death
    signal), not the SIGTERM it blocks, and ends with its child."""
    log, pids = tmp_path / "server.log", tmp_path / "pids"
    launcher = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from maxent_grpo.launch.processes import server_child
        server = server_child("vllm", {tuple(COMMAND)!r}, Path({str(log)!r}), {{}})
        while Path({str(log)!r}).read_text().count(" up") < 2:
            time.sleep(0.05)
        Path({str(pids)!r}).write_text(" ".join(map(str, server.members())))
        time.sleep(120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher])
    try:
        assert _wait_for(lambda: pids.is_file() and pids.read_text(), 30)
        members = [int(p) for p in pids.read_text().split()]
        proc.kill()
        proc.wait(10)
        assert _wait_for(lambda: not [p for p in members if _alive(p)]), log.read_text()
        assert "server ended by SIGINT" in log.read_text(), log.read_text()
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_both_servers_of_a_plan_get_the_server_stop_and_srun_keeps_sigterm(tmp_path):
    """The vLLM and reward-model servers start under it; through srun (a server on another
    node) the command is left as it is and SIGTERM stays the stop: srun forwards it to the
    task, one SIGINT only prints."""
    plan = ServerPlan(
        node="127.0.0.1",
        gpus=(),
        port=9,
        group_port=0,
        command=tuple(COMMAND),
        env={},
        device="cpu",
        weight_sync="disk",
        timeout=30,
    )
    vllm = VLLMServer(plan, tmp_path / "vllm.log", {}).start()
    rm_plan = RewardModelPlan("127.0.0.1", (), 9, "m", tuple(COMMAND), {}, 30)
    reward = RewardModelServer(rm_plan, tmp_path / "rm.log", {}).start()
    try:
        for server in (vllm, reward):
            _slurm_sigterm(_up(server.child, server.log_path))
        time.sleep(1.0)
        for server in (vllm, reward):
            assert len(server.child.members()) >= 2, server.log_path.read_text()
    finally:
        vllm.stop(grace=5)
        reward.stop(grace=5)
    for server in (vllm, reward):
        assert "server ended by SIGINT" in server.log_path.read_text()
    srun = ("srun", "--nodes=1", sys.executable, "-m", "vllm.entrypoints.cli.main", "serve")
    remote = server_child("vllm", srun, tmp_path / "remote.log", {})
    assert remote.stop_signal == signal.SIGTERM and remote.proc.args == list(srun)
    remote.stop(grace=1)
    # A wrapper's own -c (taskset's CPU list) is not Python's: the command is left as it is.
    pinned = ("taskset", "-c", "0", sys.executable, "-c", "import time; time.sleep(60)")
    wrapped = server_child("vllm", pinned, tmp_path / "pinned.log", {})
    assert wrapped.stop_signal == signal.SIGTERM and wrapped.proc.args == list(pinned)
    wrapped.stop(grace=1)
    assert vllm.child.stop_signal == SERVER_STOP
    assert vllm.child.proc.args == [sys.executable, "-m", SHELTER, "-c", SERVER, "server", SERVER]
