"""The hang watchdog: no progress from a trainer, or no answer from the vLLM server, for
hang_timeout seconds is a hang.

Progress is a rank's heartbeat file changing (rundir/heartbeat.py); the silence is measured with
the launcher's own clock. Every server is asked GET /health (with a request timeout) every few
seconds while training runs; with several servers (vllm_nodes > 1) the silence is that of the
last one to answer: a lost server being restarted (launch/server_group.py) is no hang while
another answers, since the trainers send their requests to the others. Silence counts only
from the servers' first healthy answer: the trainers start beside the server and their first
generation waits for it (its start-up is bounded by vllm_server_timeout instead,
watch_training). The limit:

- `hang_timeout: S` in the recipe: S seconds once a rank has finished its first step;
  before that S + WARMUP_S, a warm-up allowance for what only the first step pays (imports,
  model loading, compilation, CUDA graphs, vLLM's first generation with a cold cache), which
  a limit sized for the steady state does not cover. The server's /health gets S from its
  first healthy answer (server_limit_for).
- unset (auto): AUTO_STARTUP_S while a rank has not finished a step or is saving (model load,
  first generation, NCCL set-up, a big checkpoint), else the larger of AUTO_FLOOR_S and
  AUTO_STEPS x the slowest step any rank reported. The floor covers a long generation phase
  on a GPU; five times the slowest step covers completions growing longer during training.

On a hang the launcher dumps every stack it can reach (dump_stacks), stops every process
and records the attempt as `hang` (launch/outcomes.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.rundir.heartbeat import DUMP_SIGNAL, read_exit_reports, stacks_path
from maxent_grpo.vllm_health import ServerError, ServerWaitCancelled, probe

AUTO_FLOOR_S = 600.0
AUTO_STARTUP_S = 1800.0
AUTO_STEPS = 5
WARMUP_S = 300.0
SERVER_PROBE_EVERY_S = 5.0
SERVER_PROBE_TIMEOUT_S = 5.0
# Longest wait for the dumps to be written (usually well under a second; a loaded machine may
# take seconds to schedule a process that was just continued).
DUMP_WAIT_S = 10.0
# Phases before the first step or around a save: the auto limit is AUTO_STARTUP_S there.
SLOW_PHASES = frozenset({None, "built", "train_begin", "save", "saved", "train_end"})


def limit_for(timeout: float | None, phase: str | None, slowest_step_s: float) -> float:
    """Seconds of silence allowed in `phase` (see the module docstring). `phase` None: no
    heartbeat yet; `slowest_step_s` 0: no step finished yet (each process reports its own)."""
    warming_up = phase is None or not slowest_step_s
    if timeout is not None:
        return timeout + WARMUP_S if warming_up else timeout
    if phase in SLOW_PHASES or warming_up:
        return AUTO_STARTUP_S
    return max(AUTO_FLOOR_S, AUTO_STEPS * slowest_step_s)


def server_limit_for(timeout: float | None, slowest_step_s: float) -> float:
    """Seconds without an answer from the vLLM server's /health. Its API process answers
    while the engine compiles (in CI it did through a cold first generation that outlasted
    hang_timeout 15), so an explicit limit gets no warm-up allowance here."""
    return timeout if timeout is not None else limit_for(None, "step_end", slowest_step_s)


@dataclass
class RankWatch:
    rank: int
    changed: float  # launcher clock at the last change (or at the start)
    beat: dict | None = None


@dataclass(frozen=True)
class Hang:
    reason: str  # one line, for the outcome event
    details: list[str] = field(default_factory=list)  # one line per rank (and the server)
    beats: dict[int, dict] = field(default_factory=dict)  # the ranks' last heartbeats
    server: bool = False  # the server stopped answering


def process_state(pid: int) -> str | None:
    """The state letter of a local process (R, S, D, T for stopped, Z), None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()[0]


class Watchdog:
    """Reads the heartbeat directory and probes the server; `poll()` returns a Hang or None."""

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

    @property
    def server_ok(self) -> float:
        """The latest answer of any server, on the launcher's clock."""
        return max(self.answered.values(), default=self.clock())

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

    def slowest_step_s(self) -> float:
        beats = [w.beat or {} for w in self.ranks.values()]
        return max((b.get("slowest_step_s") or 0.0 for b in beats), default=0.0)

    def limit(self, watch: RankWatch) -> float:
        return limit_for(self.timeout, (watch.beat or {}).get("phase"), self.slowest_step_s())

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

    def poll(self) -> Hang | None:
        self._read()
        self._probe_server()
        now = self.clock()
        silent = now - self.server_ok
        server_limit = server_limit_for(self.timeout, self.slowest_step_s())
        if self.health_urls and silent > server_limit:
            if len(self.health_urls) == 1:
                which = f"the vLLM server did not answer {self.health_urls[0]}"
            else:
                which = f"no vLLM server answered ({', '.join(self.health_urls)})"
            reason = f"{which} for {silent:.0f}s ({self._limit_text(server_limit)})"
            return self._hang(reason, server=True)
        stale = [w for w in self.ranks.values() if now - w.changed > self.limit(w)]
        if not stale:
            return None
        # The rank to name: a local process that is stopped, stuck in the kernel or gone, else
        # the one silent longest (the others usually wait for it in a collective).
        first = min(stale, key=lambda w: (self._state_note(w) == "", w.changed))
        reason = (
            f"no progress from rank {first.rank} for {now - first.changed:.0f}s "
            f"({self._limit_text(self.limit(first))}); {self.describe(first)}"
        )
        return self._hang(reason)

    def _limit_text(self, limit: float) -> str:
        kind = "hang_timeout" if self.timeout is not None else "automatic hang_timeout"
        return f"{kind} {limit:g}s"

    def describe(self, watch: RankWatch) -> str:
        beat = watch.beat
        if beat is None:
            return "no heartbeat yet (still starting?)"
        where = f"pid {beat.get('pid')} on {beat.get('host')}{self._state_note(watch)}"
        return f"last: {beat.get('phase')} at step {beat.get('step')} ({where})"

    def _state_note(self, watch: RankWatch) -> str:
        """What /proc says about a local rank's process when that explains a silence."""
        beat = watch.beat
        if beat is None or beat.get("host") != os.uname().nodename:
            return ""
        state = process_state(int(beat.get("pid") or 0))
        notes = {
            None: ", process gone",
            "Z": ", process gone",
            "T": ", process stopped (SIGSTOP?)",
            "t": ", process stopped (debugger?)",
            "D": ", process in uninterruptible sleep (I/O, driver)",
        }
        return notes.get(state, "")

    def _hang(self, reason: str, server: bool = False) -> Hang:
        now = self.clock()
        details = [
            f"rank {w.rank}: silent {now - w.changed:.0f}s; {self.describe(w)}"
            for w in self.ranks.values()
        ]
        for url, answered in self.answered.items():
            details.append(f"vLLM server {url}: last answered {now - answered:.0f}s ago")
        beats = {w.rank: w.beat for w in self.ranks.values() if w.beat is not None}
        return Hang(reason, details, beats, server)


def _py_spy(pid: int) -> str | None:
    """`py-spy dump` of a process (None without py-spy): works on any Python process."""
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    try:
        result = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"py-spy dump --pid {pid} failed: {exc}"
    return result.stdout + result.stderr


def dump_rank_stacks(beats: dict[int, dict], directory: Path, note: Callable[[str], None]) -> None:
    """Every local rank's Python stacks into the train log: py-spy when installed, else
    DUMP_SIGNAL (faulthandler, registered by train/heartbeat.py, writes rank-<R>.stacks; the
    files are copied into the log one rank after the other). A stopped rank (SIGSTOP) is
    continued so that it can write."""
    here = os.uname().nodename
    pending = {}
    for rank, beat in sorted(beats.items()):
        pid = int(beat.get("pid") or 0)
        if beat.get("host") != here:
            note(f"rank {rank} runs on {beat.get('host')}: its stacks cannot be dumped from here")
            continue
        state = process_state(pid)
        if state is None or state == "Z":
            note(f"rank {rank} (pid {pid}) is gone: no stacks")
            continue
        spied = _py_spy(pid)
        if spied is not None:
            note(f"stacks of rank {rank} (pid {pid}, py-spy):\n{spied}")
            continue
        path = stacks_path(directory.parent, rank)
        pending[rank] = (pid, path, path.stat().st_size if path.is_file() else 0)
        os.kill(pid, DUMP_SIGNAL)
        if state == "T":
            os.kill(pid, signal.SIGCONT)
    _wait_for_growth([(path, size) for _pid, path, size in pending.values()])
    for rank, (pid, path, size) in sorted(pending.items()):
        text = _read_from(path, size)
        note(f"stacks of rank {rank} (pid {pid}, faulthandler):\n{text or '(none written)'}")


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _wait_for_growth(
    files: list[tuple[Path, int]], timeout: float = DUMP_WAIT_S, quiet: float = 1.0
) -> None:
    """Until every file grew past its size, ends a line and has not grown for `quiet` s, at
    most timeout. faulthandler writes a dump in many small writes: on a busy machine a rank
    just continued from SIGSTOP paused mid-line for longer than 0.2 s, and its dump was cut."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        sizes = [path.stat().st_size if path.is_file() else 0 for path, _ in files]
        if sizes != last:
            last, since = sizes, time.monotonic()
        grown = all(now > before for now, (_, before) in zip(sizes, files))
        if grown and time.monotonic() - since >= quiet and all(map(_ends_a_line, files)):
            return
        time.sleep(0.1)


def _ends_a_line(file: tuple[Path, int]) -> bool:
    try:
        with open(file[0], "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
    except OSError:
        return False


def dump_server_stacks(pids: list[int], log: Path, note: Callable[[str], None]) -> None:
    """The vLLM server's stacks: py-spy when installed, else SIGABRT, which Python's
    faulthandler (PYTHONFAULTHANDLER=1 in the server's environment) turns into a dump of
    every thread on the server's stderr; no core file (RLIMIT_CORE 0 first). Then the new end
    of the server log is copied into the train log."""
    size = log.stat().st_size if log.is_file() else 0
    for pid in pids:
        spied = _py_spy(pid)
        if spied is not None:
            note(f"stacks of vLLM server process {pid} (py-spy):\n{spied}")
            continue
        try:
            import resource  # Unix only: ImportError elsewhere

            resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
        except (OSError, ValueError, ImportError):
            pass
        for signum in (signal.SIGABRT, signal.SIGCONT):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                break
    if shutil.which("py-spy") is None and pids:
        _wait_for_growth([(log, size)])
        text = _read_from(log, size)
        note(f"stacks of the vLLM server (from {log}):\n{text or '(none written)'}")


# The trainers' grace after SIGTERM when the server's start-up failed or was cancelled.
STARTUP_STOP_GRACE_S = 3.0
# After a trainer reported its exception, the others get this long to exit by themselves
# (torchrun's agent stops them) before the launcher stops them; the environment may change it.
CRASH_GRACE_S = 30.0
CRASH_GRACE_ENV = "MAXENT_GRPO_CRASH_GRACE_S"


def crash_grace_s(environ) -> float:
    """CRASH_GRACE_S, or MAXENT_GRPO_CRASH_GRACE_S when set (seconds > 0)."""
    value = environ.get(CRASH_GRACE_ENV)
    if value is None:
        return CRASH_GRACE_S
    try:
        grace = float(value)
    except ValueError:
        grace = 0.0
    if not 0 < grace < float("inf"):
        raise UserError(
            f"environment: {CRASH_GRACE_ENV}={value!r} is not a number of seconds > 0; "
            f"set e.g. {CRASH_GRACE_ENV}=60, or unset it for {CRASH_GRACE_S:g}"
        )
    return grace


@dataclass(frozen=True)
class Watched:
    """How the wait for training ended."""

    code: int | None  # the training command's exit code (None: stopped for a hang)
    hang: Hang | None = None
    server_died: str | None = None  # why the server is gone (with its log tail)
    reward_server_died: str | None = None  # why the reward-model server is gone (same)


def watch_training(
    trainer,
    server,
    watchdog: Watchdog | None,
    poll: float = 1.0,
    cancelled: Callable[[], int | None] = lambda: None,
    crash_grace: float = CRASH_GRACE_S,
    reward_server=None,
) -> Watched:
    """Wait for training to exit, watching the server's start-up, hangs, a dead server and
    crashed ranks.

    trainer: a processes.Child; server: a server.VLLMServer or None, started with the
    trainers. Until the server is healthy, its start-up is checked each poll (no hang is
    called: the trainers may be waiting for it); a server that exits first or is not healthy
    within vllm_server_timeout stops training and raises ServerError, a stop signal
    (`cancelled()`) stops training and raises ServerWaitCancelled. After that, a dead server
    stops training at once (it cannot generate without it); a hang returns at once (the caller
    dumps stacks and stops everything); ranks that outlive a crashed one `crash_grace` s are
    stopped. reward_server: a reward_server.RewardModelServer (healthy before the trainers
    started) or None; once it exits, training stops at once too (it cannot score without it),
    and it is named as the cause also when the trainers failed on it before a poll saw it go.
    """
    crashed_at = None
    while trainer.poll() is None:
        # Look at the process trees each time: a child remembers every process it saw, so
        # that stopping it reaches workers that left its process group (processes.py).
        for child in (trainer, server.child if server is not None else None):
            if child is not None:
                child.members()
        started = _server_started(trainer, server, watchdog, cancelled)
        message = server.died_message() if server is not None else None
        if message is not None:
            print(f"error: {message}", flush=True)
            print("stopping training: it cannot generate without the server", flush=True)
            trainer.stop()
            return Watched(trainer.wait(), server_died=message)
        lost = _reward_server_lost(reward_server, cancelled)
        if lost is not None:
            print(f"error: {lost}", flush=True)
            print("stopping training: it cannot score without the reward model server", flush=True)
            trainer.stop()
            return Watched(trainer.wait(), reward_server_died=lost)
        if watchdog is not None:
            hang = watchdog.poll() if started else None
            if hang is not None:
                return Watched(None, hang=hang)
            if crashed_at is None and watchdog.exit_reports():
                crashed_at = time.monotonic()
            if crashed_at is not None and time.monotonic() - crashed_at > crash_grace:
                print("a training process failed and the others did not exit: stopping them")
                trainer.stop(grace=5)
        trainer.wait_up_to(poll)
    code = trainer.wait()
    # Their next scoring fails within seconds of the loss (RewardServerDown), often before a
    # poll here saw the server go: it is still the cause.
    return Watched(code, reward_server_died=_reward_server_lost(reward_server, cancelled))


def _reward_server_lost(reward_server, cancelled) -> str | None:
    """Why the reward-model server is gone, or None: none, running, or a stop signal came (a
    preemption's SIGTERM reaches every process of the job: the trainers are saving)."""
    if reward_server is None or cancelled() is not None:
        return None
    return reward_server.died_message()


def _server_started(trainer, server, watchdog: Watchdog | None, cancelled) -> bool:
    """Whether the server (if any) is healthy; stops training when its start-up failed."""
    if server is None or server.healthy_after is not None:
        return True
    try:
        if not server.check_started(cancelled):
            return False
    except (ServerError, ServerWaitCancelled) as exc:
        if isinstance(exc, ServerError):
            print("stopping training: the vLLM server did not start", flush=True)
        # No step can run before the server answers: nothing to save, a short grace will do.
        trainer.stop(grace=STARTUP_STOP_GRACE_S)
        raise
    if watchdog is not None:
        watchdog.restart_clocks()
    return True


class LogNote:
    """Append a line to the train log, the run's log (the trainer's Child echoes that log on
    the launcher's output)."""

    def __init__(self, log: Path):
        self.log = Path(log)

    def __call__(self, text: str) -> None:
        try:
            with open(self.log, "a") as handle:
                handle.write(text.rstrip("\n") + "\n")
        except OSError:
            print(text, flush=True)


def stop_hung(hang: Hang, trainer, server, log: Path, directory: Path) -> None:
    """Say what hangs, dump every reachable stack into the train log, kill every process.

    trainer: a processes.Child (or None); server: a server.VLLMServer (or None); directory:
    the heartbeat directory.
    """
    note = LogNote(log)
    note(f"hang: {hang.reason}")
    for line in hang.details:
        note(f"  {line}")
    dump_rank_stacks(hang.beats, directory, note)
    group = server.child if server is not None else None
    if group is not None and group.members():
        dump_server_stacks(group.members(), server.log_path, note)
    note("stopping every process of the run; the last complete checkpoint stays")
    for child in (trainer, group):
        if child is not None:
            child.signal(signal.SIGKILL)
