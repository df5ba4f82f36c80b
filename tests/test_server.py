"""The vLLM server's lifecycle with stand-in processes (fast; real vLLM is in tests/vllm_server/).

Real processes and real HTTP: a process that dies at start, one that answers 503 forever,
one that accepts connections but never answers, one that sleeps; /health and /health/.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers.procs import LOADED_MARGIN, live_processes, wait_until_gone
from maxent_grpo.launch import hang as hang_module
from maxent_grpo.launch import watchdog as watchdog_module
from maxent_grpo.launch.plan import ServerPlan
from maxent_grpo.launch.processes import Child, free_port
from maxent_grpo.launch.server import VLLMServer, launch_server
from maxent_grpo.launch.watch import watch_training
from maxent_grpo.launch.watchdog import Watchdog
from maxent_grpo.rundir.heartbeat import Heartbeat
from maxent_grpo.vllm_health import ServerError, ServerWaitCancelled, probe

PY = sys.executable
# Child.stop SIGKILLs what a SIGTERM did not end after this many seconds.
STOP_GRACE = inspect.signature(Child.stop).parameters["grace"].default


def start_server(plan, log_path, cancelled=lambda: None) -> VLLMServer:
    """Start a server and wait until it is healthy (stopped again when it never gets there)."""
    server = launch_server(plan, log_path)
    try:
        server.wait_until_healthy(cancelled=cancelled)
    except BaseException:
        server.stop()
        raise
    return server


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path == "/health":
            self.send_response(200)
            self.end_headers()
        elif self.path == "/health/":
            # What vLLM (FastAPI) answers for the trailing slash.
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/health")
            self.end_headers()
        else:
            self.send_response(503)
            self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_probe_accepts_health_and_follows_the_slash_redirect(http_server):
    assert probe(f"{http_server}/health") == 200
    assert probe(f"{http_server}/health/") == 200
    assert probe(f"{http_server}/other") == 503
    assert probe(f"http://127.0.0.1:{free_port()}/health", timeout=1) is None


def server_plan(command: list[str], port: int, timeout: float = 30.0) -> ServerPlan:
    return ServerPlan(
        node="127.0.0.1",
        gpus=(),
        port=port,
        group_port=0,
        command=tuple(command),
        env={},
        device="cpu",
        weight_sync="disk",
        timeout=timeout,
    )


def python_command(source: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(source)]


SERVE_503 = """
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503); self.end_headers()
        def log_message(self, *a):
            pass
    print("listening, never healthy", flush=True)
    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

SILENT_LISTENER = """
    import socket, sys, time
    s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
    print("accepting, never answering", flush=True)
    conns = []
    while True:
        c, _ = s.accept(); conns.append(c)
"""


def test_server_that_dies_at_start_fails_at_once_with_its_log_tail(tmp_path):
    port = free_port()
    plan = server_plan(
        python_command(
            """
            import sys
            print("INFO loading model /no/such/model", flush=True)
            print("OSError: /no/such/model does not appear to have a config.json", flush=True)
            sys.exit(3)
            """
        ),
        port,
        timeout=600,
    )
    start = time.monotonic()
    with pytest.raises(ServerError) as info:
        start_server(plan, tmp_path / "run_vllm.log")
    took = time.monotonic() - start
    assert took < 60, took  # at once, not after vllm_server_timeout (600 s); idle: ~0.1 s
    message = str(info.value)
    first, *tail = message.splitlines()
    assert first.startswith("vLLM server exited with code 3 ")
    assert "before it answered" in first and str(tmp_path / "run_vllm.log") in first
    assert tail[-1].strip() == "OSError: /no/such/model does not appear to have a config.json"


def test_server_killed_by_a_signal_is_named(tmp_path):
    plan = server_plan(
        python_command("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), free_port()
    )
    with pytest.raises(ServerError, match="killed by signal 9"):
        start_server(plan, tmp_path / "vllm.log")


@pytest.mark.parametrize(
    "source, answer",
    [(SERVE_503, "last answer HTTP 503"), (SILENT_LISTENER, "no answer")],
    ids=["answers-503", "never-answers"],
)
def test_server_never_healthy_times_out_and_is_stopped(tmp_path, source, answer):
    port = free_port()
    plan = server_plan([*python_command(source), str(port)], port, timeout=3)
    start = time.monotonic()
    with pytest.raises(ServerError) as info:
        start_server(plan, tmp_path / "vllm.log")
    took = time.monotonic() - start
    # The timeout, then the stop (SIGTERM answered at once); margin for a loaded machine.
    assert 3 <= took < 3 + LOADED_MARGIN, took
    first = str(info.value).splitlines()[0]
    assert f"not healthy after 3s (vllm_server_timeout) at {plan.health_url} ({answer})" in first
    assert "never" in str(info.value)  # the log tail: what the process printed
    marker = f"{textwrap.dedent(source)} {port}"  # the stand-in's command line
    assert not wait_until_gone(marker=marker, timeout=5)[0]


def test_sleeping_server_times_out(tmp_path):
    plan = server_plan(["sleep", "600"], free_port(), timeout=2)
    with pytest.raises(ServerError, match=r"not healthy after 2s .*\(no answer\)"):
        start_server(plan, tmp_path / "vllm.log")
    assert not live_processes(marker="sleep 600")


def test_healthy_server_then_stop_kills_the_whole_group(tmp_path):
    port = free_port()
    source = """
        import subprocess, sys
        from http.server import BaseHTTPRequestHandler, HTTPServer
        # A grandchild, like vLLM's engine process, in the same process group.
        subprocess.Popen(["sleep", "601"])
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
            def log_message(self, *a):
                pass
        HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
    server = start_server(server_plan([*python_command(source), str(port)], port), tmp_path / "v")
    pgid = server.pid
    assert server.poll() is None
    # The server, the resource tracker its shelter started (launch/shelter.py), the grandchild.
    assert len(live_processes({pgid})) == 3
    # Ended by the SIGINT (launch/processes.py SERVER_STOP: Python's KeyboardInterrupt ends
    # the interpreter with SIGINT), not by the SIGKILL after the grace; a grace far past what a
    # loaded machine needs (idle: ~0.1 s; CI once took 10 s), so no timing decides it.
    code = server.stop(grace=60)
    left, _ = wait_until_gone({pgid}, timeout=5)
    assert not left and code == -signal.SIGINT, (code, server.child.log_tail())


def test_signal_while_waiting_cancels_and_stops_the_server(tmp_path):
    plan = server_plan(["sleep", "602"], free_port(), timeout=600)
    calls = iter([None, None, 15])
    with pytest.raises(ServerWaitCancelled) as info:
        start_server(plan, tmp_path / "vllm.log", cancelled=lambda: next(calls, 15))
    assert info.value.signum == 15
    assert not wait_until_gone(marker="sleep 602", timeout=5)[0]


def test_server_death_during_training_stops_training(tmp_path, capsys):
    port = free_port()
    source = """
        import sys, threading, os
        from http.server import BaseHTTPRequestHandler, HTTPServer
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
            def log_message(self, *a):
                pass
        threading.Timer(1.5, lambda: (print("engine core died", flush=True), os._exit(7))).start()
        HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
    server = VLLMServer(server_plan([*python_command(source), str(port)], port), tmp_path / "v")
    server.start()
    server.wait_until_healthy(poll=0.1)
    trainer = Child("train", ["sleep", "603"], Path(tmp_path / "train.log"))
    start = time.monotonic()
    code = watch_training(trainer, (server,), None, poll=0.1).code
    took = time.monotonic() - start
    out = capsys.readouterr().out
    # The server dies 1.5 s after it started; the trainers are stopped within a poll or two.
    assert code == -15 and took < 1.5 + LOADED_MARGIN
    assert "vLLM server exited with code 7 while training ran" in out
    assert "engine core died" in out
    server.stop()


def test_child_stop_returns_quickly_for_a_live_group(tmp_path):
    child = Child("x", ["sleep", "604"], tmp_path / "x.log")
    start = time.monotonic()
    child.stop()
    # By the SIGTERM, before stop's 10 s grace would have ended in SIGKILL (idle: ~0.05 s).
    assert time.monotonic() - start < STOP_GRACE - 1
    assert not live_processes(marker="sleep 604")


# The launcher starts the server and the trainers together: watch_training watches the start-up.

SERVE_200_AFTER = """
    import sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    print("booting", flush=True)
    time.sleep(float(sys.argv[2]))
    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def starting_server(tmp_path, command: list[str], port: int, timeout: float = 30) -> VLLMServer:
    return launch_server(server_plan(command, port, timeout), tmp_path / "vllm.log")


def test_server_dying_during_start_up_stops_the_trainers_with_its_log(tmp_path, capsys):
    source = """
        import sys, time
        time.sleep(1)
        print("ValueError: max_model_len 4096 is larger than the model's 1024", flush=True)
        sys.exit(1)
    """
    server = starting_server(tmp_path, python_command(source), free_port(), timeout=600)
    trainer = Child("train", ["sleep", "605"], tmp_path / "train.log")
    start = time.monotonic()
    with pytest.raises(ServerError) as info:
        watch_training(trainer, (server,), None, poll=0.1)
    took = time.monotonic() - start
    assert took < 1 + LOADED_MARGIN, took  # the stand-in exits after 1 s
    first, *tail = str(info.value).splitlines()
    assert first.startswith("vLLM server exited with code 1 ") and "before it answered" in first
    assert "max_model_len 4096" in tail[-1]
    assert info.value.outcome == "user_error"  # its own error: its log says what to fix
    assert "stopping training: the vLLM server did not start" in capsys.readouterr().out
    assert trainer.poll() is not None and not live_processes(marker="sleep 605")
    server.stop()


def test_a_server_killed_during_start_up_is_a_crash_not_a_user_error(tmp_path):
    """A signal (the OOM killer, an operator, a node's end) is not the recipe's fault: the
    attempt retries it as a crash (found by bench/chaos.py: it was a permanent user_error)."""
    source = "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)"
    server = starting_server(tmp_path, python_command(source), free_port(), timeout=600)
    trainer = Child("train", ["sleep", "607"], tmp_path / "train.log")
    with pytest.raises(ServerError) as info:
        watch_training(trainer, (server,), None, poll=0.1)
    assert str(info.value).startswith("vLLM server was killed by signal 9 ")
    assert info.value.outcome == "crash"
    assert trainer.poll() is not None
    server.stop()


def test_a_server_stopped_while_it_starts_is_a_hang_not_a_user_error(tmp_path):
    """A SIGSTOPped server never answers: not a slow start the recipe must fix but a hang,
    retried (found by bench/chaos.py, seed 1183364968: it was a permanent user_error). A
    server that merely does not answer in time stays a user error (the timeout's hint)."""
    for stop, outcome in ((True, "hang"), (False, "user_error")):
        server = starting_server(tmp_path, ["sleep", "609"], free_port(), timeout=2)
        if stop:
            os.kill(server.pid, signal.SIGSTOP)
        trainer = Child("train", ["sleep", "610"], tmp_path / "train.log")
        try:
            with pytest.raises(ServerError) as info:
                watch_training(trainer, (server,), None, poll=0.1)
        finally:  # a failed check leaves no stopped process behind
            server.stop(grace=1)
        assert info.value.outcome == outcome, str(info.value)
        stopped = f"its process (pid {server.pid}) is stopped (SIGSTOP?), a hang: see" in str(
            info.value
        )
        assert stopped == stop and ("a big model may need" in str(info.value)) != stop
        assert not live_processes(marker="sleep 609") and not live_processes(marker="sleep 610")


def test_server_not_healthy_in_time_stops_the_trainers(tmp_path):
    port = free_port()
    start = time.monotonic()  # before the launch: the server's 5 s count from it
    # 5 s: time for the stand-in to answer 503 first, even on a loaded machine.
    server = starting_server(tmp_path, [*python_command(SERVE_503), str(port)], port, timeout=5)
    trainer = Child("train", ["sleep", "606"], tmp_path / "train.log")
    with pytest.raises(ServerError, match=r"not healthy after 5s .*\(last answer HTTP 503\)"):
        watch_training(trainer, (server,), None, poll=0.1)
    assert 5 <= time.monotonic() - start < 5 + LOADED_MARGIN
    assert not live_processes(marker="sleep 606")
    server.stop()


def test_stop_signal_during_start_up_stops_the_trainers(tmp_path):
    server = starting_server(tmp_path, ["sleep", "607"], free_port())
    trainer = Child("train", ["sleep", "608"], tmp_path / "train.log")
    calls = iter([None, None, 15])
    with pytest.raises(ServerWaitCancelled):
        watch_training(trainer, (server,), None, poll=0.1, cancelled=lambda: next(calls, 15))
    assert not live_processes(marker="sleep 608")
    server.stop()
    assert not live_processes(marker="sleep 607")


def test_no_hang_is_called_while_the_server_starts(tmp_path, monkeypatch):
    """A rank silent while the server boots is waiting for it; silence counts from healthy."""
    monkeypatch.setattr(watchdog_module, "SERVER_PROBE_EVERY_S", 0.1)  # for hang_timeout 0.5
    monkeypatch.setattr(hang_module, "WARMUP_S", 0.5)  # the first step's allowance: 300 s
    Heartbeat(tmp_path, 0).beat("generate", 0)  # then silent: waits for the server
    port = free_port()
    start = time.monotonic()  # before the launch: healthy_after counts from it
    server = starting_server(tmp_path, [*python_command(SERVE_200_AFTER), str(port), "2"], port)
    watchdog = Watchdog(tmp_path / ".heartbeat", 1, timeout=0.5, health_url=server.plan.health_url)
    trainer = Child("train", ["sleep", "609"], tmp_path / "train.log")
    try:
        watched = watch_training(trainer, (server,), watchdog, poll=0.1)
    finally:
        trainer.stop()
        server.stop()
    assert server.healthy_after is not None and server.healthy_after >= 2
    assert watched.hang is not None and watched.hang.reason.startswith("no progress from rank 0")
    assert time.monotonic() - start >= server.healthy_after + 0.5


# A vLLM 0.31 server signalled mid-run may wedge (SIGTERM, before the launcher kept it
# blocked in servers; SIGINT still): it logs its own shutdown, its engine stops,
# then uvicorn waits without a bound for the trainers' open request (bench/chaos.py, seed
# 1837981534: alive, /health unanswered, no step till the hang watchdog, 600 s later).
WEDGING_SERVER = """
    import signal, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    def shutdown(*_):
        print("(APIServer pid=1) INFO [shutdown] API server: shutdown triggered", flush=True)
        if sys.argv[2] == "exits":
            sys.exit(0)
        while True:  # uvicorn's "Waiting for connections to close": deaf, alive
            time.sleep(1)
    signal.signal(signal.SIGINT, shutdown)
    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.parametrize("after", ["wedges", "exits"])
def test_a_server_that_logged_its_own_shutdown_and_lives_on_is_killed_and_lost(
    tmp_path, monkeypatch, after
):
    """Killed SHUTDOWN_BOUND_S after its own shutdown line, its loss stopping training then
    (a crash, retried), not at the hang watchdog's hang_timeout; one that exits is lost as it
    exits; a line an earlier attempt's server left in the appended log is not this one's."""
    from maxent_grpo.launch import server as server_module

    monkeypatch.setattr(server_module, "SHUTDOWN_BOUND_S", 1.0, raising=False)
    port = free_port()
    log = tmp_path / "vllm.log"
    log.write_text("INFO [shutdown] API server: shutdown triggered\n")  # an earlier attempt's
    plan = server_plan([*python_command(WEDGING_SERVER), str(port), after], port)
    server = VLLMServer(plan, log).start()
    # 20 s: a wedged server that nothing kills leaves watch_training to the trainer's end.
    trainer = Child("train", ["sleep", "20.611"], tmp_path / "train.log")
    try:
        server.wait_until_healthy(poll=0.1)
        for _ in range(15):  # 1.5 s, past the bound: the old line does not count
            assert server.lost(stopping=False, exited=False) is None
            time.sleep(0.1)
        assert server.poll() is None
        os.kill(server.pid, signal.SIGINT)
        start = time.monotonic()
        watched = watch_training(trainer, (server,), None, poll=0.1)
        took = time.monotonic() - start
    finally:
        server.stop(grace=1)
        trainer.stop(grace=1)
    message = watched.server_died or ""
    assert watched.code is not None and watched.hang is None, watched
    if after == "wedges":
        assert "(killed: it logged its own shutdown, '[shutdown] API server: shutdown " in message
        assert server.poll() == -signal.SIGKILL
        assert 1.0 <= took < 1.0 + LOADED_MARGIN, took
    else:
        assert "killed" not in message and "vLLM server exited with code 0" in message, message
        assert took < LOADED_MARGIN, took
    assert not live_processes(marker="sleep 20.611")
