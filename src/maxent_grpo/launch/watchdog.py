"""The hang watchdog's probing: what the ranks and the servers did, read at each poll.

Progress is a rank's heartbeat file changing (rundir/heartbeat.py); the silence is measured with
the launcher's own clock. Every server is asked GET /health (with a request timeout) every few
seconds while training runs. Silence counts only from the servers' first healthy answer: the
trainers start beside the server and their first generation waits for it (its start-up is
bounded by vllm_server_timeout instead, launch/watch.py). Whether what was seen is a hang is
launch/hang.py's pure policy; on a hang the launcher dumps every stack it can reach
(launch/stacks.py), stops every process and records the attempt as `hang`
(launch/outcomes.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.launch.hang import Hang, RankSeen, Seen, find_hang
from maxent_grpo.launch.processes import process_state
from maxent_grpo.rundir.heartbeat import read_exit_reports
from maxent_grpo.vllm_health import probe

SERVER_PROBE_EVERY_S = 5.0
SERVER_PROBE_TIMEOUT_S = 5.0
# What /proc says about a local rank's process when that explains a silence.
STATE_NOTES = {
    None: ", process gone",
    "Z": ", process gone",
    "T": ", process stopped (SIGSTOP?)",
    "t": ", process stopped (debugger?)",
    "D": ", process in uninterruptible sleep (I/O, driver)",
}


@dataclass
class RankWatch:
    rank: int
    changed: float  # launcher clock at the last change (or at the start)
    beat: dict | None = None


class Watchdog:
    """Reads the heartbeat directory and probes the servers; `poll()` returns a Hang or None."""

    def __init__(
        self,
        directory: Path,
        ranks: int,
        timeout: float | None,
        health_url: str | Sequence[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.directory = Path(directory)
        self.timeout = timeout
        # Every server's /health (one URL, or one per server): the run can generate while any
        # answers.
        urls = (health_url,) if isinstance(health_url, str) else tuple(health_url or ())
        self.health_urls = urls
        self.clock = clock
        now = clock()
        self.ranks = {r: RankWatch(r, now) for r in range(ranks)}
        self.answered = dict.fromkeys(urls, now)  # url -> last 200 (launcher clock)
        self.next_probe = now

    def restart_clocks(self) -> None:
        """Count silence from now: called when the server becomes healthy, since the trainers
        may wait for it at start (their first generation) for up to vllm_server_timeout."""
        now = self.clock()
        for watch in self.ranks.values():
            watch.changed = now
        self.answered = dict.fromkeys(self.health_urls, now)
        self.next_probe = now

    def _read(self) -> None:
        now = self.clock()
        for watch in self.ranks.values():
            try:
                beat = json.loads((self.directory / f"rank-{watch.rank}.json").read_text())
            except (OSError, ValueError):
                continue
            if watch.beat is None or beat.get("count") != watch.beat.get("count"):
                watch.beat, watch.changed = beat, now

    def _probe_server(self) -> None:
        now = self.clock()
        if not self.health_urls or now < self.next_probe:
            return
        for url in self.health_urls:
            if probe(url, timeout=SERVER_PROBE_TIMEOUT_S) == 200:
                self.answered[url] = self.clock()
        self.next_probe = self.clock() + SERVER_PROBE_EVERY_S

    def exit_reports(self) -> list[dict]:
        return read_exit_reports(self.directory.parent)

    def seen(self) -> Seen:
        """What the last reads and probes saw, on the launcher's clock now."""
        now = self.clock()
        ranks = tuple(
            RankSeen(w.rank, now - w.changed, w.beat, state_note(w.beat))
            for w in self.ranks.values()
        )
        servers = tuple((url, now - answered) for url, answered in self.answered.items())
        return Seen(ranks, servers)

    def poll(self) -> Hang | None:
        self._read()
        self._probe_server()
        return find_hang(self.timeout, self.seen())


def state_note(beat: dict | None) -> str:
    """What /proc says about a local rank's process when that explains a silence."""
    if beat is None or beat.get("host") != os.uname().nodename:
        return ""
    return STATE_NOTES.get(process_state(int(beat.get("pid") or 0)), "")
