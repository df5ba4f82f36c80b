"""The hang watchdog with several vLLM servers (launch/watchdog.py): it probes every server's
/health, and a lost server (being restarted by launch/server_group.py) is no hang while
another answers; only when no server answers for the limit is it one. Real HTTP on
localhost (a server in a thread, a port nothing listens on), a stepped clock."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from maxent_grpo.launch.processes import free_port
from maxent_grpo.launch.watchdog import SERVER_PROBE_EVERY_S, Watchdog


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def answering():
    """The /health URL of a server that answers 200."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/health"
    httpd.shutdown()
    httpd.server_close()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _poll_for(watchdog: Watchdog, clock: Clock, seconds: float):
    """Polls as the launcher's loop does (each probe round) for `seconds`; the first Hang."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now += SERVER_PROBE_EVERY_S
        hang = watchdog.poll()
        if hang is not None:
            return hang
    return None


def test_one_server_lost_is_no_hang_while_another_answers(tmp_path, answering):
    lost = f"http://127.0.0.1:{free_port()}/health"  # nothing listens: refused at once
    clock = Clock()
    # The lost server first: a watchdog that probed only the first server called this a hang.
    watchdog = Watchdog(tmp_path, 0, timeout=12, health_url=(lost, answering), clock=clock)
    assert _poll_for(watchdog, clock, 60) is None
    assert watchdog.answered[answering] == clock.now
    assert clock.now - watchdog.answered[lost] >= 60


def test_no_server_answering_is_a_hang_naming_each(tmp_path):
    urls = tuple(f"http://127.0.0.1:{free_port()}/health" for _ in range(2))
    clock = Clock()
    watchdog = Watchdog(tmp_path, 0, timeout=12, health_url=urls, clock=clock)
    hang = _poll_for(watchdog, clock, 60)
    assert hang is not None and hang.server
    assert hang.reason.startswith(f"no vLLM server answered ({urls[0]}, {urls[1]}) for 15s")
    assert [d for d in hang.details if d.startswith("vLLM server")] == [
        f"vLLM server {urls[0]}: last answered 15s ago",
        f"vLLM server {urls[1]}: last answered 15s ago",
    ]
