"""Several vLLM servers as one (launch/server_group.py), with stand-in servers (real processes,
real HTTP /health, no vLLM): a lost server is restarted in place with a log of its own and
training goes on; only when every server is lost for good does training stop."""

from __future__ import annotations

import dataclasses
import os
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from maxent_grpo.launch import server_group
from maxent_grpo.launch.processes import Child, free_port
from maxent_grpo.launch.sbatch import node_loss_options
from maxent_grpo.launch.server_group import launch_servers
from maxent_grpo.launch.slurm import node_down
from maxent_grpo.launch.watch import watch_training
from maxent_grpo.vllm_health import ServerError
from test_server import PY, python_command, server_plan

# Answers /health; exits with code 7 `die_after` s after its first answer (or, negative, stops
# answering -die_after s after it) on the starts that find no marker file (the marker is
# written first: with a marker path, only the first start fails; "always": every start). The
# clock starts at the first answer so that a slow machine's start cannot fail it before the
# group has seen it healthy.
SERVER = """
    import os, sys, threading, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, die_after, marker = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    state = {"silent": False, "armed": False}
    def fault():
        if die_after < 0:
            threading.Timer(-die_after, lambda: state.update(silent=True)).start()
        else:
            died = lambda: (print("engine died", flush=True), os._exit(7))
            threading.Timer(die_after, died).start()
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            if state["silent"]:
                time.sleep(600)  # alive, never answering (one request at a time: all wait)
            self.send_response(200); self.end_headers()
            if state["armed"]:
                state["armed"] = False
                fault()
        def log_message(self, *a):
            pass
    print("serving on", port, flush=True)
    if die_after and not os.path.exists(marker):
        if marker != "always":
            open(marker, "w").close()
        state["armed"] = True
    HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def stand_in(die_after: float = 0, marker: str = "never", timeout: float = 20):
    port = free_port()
    plan = server_plan([*python_command(SERVER), str(port), str(die_after), marker], port)
    return dataclasses.replace(plan, timeout=timeout)


def trainer(tmp_path: Path, seconds: float) -> Child:
    return Child("train", [PY, "-c", f"import time; time.sleep({seconds})"], tmp_path / "t.log")


def trainer_until(flag: Path, then_s: float = 0.0, bound_s: float = 30) -> Child:
    """A trainer that runs until `flag` exists, then then_s more (at most bound_s in all): as
    long as the fault and the group's answer to it take on this machine, not a guessed time."""
    wait = f"import os, time; t = time.monotonic() + {bound_s}\n"
    wait += f"while not os.path.exists({str(flag)!r}) and time.monotonic() < t: time.sleep(0.05)\n"
    wait += f"time.sleep({then_s})"
    return Child("train", [PY, "-c", wait], flag.with_suffix(".log"))


class Events(list):
    """The group's events; with `flag`, the file written at the first `on` event."""

    def __init__(self, flag: Path | None = None, on: str = "server_back"):
        super().__init__()
        self.flag, self.on = flag, on

    def __call__(self, event: str, **fields) -> None:
        self.append((event, fields))
        if event == self.on and self.flag:
            self.flag.touch()


def test_a_lost_server_is_restarted_with_its_own_log_and_training_goes_on(tmp_path):
    events = Events(tmp_path / "back")
    plans = (stand_in(), stand_in(die_after=0.3, marker=str(tmp_path / "died-once")))
    group = launch_servers(plans, tmp_path / "run_vllm.log", {}, events)
    try:
        # Training outlives the loss and the restart.
        watched = watch_training(trainer_until(events.flag), (group,), None, poll=0.1)
    finally:
        group.stop()
    assert watched.code == 0 and watched.server_died is None
    assert [e for e, _ in events] == ["server_lost", "server_back"]
    lost, back = (fields for _, fields in events)
    assert lost["node"] == "127.0.0.1" and "exited with code 7" in lost["reason"]
    assert back["url"] == plans[1].url and back["after_s"] >= 0
    # Each server, and each restart, writes a log of its own.
    assert "engine died" in (tmp_path / "run_vllm-server1.log").read_text()
    assert "serving on" in (tmp_path / "run_vllm-server1-restart1.log").read_text()
    assert "engine died" not in (tmp_path / "run_vllm.log").read_text()


def test_restarts_are_bounded_and_training_stops_only_when_every_server_is_lost(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(server_group, "MAX_RESTARTS", 1)
    events = Events()
    always = (stand_in(die_after=0.5, marker="always"), stand_in(die_after=0.5, marker="always"))
    group = launch_servers(always, tmp_path / "v.log", {}, events)
    start = time.monotonic()
    try:
        watched = watch_training(trainer(tmp_path, 60), (group,), None, poll=0.1)
    finally:
        group.stop()
    assert time.monotonic() - start < 30  # stopped, not waited out
    assert watched.server_died.startswith("every vLLM server is lost")
    assert "after 1 restarts" in watched.server_died
    # Per server: lost, back (the restart answered), lost again with no restart left.
    assert [e for e, _ in events].count("server_lost") == 4
    assert group.restarts == [1, 1]


def test_one_server_lost_for_good_leaves_training_to_the_other(tmp_path, monkeypatch):
    monkeypatch.setattr(server_group, "MAX_RESTARTS", 0)
    events = Events(tmp_path / "lost", on="server_lost")
    plans = (stand_in(die_after=0.5, marker="always"), stand_in())
    group = launch_servers(plans, tmp_path / "v.log", {}, events)
    try:
        watched = watch_training(trainer_until(events.flag, 0.3), (group,), None, poll=0.1)
    finally:
        group.stop()
    assert watched.code == 0 and watched.server_died is None
    assert [e for e, _ in events] == ["server_lost"]
    assert len(group.gone) == 1


def test_a_server_that_never_answers_at_start_fails_the_start_naming_its_log(tmp_path):
    port = free_port()
    silent = server_plan(["sleep", "605"], port, timeout=1.0)
    group = launch_servers((stand_in(), silent), tmp_path / "v.log", {})
    try:
        with pytest.raises(ServerError, match="v-server1.log"):
            deadline = time.monotonic() + 20
            while not group.check_started() and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        group.stop()


def test_a_server_that_stops_answering_is_stopped_and_restarted(tmp_path, monkeypatch):
    """What a killed vLLM API server behind srun looks like: the step lives on, unanswering."""
    monkeypatch.setattr(server_group, "HEALTH_EVERY_S", 0.1)
    monkeypatch.setattr(server_group, "SILENT_LOST_S", 0.5)
    monkeypatch.setattr(server_group, "HEALTH_PROBE_S", 0.2)
    events = Events(tmp_path / "back")
    plans = (stand_in(), stand_in(die_after=-0.2, marker=str(tmp_path / "silent-once")))
    group = launch_servers(plans, tmp_path / "v.log", {}, events)
    try:
        watched = watch_training(trainer_until(events.flag), (group,), None, poll=0.1)
    finally:
        group.stop()
    assert watched.code == 0 and watched.server_died is None
    assert [e for e, _ in events] == ["server_lost", "server_back"]
    assert "did not answer" in events[0][1]["reason"]


def test_a_slow_start_is_not_counted_as_silence(tmp_path, monkeypatch):
    """Start-up is bounded by vllm_server_timeout alone (a vLLM start takes minutes)."""
    monkeypatch.setattr(server_group, "HEALTH_EVERY_S", 0.1)
    monkeypatch.setattr(server_group, "SILENT_LOST_S", 0.3)
    events = Events()
    port = free_port()
    slow = f"import time, runpy, sys; time.sleep(1.0); sys.argv = ['-', '{port}', '0', 'never']; "
    slow += f"exec(compile({textwrap.dedent(SERVER)!r}, 'stand-in', 'exec'))"
    plans = (stand_in(), server_plan([PY, "-c", slow], port))
    group = launch_servers(plans, tmp_path / "v.log", {}, events)
    try:
        deadline = time.monotonic() + 20
        while not group.check_started() and time.monotonic() < deadline:
            assert group.died_message() is None  # what the launcher's loop asks each poll
            time.sleep(0.05)
    finally:
        group.stop()
    assert events == [] and group.healthy_after >= 1.0


def _second_server_dies_once_under_slurm(tmp_path):
    """Two stand-in servers under a Slurm job, the second dying once, while a trainer runs
    until 0.5 s after the loss: the run goes on with the first. Returns the stopped group and
    its events."""
    events = Events(tmp_path / "lost", on="server_lost")
    plans = (stand_in(), stand_in(die_after=0.3, marker=str(tmp_path / "died-once")))
    group = launch_servers(plans, tmp_path / "v.log", {"SLURM_JOB_ID": "7"}, events)
    try:
        watched = watch_training(trainer_until(events.flag, 0.5), (group,), None, poll=0.1)
    finally:
        group.stop()
    assert watched.code == 0 and watched.server_died is None
    return group, events


def test_a_server_on_a_node_slurm_has_down_is_not_restarted(tmp_path, monkeypatch):
    """A cut node: srun would wait for it. The run goes on with the other server."""
    asked = []
    monkeypatch.setattr(
        server_group, "node_down", lambda node, timeout: asked.append(node) or "DOWN*"
    )
    group, events = _second_server_dies_once_under_slurm(tmp_path)
    assert [e for e, _ in events] == ["server_lost"] and asked == ["127.0.0.1"]
    assert "Slurm has the node DOWN*: not restarted" in group.gone[1]
    assert not (tmp_path / "v-server1-restart1.log").exists() and group.restarts == [0, 0]


def test_a_restart_is_abandoned_when_its_node_goes_down_meanwhile(tmp_path, monkeypatch):
    """Slurm marks a silent node down some time after the loss (SlurmdTimeout)."""
    states = iter([None, "IDLE*"])
    monkeypatch.setattr(server_group, "node_down", lambda node, timeout: next(states, "IDLE*"))
    group, events = _second_server_dies_once_under_slurm(tmp_path)
    assert [e for e, _ in events] == ["server_lost"], events
    assert "restart abandoned; Slurm has the node IDLE*" in group.gone[1]
    assert group.restarts == [0, 1] and group.servers[1].poll() is not None  # stopped


def test_no_node_state_is_asked_outside_slurm(tmp_path, monkeypatch):
    monkeypatch.setattr(server_group, "node_down", lambda node, timeout: "DOWN")
    group = server_group.ServerGroup((stand_in(),), tmp_path / "v.log", {})
    assert group._node_down("node1") is None


@pytest.mark.parametrize(
    "state, down",
    [("IDLE*", True), ("DOWN+NOT_RESPONDING", True), ("MIXED+DRAIN", True), ("ALLOCATED", False)],
)
def test_node_down_reads_slurm_s_state_of_the_node(tmp_path, monkeypatch, state, down):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        f"#!/bin/sh\necho 'NodeName=$4 Arch=x86_64 CoresPerSocket=1 State={state} Weight=1'\n"
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert node_down("node1") == (state if down else None)


def test_node_down_is_bounded_and_unknown_when_slurm_does_not_answer(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nexec sleep 30\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    start = time.monotonic()
    assert node_down("node1", timeout=0.5) is None
    assert time.monotonic() - start < 5


def test_sbatch_asks_slurm_to_keep_a_job_with_several_servers_when_a_node_fails():
    def prepared(servers: int):
        return SimpleNamespace(plan=SimpleNamespace(servers=(object(),) * servers))

    assert node_loss_options(prepared(2)) == ["--no-kill"]
    assert node_loss_options(prepared(1)) == [] == node_loss_options(prepared(0))
    # a sweep's array: every point's plan, since the option holds for all its tasks
    assert node_loss_options(prepared(2), prepared(3)) == ["--no-kill"]
    assert node_loss_options(prepared(2), prepared(1)) == [] == node_loss_options()


# Serves, then exits after 0.3 s; every later start (the marker exists) exits at once, before
# it answers: what a restart's srun step does on a node it cannot reach.
ONCE_THEN_UNREACHABLE = """
    import os, sys, threading
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, marker = int(sys.argv[1]), sys.argv[2]
    if os.path.exists(marker):
        sys.exit(3)
    open(marker, "w").close()
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    threading.Timer(0.3, lambda: os._exit(7)).start()
    HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_restart_that_cannot_start_waits_for_slurms_verdict_on_its_node(tmp_path, monkeypatch):
    """The node is cut: Slurm says so only after SlurmdTimeout, and until then a restart's srun
    step exits at once. Restarts in a row would spend every restart before that; the group
    waits RETRY_AFTER_S between them, asks for the node's state, and gives the server up as on
    a down node (the 3-node test's 'not restarted')."""
    monkeypatch.setattr(server_group, "HEALTH_EVERY_S", 0.2)
    monkeypatch.setattr(server_group, "RETRY_AFTER_S", 5.0)
    # Slurm: the node up at the loss and for a while after (about 1 s of asks), then down.
    states = iter([None] * 6)
    monkeypatch.setattr(server_group, "node_down", lambda node, timeout: next(states, "DOWN*"))
    port = free_port()
    second = server_plan(
        [*python_command(ONCE_THEN_UNREACHABLE), str(port), str(tmp_path / "m")], port
    )
    group = launch_servers((stand_in(), second), tmp_path / "v.log", {"SLURM_JOB_ID": "7"})
    try:
        watched = watch_training(trainer(tmp_path, 4.0), (group,), None, poll=0.05)
    finally:
        group.stop()
    assert watched.code == 0 and watched.server_died is None
    assert "did not come back" in group.gone[1], group.gone
    assert "Slurm has the node DOWN*: not restarted" in group.gone[1], group.gone
    assert group.restarts == [0, 1], group.restarts
